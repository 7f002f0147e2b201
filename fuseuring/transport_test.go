package fuseuring

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{"0": {0}, "0-3": {0, 1, 2, 3}, "0-1,4,6-7": {0, 1, 4, 6, 7}} {
		got, err := parseCPUList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "0-"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) took it", bad)
		}
	}
}

// ringMount mounts a loopback of a fresh directory over io_uring, or skips
// saying why this machine cannot.
func ringMount(t *testing.T) (mnt, under string, tr *Transport) {
	t.Helper()
	if os.Geteuid() != 0 {
		skip(t, "FUSE over io_uring here mounts directly, which needs root")
	}
	wasOn, err := Enable()
	if err != nil {
		skip(t, err.Error())
	}
	if !wasOn {
		t.Cleanup(func() { Disable() })
	}
	if err := Check(); err != nil {
		skip(t, err.Error())
	}
	under, mnt = t.TempDir(), t.TempDir()
	root, err := fs.NewLoopbackRoot(under)
	if err != nil {
		t.Fatal(err)
	}
	opts := &fuse.MountOptions{FsName: "ringtest", Name: "ringtest", MaxWrite: 1 << 20}
	server, tr, err := Mount(mnt, fs.NewNodeFS(root, &fs.Options{}), opts, Config{PerCPU: 2})
	if server == nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Unmount(mnt); err != nil {
			t.Error(err)
		}
		server.Wait()
		if tr != nil {
			tr.Wait()
		}
	})
	if err != nil {
		t.Fatalf("rings not started: %v", err)
	}
	return mnt, under, tr
}

func skip(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("HOARD_REQUIRE_FUSE") != "" {
		t.Fatal(why)
	}
	t.Skip("SKIP: " + why)
}

// TestRingServesFileOps runs the usual operations through a loopback over
// the rings and checks both what they return and that the rings, not
// /dev/fuse, answered them.
func TestRingServesFileOps(t *testing.T) {
	mnt, under, tr := ringMount(t)
	data := bytes.Repeat([]byte("hoard-ring "), 300_000) // 3.3 MB: several 1 MiB writes
	p := filepath.Join(mnt, "d", "f")
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(under, "d", "f"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("under the mount: %d bytes, %v; want %d", len(got), err, len(data))
	}
	got, err = os.ReadFile(p)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes, %v; want %d", len(got), err, len(data))
	}
	if err := os.Rename(p, filepath.Join(mnt, "d", "g")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("g", filepath.Join(mnt, "d", "l")); err != nil {
		t.Fatal(err)
	}
	if dest, err := os.Readlink(filepath.Join(mnt, "d", "l")); err != nil || dest != "g" {
		t.Fatalf("readlink: %q, %v", dest, err)
	}
	names, err := os.ReadDir(filepath.Join(mnt, "d"))
	if err != nil || len(names) != 2 || names[0].Name() != "g" || names[1].Name() != "l" {
		t.Fatalf("readdir: %v, %v", names, err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "d", "f")); !os.IsNotExist(err) {
		t.Fatalf("renamed-away name: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(mnt, "d")); err != nil {
		t.Fatal(err)
	}
	if n := tr.Served(); n < 10 {
		t.Fatalf("the rings answered %d requests", n)
	}
	t.Logf("the rings answered %d requests on %d queues", tr.Served(), tr.Queues())
	if tr.Queues() < 1 {
		t.Fatalf("%d queues", tr.Queues())
	}
}
