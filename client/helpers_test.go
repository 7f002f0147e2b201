package client_test

// What client's tests share beyond the in-process server
// (internal/testkit/servertest) and testkit's checks.

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
)

func TestMain(m *testing.M) { servertest.Main(m) }

// openFile opens name through c with flag, failing the test on error. The
// file is closed when the test ends (unless closed first).
func openFile(t testing.TB, c *pathfs.FS, name string, flag int) *client.File {
	t.Helper()
	f, err := c.Open(name, flag, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// waitFor waits until cond holds (poll.Until), failing the test with
// what() once within has passed: what says the state it ended in.
func waitFor(t testing.TB, within time.Duration, cond func() bool, what func() string) {
	t.Helper()
	if !poll.Until(within, cond) {
		t.Fatalf("after %v: %s", within, what())
	}
}

// errnoOf is the errno err carries (0 if none): what errors.Is compares
// with.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

// root is k's root directory, failing the test on error.
func root(t testing.TB, k *client.Nodes) *client.Node {
	t.Helper()
	n, err := k.Root()
	testkit.Must(t, err)
	return n
}
