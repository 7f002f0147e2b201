package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

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
	f, err := os.Create(m.path("db/seg"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
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
