package integration

import (
	"os"
	"syscall"
	"testing"

	"github.com/hoardfs/hoard/internal/testkit"
)

// blocksOf is a file's st_blocks as stat(2) reports it through a mount.
func blocksOf(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

// st_blocks counts the blocks a file's data takes, so that du and quotas
// add up: a file truncated to 1 GiB takes next to none, one of 1 MiB of
// data about 2048, whether its data is still here only (written, not yet
// stored), at the server, seen after a remount or by another client.
func TestFuseBlocks(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	cacheDir := t.TempDir()
	m := startMount(t, srv, cacheDir)
	within := func(what string, got, lo, hi int64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s: st_blocks %d, want %d..%d", what, got, lo, hi)
		}
	}

	if err := os.WriteFile(m.path("sparse"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sh(t, m.dir, "truncate -s 1G sparse")
	if fi, err := os.Stat(m.path("sparse")); err != nil || fi.Size() != 1<<30 {
		t.Fatalf("truncate -s 1G: %v, %v", fi, err)
	}
	within("truncate -s 1G", blocksOf(t, m.path("sparse")), 0, 8)

	if err := os.WriteFile(m.path("dense"), testkit.Pattern(1<<20, 9), 0o644); err != nil {
		t.Fatal(err)
	}
	within("1 MiB written, closed", blocksOf(t, m.path("dense")), 2048, 2048+64)

	// Rewritten whole, not stored yet where delegations keep it here.
	f, err := os.OpenFile(m.path("dense"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(testkit.Pattern(1<<20, 10)); err != nil {
		t.Fatal(err)
	}
	within("1 MiB rewritten, open", blocksOf(t, m.path("dense")), 2048, 2048+64)
	f.Close()
	within("1 MiB rewritten, closed", blocksOf(t, m.path("dense")), 2048, 2048+64)

	other := startMount(t, srv, t.TempDir())
	within("1 MiB, from another client", blocksOf(t, other.path("dense")), 2048, 2048+64)
	within("truncate -s 1G, from another client", blocksOf(t, other.path("sparse")), 0, 8)

	m.stop()
	m.start(srv)
	within("1 MiB, after a remount", blocksOf(t, m.path("dense")), 2048, 2048+64)
	within("truncate -s 1G, after a remount", blocksOf(t, m.path("sparse")), 0, 8)
	if out := sh(t, m.dir, "du -k sparse dense"); out == "" {
		t.Fatal("du said nothing")
	} else {
		t.Logf("du -k: %s", out)
	}
}
