package integration

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/fuseuring"
	"github.com/hoardfs/hoard/mount"
)

// needURing turns the kernel's FUSE over io_uring on for the test (root),
// or skips saying why this kernel cannot.
func needURing(t *testing.T) {
	t.Helper()
	needFuse(t)
	if os.Geteuid() != 0 {
		t.Skip("SKIP: FUSE over io_uring: hoard uses it only as root")
	}
	wasOn, err := fuseuring.Enable()
	if err != nil {
		t.Skipf("SKIP: %v", err)
	}
	if !wasOn {
		t.Cleanup(func() { fuseuring.Disable() })
	}
	if err := fuseuring.Check(); err != nil {
		t.Skipf("SKIP: %v", err)
	}
}

// TestFuseOverIOURing serves a mount's requests over io_uring: real tools
// run on it as on the local disk, another mount's changes reach its kernel
// (the notifications still go over /dev/fuse), its changes reach the
// other's, and SIGTERM unmounts it.
func TestFuseOverIOURing(t *testing.T) {
	needURing(t)
	srv := startServer(t, t.TempDir())
	ring := startMount(t, srv, t.TempDir(), "--io-uring")
	if !strings.Contains(ring.logs.String(), "requests over io_uring") {
		t.Fatalf("the mount does not say it serves over io_uring:\n%s", ring.logs)
	}
	dev := startMount(t, srv, t.TempDir())
	if !strings.Contains(dev.logs.String(), "requests over /dev/fuse") {
		t.Fatalf("a mount without --io-uring:\n%s", dev.logs)
	}
	t.Run("tools", func(t *testing.T) { realTools(t, ring) })
	t.Run("from the other mount", func(t *testing.T) { twoMounts(t, dev, ring) })
	t.Run("to the other mount", func(t *testing.T) { twoMounts(t, ring, dev) })
	t.Run("unmount", func(t *testing.T) {
		ring.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- ring.cmd.Wait() }()
		select {
		case err := <-done:
			ring.cmd = nil
			if err != nil {
				t.Fatalf("the mount exited with %v:\n%s", err, ring.logs)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the mount did not exit on SIGTERM:\n%s", ring.logs)
		}
		if mounted, _ := mount.IsMounted(ring.dir); mounted {
			t.Fatal("still mounted after the mount exited")
		}
	})
}
