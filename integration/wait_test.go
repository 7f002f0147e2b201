package integration

import (
	"testing"
	"time"

	"github.com/hoardfs/hoard/chunkindex"
)

// eventually reports whether cond holds within timeout. It looks again
// and again, less and less often (from 1 ms up to 50 ms): a cheap
// condition is seen soon, and a costly one (a write to a server coming
// back) is not hammered.
func eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for tick := time.Millisecond; !cond(); tick = min(2*tick, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(tick)
	}
	return true
}

// waitFor fails the test unless cond holds within timeout; what says
// what was waited for.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !eventually(timeout, cond) {
		t.Fatalf("%s: not within %v", what, timeout)
	}
}

// holds fails the test if cond stops holding within d: for what must not
// happen where nothing observable marks the moment it would have (each
// use says why), so that only a bounded wait can tell.
func holds(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if eventually(d, func() bool { return !cond() }) {
		t.Fatalf("%s: not so within %v", what, d)
	}
}

// waitIndexed waits until the cache or proxy store in dir, kept by
// another process, has in its index on disk every change made to it
// before since: its stats.json, written about once a second, says so.
// A process killed after that restarts with those changes.
func waitIndexed(t testing.TB, dir string, since time.Time) {
	t.Helper()
	var st struct {
		Indexed time.Time `json:"indexed"`
	}
	waitFor(t, 10*time.Second, "the index of "+dir+" on disk", func() bool {
		return chunkindex.ReadStats(dir, &st) == nil && !st.Indexed.Before(since)
	})
}
