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
	if why := useURing(t); why != "" {
		t.Skipf("SKIP: %s", why)
	}
}

// useURing turns the kernel's FUSE over io_uring on for the test, or says
// why it cannot.
func useURing(t *testing.T) (why string) {
	if os.Geteuid() != 0 {
		return "FUSE over io_uring: hoard uses it only as root"
	}
	wasOn, err := fuseuring.Enable()
	if err != nil {
		return err.Error()
	}
	if !wasOn {
		t.Cleanup(func() { fuseuring.Disable() })
	}
	if err := fuseuring.Check(); err != nil {
		return err.Error()
	}
	return ""
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
	dev := startMount(t, srv, t.TempDir(), "--io-uring=false")
	if !strings.Contains(dev.logs.String(), "requests over /dev/fuse") {
		t.Fatalf("a mount with --io-uring=false:\n%s", dev.logs)
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

// TestFuseIOURingUnavailableSaysWhy: a mount asked for io_uring where the
// kernel does not offer it serves over /dev/fuse and warns, saying why.
func TestFuseIOURingUnavailableSaysWhy(t *testing.T) {
	needFuse(t)
	if os.Geteuid() == 0 && fuseuring.Check() == nil {
		t.Skip("SKIP: this kernel offers FUSE over io_uring now")
	}
	srv := startServer(t, t.TempDir())
	m := startMount(t, srv, t.TempDir(), "--io-uring")
	logs := m.logs.String()
	if !strings.Contains(logs, "requests over /dev/fuse") || !strings.Contains(logs, "--io-uring: the kernel's requests come over /dev/fuse") {
		t.Fatalf("no warning, or not over /dev/fuse:\n%s", logs)
	}
	if !strings.Contains(logs, "off in this kernel") && !strings.Contains(logs, "no FUSE over io_uring") && !strings.Contains(logs, "needs root") {
		t.Fatalf("the warning does not say why:\n%s", logs)
	}
	if m := startMount(t, srv, t.TempDir()); strings.Contains(m.logs.String(), "level=WARN") {
		t.Fatalf("the default warns where the kernel has no io_uring:\n%s", m.logs)
	}
}
