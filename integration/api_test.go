package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// The library's POSIX-like API, each call checked against what a local
// file system does, and seen from a second client.
func TestLibraryAPI(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, t.TempDir(), 64<<20)
	b := dial(t, srv.addr, "mem", 64<<20)

	// O_EXCL, O_APPEND, Seek, ReadAt/WriteAt.
	f, err := a.Open("/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Open("/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("O_EXCL on an existing file: %v", err)
	}
	f.Write([]byte("hello world"))
	f.WriteAt([]byte("W"), 6)
	if pos, _ := f.Seek(-5, io.SeekEnd); pos != 6 {
		t.Fatalf("seek end: %d", pos)
	}
	rest, _ := io.ReadAll(f)
	if string(rest) != "World" {
		t.Fatalf("read after seek: %q", rest)
	}
	if st, _ := f.Stat(); st.Size != 11 || st.Mode != 0o640 {
		t.Fatalf("stat of an open file: %+v", st)
	}
	f.Close()
	g, _ := a.Open("/f", os.O_WRONLY|os.O_APPEND, 0)
	g.Write([]byte("!"))
	g.Close()
	if got := testkit.ReadFile(t, b, "/f"); string(got) != "hello World!" {
		t.Fatalf("after append: %q", got)
	}
	if _, err := a.Open("/nope", os.O_RDONLY, 0); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("open of a missing file: %v", err)
	}
	ro, _ := a.Open("/f", os.O_RDONLY, 0)
	if _, err := ro.Write([]byte("x")); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("write on a read-only handle: %v", err)
	}
	ro.Close()
	if err := ro.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("double close: %v", err)
	}

	// Truncate through a handle and by path; O_TRUNC.
	h, _ := a.Open("/f", os.O_RDWR, 0)
	h.Truncate(5)
	h.WriteAt([]byte("XY"), 8) // past the end: zeros between
	h.Close()
	if got := testkit.ReadFile(t, b, "/f"); !bytes.Equal(got, []byte("hello\x00\x00\x00XY")) {
		t.Fatalf("after truncate and write: %q", got)
	}
	if err := a.Truncate("/f", 2); err != nil {
		t.Fatal(err)
	}
	if got := testkit.ReadFile(t, b, "/f"); string(got) != "he" {
		t.Fatalf("after path truncate: %q", got)
	}
	h, _ = a.Open("/f", os.O_WRONLY|os.O_TRUNC, 0)
	h.Close()
	if st, _ := b.Stat("/f"); st.Size != 0 {
		t.Fatalf("O_TRUNC left %d bytes", st.Size)
	}

	// Symlinks: relative ones are followed, lstat does not follow.
	a.Mkdir("/d", 0o755)
	testkit.WriteFile(t, a, "/d/target", []byte("through the link"))
	if err := a.Symlink("d/target", "/link"); err != nil {
		t.Fatal(err)
	}
	if tgt, err := b.Readlink("/link"); err != nil || tgt != "d/target" {
		t.Fatalf("readlink: %q %v", tgt, err)
	}
	if got := testkit.ReadFile(t, b, "/link"); string(got) != "through the link" {
		t.Fatalf("read through the link: %q", got)
	}
	if st, _ := b.Lstat("/link"); st.Type != node.TypeSymlink {
		t.Fatalf("lstat followed the link: %v", st.Type)
	}
	// O_CREATE of a name that is something else: a link is followed, a
	// directory is not a file to open for writing.
	if h, err := b.Open("/link", os.O_CREATE|os.O_RDONLY, 0o644); err != nil {
		t.Fatalf("open with O_CREATE through a link: %v", err)
	} else {
		h.Close()
	}
	if _, err := b.Open("/d", os.O_CREATE|os.O_WRONLY, 0o644); !errors.Is(err, syscall.EISDIR) {
		t.Fatalf("open of a directory with O_CREATE for writing: %v, want EISDIR", err)
	}
	if _, err := b.Readlink("/d/target"); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("readlink of a file: %v", err)
	}
	a.Symlink("loop2", "/loop1")
	a.Symlink("loop1", "/loop2")
	if _, err := b.Stat("/loop1"); !errors.Is(err, syscall.ELOOP) {
		t.Fatalf("symlink loop: %v", err)
	}

	// Hard links share data and count links.
	if err := a.Link("/d/target", "/hard"); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Stat("/hard"); st.Nlink != 2 {
		t.Fatalf("nlink %d after link", st.Nlink)
	}
	testkit.WriteFile(t, a, "/hard", []byte("changed via the other name"))
	if got := testkit.ReadFile(t, b, "/d/target"); string(got) != "changed via the other name" {
		t.Fatalf("hard link does not share data: %q", got)
	}
	if err := a.Link("/d", "/dirlink"); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("hard link to a directory: %v", err)
	}

	// Chmod, Chown, Chtimes.
	if err := a.Chmod("/hard", 0o600); err != nil {
		t.Fatal(err)
	}
	mt := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	if err := a.Chtimes("/hard", mt, mt); err != nil {
		t.Fatal(err)
	}
	if err := a.Chown("/hard", 1234, 5678); err != nil {
		t.Fatal(err)
	}
	st, _ := b.Stat("/d/target")
	if st.Mode != 0o600 || !st.Mtime.Equal(mt) || !st.Atime.Equal(mt) || st.UID != 1234 || st.GID != 5678 {
		t.Fatalf("attributes: %+v", st)
	}

	// Rename over an existing file and directory moves; rmdir rules.
	testkit.WriteFile(t, a, "/d/other", []byte("other"))
	if err := a.Rename("/d/other", "/hard"); err != nil {
		t.Fatal(err)
	}
	if got := testkit.ReadFile(t, b, "/hard"); string(got) != "other" {
		t.Fatalf("rename over a file: %q", got)
	}
	if st, _ := b.Stat("/d/target"); st.Nlink != 1 {
		t.Fatalf("the replaced name still counted: nlink %d", st.Nlink)
	}
	a.Mkdir("/e", 0o755)
	if err := a.Rename("/d", "/e/d"); err != nil {
		t.Fatal(err)
	}
	if got := testkit.ReadFile(t, b, "/e/d/target"); string(got) != "changed via the other name" {
		t.Fatalf("after moving the directory: %q", got)
	}
	if err := a.Rename("/e", "/e/d/inside"); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("directory into itself: %v", err)
	}
	if err := a.Remove("/e"); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("remove of a non-empty directory: %v", err)
	}
	if err := a.Mkdir("/e", 0o755); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("mkdir over an existing directory: %v", err)
	}
	ents, err := b.ReadDir("/e/d")
	if err != nil || len(ents) != 1 || ents[0].Name != "target" {
		t.Fatalf("readdir: %+v %v", ents, err)
	}
	if _, err := b.ReadDir("/hard"); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("readdir of a file: %v", err)
	}
	if fs, err := b.StatFS(); err != nil || fs.Blocks == 0 || fs.BlockSize == 0 {
		t.Fatalf("statfs: %+v %v", fs, err)
	}
}

// A sequential reader gets chunks fetched ahead of it in the background.
func TestReadAhead(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 64<<20)
	testkit.WriteFile(t, a, "/seq", testkit.Pattern(8<<20, 5))
	b := dial(t, srv.addr, t.TempDir(), 64<<20)
	f, err := b.Open("/seq", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := make([]byte, 64<<10)
	for i := 0; i < 8; i++ { // two chunks, sequentially
		if _, err := f.Read(p); err != nil {
			t.Fatal(err)
		}
	}
	read := int64(8 * len(p))
	if !poll.Until(5*time.Second, func() bool { return b.Client().Stats().BytesFetched > read+256<<10 }) {
		t.Fatalf("fetched %d bytes after reading %d sequentially: no read-ahead", b.Client().Stats().BytesFetched, read)
	}
	// Random access does not trigger it.
	c := dial(t, srv.addr, "mem", 64<<20)
	g, _ := c.Open("/seq", os.O_RDONLY, 0)
	defer g.Close()
	for _, off := range []int64{5 << 20, 1 << 20, 7 << 20, 3 << 20} {
		g.ReadAt(p[:100], off)
	}
	// Read-ahead would be started by a read and land a little later; the
	// client counts no read-ahead started, so only a bounded wait can
	// tell that none comes.
	poll.Holds(t, 200*time.Millisecond, "random reads fetch exactly the 4 chunks read",
		func() bool { return c.Client().Stats().BytesFetched == 4*256<<10 })
}

// SIGTERM stops the server cleanly, with exit status 0.
func TestServerStopsCleanly(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 16<<20)
	testkit.WriteFile(t, a, "/x", []byte("x"))
	done := make(chan error, 1)
	go func() { done <- srv.stop() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("server exit: %v\n%s", err, srv.logs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server did not stop on SIGTERM with a client connected")
	}
}

// Files larger than the cache, written in pieces that do not line up with
// its chunks, are written whole: a chunk a write covers in part, fetched
// and then evicted to make room for that very write, is fetched again
// (the write failed with EIO, "cache: chunk not present", before).
func TestSmallCacheUnalignedWrites(t *testing.T) {
	srv := startServer(t, t.TempDir())
	c := dial(t, srv.addr, "mem", 2<<20)
	piece := make([]byte, 1<<20+4093)
	for i := range piece {
		piece[i] = byte(i * 7)
	}
	const size = 12 << 20
	for i := range 4 {
		name := fmt.Sprintf("/f%d", i)
		f, err := c.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < size; off += len(piece) {
			if _, err := f.Write(piece[:min(len(piece), size-off)]); err != nil {
				t.Fatalf("write of %s at %d: %v", name, off, err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close of %s: %v", name, err)
		}
	}
	r := dial(t, srv.addr, "mem", 64<<20)
	for i := range 4 {
		got := testkit.ReadFile(t, r, fmt.Sprintf("/f%d", i))
		if len(got) != size {
			t.Fatalf("/f%d: %d bytes, want %d", i, len(got), size)
		}
		for off := 0; off < size; off += len(piece) {
			if !bytes.Equal(got[off:min(off+len(piece), size)], piece[:min(len(piece), size-off)]) {
				t.Fatalf("/f%d: wrong bytes at %d", i, off)
			}
		}
	}
}
