// Package poll is the tests' one way to wait on a condition: look again
// and again, less and less often, until it holds or time runs out. A
// test waits on what it can observe, never for a fixed time.
package poll

import (
	"testing"
	"time"
)

// Until reports whether cond holds within timeout. It looks from 1 ms
// apart up to 50 ms apart: a cheap condition is seen soon, and a costly
// one (a request to a server coming back) is not hammered.
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for tick := time.Millisecond; !cond(); tick = min(2*tick, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(tick)
	}
	return true
}

// Wait fails the test unless cond holds within timeout; what says what
// was waited for.
func Wait(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(timeout, cond) {
		t.Fatalf("%s: not within %v", what, timeout)
	}
}

// Holds fails the test if cond stops holding within d: for what must not
// happen where nothing observable marks the moment it would have (each
// use says why), so that only a bounded wait can tell.
func Holds(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if Until(d, func() bool { return !cond() }) {
		t.Fatalf("%s: not so within %v", what, d)
	}
}
