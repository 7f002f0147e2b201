package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// fsync of a directory returns 0, as on ext4 and tmpfs, and makes the
// names made in it durable: after the file's fsync and its directory's,
// a kill -9 of the server loses neither (PostgreSQL's way to make a new
// file durable; it treats a failed directory fsync as fatal).
func TestFuseFsyncDirectory(t *testing.T) {
	srv := startServer(t, t.TempDir())
	m := startMount(t, srv, t.TempDir())
	if err := os.Mkdir(m.path("db"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := testkit.Pattern(10000, 9)
	writeSynced(t, m.path("db/seg"), want)
	d, err := os.Open(m.path("db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatalf("fsync of a directory: %v", err)
	}
	d.Close()
	srv.kill9()
	srv.restart()
	c := dial(t, srv.addr, "mem", 64<<20)
	if got := testkit.ReadFile(t, c, "/db/seg"); !bytes.Equal(got, want) {
		t.Fatalf("after the server's kill -9: %d bytes", len(got))
	}
}

// A sparse file keeps its holes end to end: hoard put copies only its
// data (the server's copy takes the room of the data alone), and a mount
// that holds the file answers SEEK_DATA and SEEK_HOLE from its cache
// file, which keeps the holes it fetched, so that cp, tar and rsync skip
// them instead of reading zeros.
func TestSparseEndToEnd(t *testing.T) {
	srv := startServer(t, t.TempDir())
	local := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(local)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	data := testkit.Pattern(mib, 4)
	for _, at := range []int64{8 * mib, 40 * mib} {
		if _, err := f.WriteAt(data, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, code := run(t, "put", local, "/sparse", "--server", srv.addr, "--cache", ""); code != 0 {
		t.Fatalf("put: %d %s", code, out)
	}
	c := dial(t, srv.addr, "mem", 64<<20)
	st, err := c.Stat("/sparse")
	if err != nil || st.Size != 1<<30 {
		t.Fatalf("at the server: %+v %v", st, err)
	}
	if st.Blocks*512 > 4*mib {
		t.Fatalf("a 1 GiB file with 2 MiB of data takes %d bytes at the server", st.Blocks*512)
	}

	m := startMount(t, srv, t.TempDir(), "--cache-size", "2G")
	if out, code := run(t, "cache", "warmup", m.path("sparse")); code != 0 {
		t.Fatalf("warmup: %d %s", code, out)
	}
	g, err := os.Open(m.path("sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	seek := func(off int64, whence int) int64 {
		t.Helper()
		pos, err := unix.Seek(int(g.Fd()), off, whence)
		if err != nil {
			t.Fatalf("lseek(%d, %d): %v", off, whence, err)
		}
		return pos
	}
	if pos := seek(0, unix.SEEK_DATA); pos != 8*mib {
		t.Fatalf("SEEK_DATA from 0: %d, want %d", pos, 8*mib)
	}
	if pos := seek(8*mib, unix.SEEK_HOLE); pos != 9*mib {
		t.Fatalf("SEEK_HOLE from 8 MiB: %d, want %d", pos, 9*mib)
	}
	if pos := seek(9*mib, unix.SEEK_DATA); pos != 40*mib {
		t.Fatalf("SEEK_DATA from 9 MiB: %d, want %d", pos, 40*mib)
	}
	if pos := seek(41*mib, unix.SEEK_HOLE); pos != 41*mib {
		t.Fatalf("SEEK_HOLE from 41 MiB: %d, want it", pos)
	}
	if _, err := unix.Seek(int(g.Fd()), 41*mib, unix.SEEK_DATA); err != unix.ENXIO {
		t.Fatalf("SEEK_DATA past the last data: %v, want ENXIO", err)
	}
	got := make([]byte, mib)
	if _, err := g.ReadAt(got, 40*mib); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the data at 40 MiB: %v", err)
	}
}

// Extended attributes of the user namespace are stored at the server:
// set through one mount, read through another and through a proxy's,
// kept by cp -a both ways, refused past ext4's bounds, and gone with the
// file. Other namespaces are refused as before (ENOTSUP).
func TestFuseXattrs(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := startMount(t, srv, t.TempDir())
	b := startMount(t, startProxy(t, srv, t.TempDir()), t.TempDir())
	f := a.path("f")
	if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(f, "user.color", []byte("blue"), 0); err != nil {
		t.Fatalf("setxattr: %v", err)
	}
	if err := unix.Setxattr(f, "user.color", []byte("red"), unix.XATTR_CREATE); err != unix.EEXIST {
		t.Fatalf("setxattr XATTR_CREATE of an existing name: %v, want EEXIST", err)
	}
	get := func(path, name string) (string, error) {
		buf := make([]byte, 256)
		n, err := unix.Getxattr(path, name, buf)
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	poll.Wait(t, 10*time.Second, "the attribute seen through the proxy's mount", func() bool {
		v, err := get(b.path("f"), "user.color")
		return err == nil && v == "blue"
	})
	if err := unix.Setxattr(b.path("f"), "user.size", []byte("L"), 0); err != nil {
		t.Fatalf("setxattr through the proxy: %v", err)
	}
	buf := make([]byte, 256)
	n, err := unix.Listxattr(f, buf)
	if err != nil || string(buf[:n]) != "user.color\x00user.size\x00" {
		t.Fatalf("listxattr: %q %v", buf[:n], err)
	}
	if _, err := get(f, "user.none"); err != unix.ENODATA {
		t.Fatalf("getxattr of a missing name: %v, want ENODATA", err)
	}
	if err := unix.Setxattr(f, "trusted.x", []byte("1"), 0); err != unix.ENOTSUP && err != unix.EPERM {
		t.Fatalf("setxattr trusted.x: %v, want ENOTSUP", err)
	}
	if err := unix.Setxattr(f, "user.big", make([]byte, 70<<10), 0); err != unix.E2BIG && err != unix.ENOSPC {
		t.Fatalf("setxattr of 70 KiB: %v, want E2BIG", err)
	}
	// cp -a out of the mount and back in keeps them.
	local := filepath.Join(t.TempDir(), "copy")
	sh(t, "/", "cp -a "+f+" "+local+" && cp -a "+local+" "+a.path("g"))
	if v, err := get(a.path("g"), "user.size"); err != nil || v != "L" {
		t.Fatalf("after cp -a out and back: %q %v", v, err)
	}
	if err := unix.Removexattr(f, "user.color"); err != nil {
		t.Fatal(err)
	}
	if _, err := get(f, "user.color"); err != unix.ENODATA {
		t.Fatalf("after removexattr: %v", err)
	}
}
