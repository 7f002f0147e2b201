package integration

import (
	"bytes"
	"os"
	"testing"

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
