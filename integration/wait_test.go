package integration

import (
	"testing"
	"time"

	"github.com/hoardfs/hoard/chunkindex"
	"github.com/hoardfs/hoard/internal/poll"
)

// waitIndexed waits until the cache or proxy store in dir, kept by
// another process, has in its index on disk every change made to it
// before since: its stats.json, written about once a second, says so.
// A process killed after that restarts with those changes.
func waitIndexed(t testing.TB, dir string, since time.Time) {
	t.Helper()
	var st struct {
		Indexed time.Time `json:"indexed"`
	}
	poll.Wait(t, 10*time.Second, "the index of "+dir+" on disk", func() bool {
		return chunkindex.ReadStats(dir, &st) == nil && !st.Indexed.Before(since)
	})
}
