package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// Dial fails, naming the address, when nothing answers there, and when
// no address is given at all.
func TestDialFailures(t *testing.T) {
	if _, err := client.Dial(client.Options{}); err == nil {
		t.Fatal("Dial without a server address succeeded")
	}
	l := listen(t, "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	start := time.Now()
	_, err := client.Dial(client.Options{Server: addr, DialTimeout: 300 * time.Millisecond, Logger: testLogger()})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial of a closed port: %v, want an error naming %s", err, addr)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Dial of a closed port took %v", took)
	}
}

// Open's flags behave as os.OpenFile's: O_EXCL, O_APPEND, O_TRUNC, and the
// read-only and write-only modes; Seek, Read, Write, ReadAt, WriteAt,
// Stat and Close of a File.
func TestOpenFlagsAndFile(t *testing.T) {
	s := startServer(t)
	a := s.dial(t)
	b := s.dial(t, memCache())

	f, err := a.Open("/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
	must(t, err)
	if f.Name() != "/f" || f.FID().IsZero() {
		t.Fatalf("name %q, fid %v", f.Name(), f.FID())
	}
	if _, err := a.Open("/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("O_EXCL on an existing file: %v", err)
	}
	if n, err := f.Write([]byte("hello world")); n != 11 || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	if _, err := f.WriteAt([]byte("W"), 6); err != nil {
		t.Fatal(err)
	}
	if pos, err := f.Seek(-5, io.SeekEnd); pos != 6 || err != nil {
		t.Fatalf("seek from the end: %d %v", pos, err)
	}
	rest, err := io.ReadAll(f)
	if string(rest) != "World" || err != nil {
		t.Fatalf("read after seek: %q %v", rest, err)
	}
	if pos, _ := f.Seek(-2, io.SeekCurrent); pos != 9 {
		t.Fatalf("seek from the current offset: %d", pos)
	}
	if _, err := f.Seek(-100, io.SeekStart); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("seek before the start: %v", err)
	}
	if _, err := f.Seek(0, 42); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("seek with a bad whence: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 1), -1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("read at a negative offset: %v", err)
	}
	if _, err := f.WriteAt([]byte("x"), -1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("write at a negative offset: %v", err)
	}
	if n, err := f.WriteAt(nil, 3); n != 0 || err != nil {
		t.Fatalf("empty write: %d %v", n, err)
	}
	p := make([]byte, 20)
	if n, err := f.ReadAt(p, 6); n != 5 || err != io.EOF {
		t.Fatalf("read across the end: %d %v", n, err)
	}
	if st, err := f.Stat(); err != nil || st.Size != 11 || st.Mode&0o777 != 0o640 || st.Type != node.TypeFile {
		t.Fatalf("stat of an open file: %+v %v", st, err)
	}
	if d := f.Policy(); d.Bypass || f.Bypassed() || d.String() == "" {
		t.Fatalf("a small file's policy: %v, bypassed %v", d, f.Bypassed())
	}
	must(t, f.Close())
	if err := f.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if _, err := f.ReadAt(p, 0); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if _, err := f.Write(p); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if err := f.Truncate(0); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("truncate after close: %v", err)
	}
	if err := f.Sync(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("sync after close: %v", err)
	}
	if err := f.Flush(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("flush after close: %v", err)
	}
	if _, err := f.Stat(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("stat after close: %v", err)
	}
	wantFile(t, b, "/f", []byte("hello World"))

	// O_APPEND writes at the end; WriteAt is refused on such a file.
	g, err := a.Open("/f", os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	if _, err := g.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAt([]byte("?"), 0); err == nil {
		t.Fatal("WriteAt on an O_APPEND file succeeded")
	}
	if _, err := g.ReadAt(p, 0); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read on a write-only file: %v", err)
	}
	must(t, g.Close())
	wantFile(t, b, "/f", []byte("hello World!"))

	// A read-only file cannot be written, truncated; its Sync and Flush
	// have nothing to do.
	ro, err := a.Open("/f", os.O_RDONLY, 0)
	must(t, err)
	if _, err := ro.Write([]byte("x")); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("write on a read-only file: %v", err)
	}
	if err := ro.Truncate(1); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("truncate of a read-only file: %v", err)
	}
	must(t, ro.Sync())
	must(t, ro.Flush())
	must(t, ro.Close())

	// O_TRUNC empties the file; Create does too.
	h, err := a.Open("/f", os.O_WRONLY|os.O_TRUNC, 0)
	must(t, err)
	must(t, h.Close())
	if st, err := b.Stat("/f"); err != nil || st.Size != 0 {
		t.Fatalf("after O_TRUNC: %+v %v", st, err)
	}
	testkit.WriteFile(t, a, "/f", []byte("again"))
	testkit.WriteFile(t, a, "/f", []byte("x"))
	wantFile(t, b, "/f", []byte("x"))

	// O_CREATE without O_EXCL on an existing file opens it as it is.
	h, err = a.Open("/f", os.O_RDWR|os.O_CREATE, 0o600)
	must(t, err)
	if st, _ := h.Stat(); st.Size != 1 {
		t.Fatalf("O_CREATE of an existing file: size %d", st.Size)
	}
	must(t, h.Close())
}

// Truncate, Allocate and Sync of an open file, and the zeros a write past
// the end leaves.
func TestFileTruncateAllocate(t *testing.T) {
	s := startServer(t)
	a := s.dial(t)
	b := s.dial(t, memCache())
	h := testkit.Create(t, a, "/t", []byte("hello world"))
	must(t, h.Truncate(5))
	_, err := h.WriteAt([]byte("XY"), 8)
	must(t, err)
	if err := h.Truncate(-1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("negative truncate: %v", err)
	}
	if err := h.Allocate(0, 0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("allocate of nothing: %v", err)
	}
	must(t, h.Allocate(0, 4)) // inside: nothing to do
	if st, _ := h.Stat(); st.Size != 10 {
		t.Fatalf("size after allocate inside: %d", st.Size)
	}
	must(t, h.Allocate(10, 6))
	if st, _ := h.Stat(); st.Size != 16 {
		t.Fatalf("size after allocate past the end: %d", st.Size)
	}
	must(t, h.Sync())
	wantFile(t, b, "/t", []byte("hello\x00\x00\x00XY\x00\x00\x00\x00\x00\x00"))
	must(t, h.Close())

	// Truncate by name: longer, then shorter.
	must(t, a.Truncate("/t", 20))
	if st, _ := b.Stat("/t"); st.Size != 20 {
		t.Fatalf("after truncate to 20: size %d", st.Size)
	}
	must(t, a.Truncate("/t", 2))
	wantFile(t, b, "/t", []byte("he"))
	wantErrno(t, "negative truncate by name", a.Truncate("/t", -1), syscall.EINVAL)
	wantErrno(t, "truncate of a missing file", a.Truncate("/none", 1), syscall.ENOENT)
}

// Directories, symlinks, hard links, attributes and renames, each seen by
// a second client.
func TestNamespace(t *testing.T) {
	s := startServer(t)
	a := s.dial(t)
	b := s.dial(t, memCache())

	must(t, a.Mkdir("/d", 0o755))
	testkit.WriteFile(t, a, "/d/target", []byte("through the link"))
	must(t, a.Symlink("d/target", "/link"))
	if tgt, err := b.Readlink("/link"); err != nil || tgt != "d/target" {
		t.Fatalf("readlink: %q %v", tgt, err)
	}
	wantFile(t, b, "/link", []byte("through the link"))
	if st, err := b.Lstat("/link"); err != nil || st.Type != node.TypeSymlink {
		t.Fatalf("lstat: %+v %v", st, err)
	}
	if st, err := b.Stat("/link"); err != nil || st.Type != node.TypeFile {
		t.Fatalf("stat through a link: %+v %v", st, err)
	}
	// A link in the middle of a path, and one that climbs with "..".
	must(t, a.Symlink("d", "/dl"))
	wantFile(t, b, "/dl/target", []byte("through the link"))
	must(t, a.Mkdir("/d/sub", 0o755))
	must(t, a.Symlink("../target", "/d/sub/up"))
	wantFile(t, b, "/d/sub/up", []byte("through the link"))
	// An absolute link points outside hoard.
	must(t, a.Symlink("/etc/passwd", "/abs"))
	wantErrno(t, "open of an absolute link", func() error { _, err := b.Open("/abs", os.O_RDONLY, 0); return err }(), syscall.ENOENT)
	// O_CREATE through a link opens its target; a directory is no file.
	h, err := b.Open("/link", os.O_CREATE|os.O_RDONLY, 0o644)
	must(t, err)
	must(t, h.Close())
	_, err = b.Open("/d", os.O_CREATE|os.O_WRONLY, 0o644)
	wantErrno(t, "O_CREATE of a directory", err, syscall.EISDIR)
	_, err = b.Open("/d", os.O_RDONLY, 0)
	wantErrno(t, "open of a directory", err, syscall.EISDIR)
	_, err = b.Open("/link", os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	wantErrno(t, "O_EXCL of a link", err, syscall.EEXIST)
	_, err = b.Readlink("/d/target")
	wantErrno(t, "readlink of a file", err, syscall.EINVAL)
	must(t, a.Symlink("loop2", "/loop1"))
	must(t, a.Symlink("loop1", "/loop2"))
	_, err = b.Stat("/loop1")
	wantErrno(t, "a symlink loop", err, syscall.ELOOP)
	wantErrno(t, "symlink over a name", a.Symlink("x", "/link"), syscall.EEXIST)

	// Hard links.
	must(t, a.Link("/d/target", "/hard"))
	if st, err := b.Stat("/hard"); err != nil || st.Nlink != 2 {
		t.Fatalf("nlink after link: %+v %v", st, err)
	}
	testkit.WriteFile(t, a, "/hard", []byte("changed via the other name"))
	wantFile(t, b, "/d/target", []byte("changed via the other name"))
	wantErrno(t, "hard link to a directory", a.Link("/d", "/dirlink"), syscall.EPERM)
	wantErrno(t, "link of a missing file", a.Link("/none", "/x"), syscall.ENOENT)
	wantErrno(t, "link into a missing directory", a.Link("/hard", "/none/x"), syscall.ENOENT)
	wantErrno(t, "link over a name", a.Link("/hard", "/link"), syscall.EEXIST)

	// Attributes.
	must(t, a.Chmod("/hard", 0o600|os.ModeSetuid|os.ModeSetgid|os.ModeSticky))
	if st, _ := b.Stat("/hard"); st.Mode&0o7777 != 0o7600 {
		t.Fatalf("mode with setuid, setgid, sticky: %o", st.Mode)
	}
	must(t, a.Chmod("/hard", 0o600))
	mt := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	must(t, a.Chtimes("/hard", mt, mt))
	must(t, a.Chown("/hard", 1234, 5678))
	must(t, a.Chown("/hard", -1, -1)) // nothing to change
	must(t, a.Chown("/hard", -1, 42))
	st, err := b.Stat("/d/target")
	if err != nil || st.Mode&0o7777 != 0o600 || !st.Mtime.Equal(mt) || !st.Atime.Equal(mt) || st.UID != 1234 || st.GID != 42 {
		t.Fatalf("attributes: %+v %v", st, err)
	}
	wantErrno(t, "chmod of a missing file", a.Chmod("/none", 0o600), syscall.ENOENT)

	// Rename over a file, of a directory, and the rules.
	testkit.WriteFile(t, a, "/d/other", []byte("other"))
	must(t, a.Rename("/d/other", "/hard"))
	wantFile(t, b, "/hard", []byte("other"))
	if st, _ := b.Stat("/d/target"); st.Nlink != 1 {
		t.Fatalf("the replaced name still counted: nlink %d", st.Nlink)
	}
	must(t, a.Mkdir("/e", 0o755))
	must(t, a.Rename("/d", "/e/d"))
	wantFile(t, b, "/e/d/target", []byte("changed via the other name"))
	wantErrno(t, "a directory into itself", a.Rename("/e", "/e/d/inside"), syscall.EINVAL)
	wantErrno(t, "rename of a missing name", a.Rename("/none", "/x"), syscall.ENOENT)
	wantErrno(t, "rename into a missing directory", a.Rename("/hard", "/none/x"), syscall.ENOENT)
	wantErrno(t, "rename of the root", a.Rename("/", "/x"), syscall.EINVAL)
	wantErrno(t, "remove of a non-empty directory", a.Remove("/e"), syscall.ENOTEMPTY)
	wantErrno(t, "mkdir over a directory", a.Mkdir("/e", 0o755), syscall.EEXIST)
	wantErrno(t, "mkdir in a missing directory", a.Mkdir("/none/x", 0o755), syscall.ENOENT)
	ents, err := b.ReadDir("/e/d")
	if err != nil || len(ents) != 2 || ents[0].Name != "sub" && ents[1].Name != "sub" {
		t.Fatalf("readdir: %+v %v", ents, err)
	}
	_, err = b.ReadDir("/hard")
	wantErrno(t, "readdir of a file", err, syscall.ENOTDIR)
	_, err = b.ReadDir("/none")
	wantErrno(t, "readdir of a missing directory", err, syscall.ENOENT)
	_, err = b.Stat("/hard/x")
	wantErrno(t, "a file in the middle of a path", err, syscall.ENOTDIR)
	_, err = b.Open("/hard/x", os.O_CREATE|os.O_RDWR, 0o644)
	wantErrno(t, "create under a file", err, syscall.ENOTDIR)

	// Remove: a file, a symlink, an empty directory.
	must(t, a.Remove("/hard"))
	must(t, a.Remove("/link"))
	must(t, a.Remove("/e/d/sub/up"))
	must(t, a.Remove("/e/d/sub"))
	wantErrno(t, "remove of a missing name", a.Remove("/hard"), syscall.ENOENT)
	wantErrno(t, "remove of the root", a.Remove("/"), syscall.EINVAL)
	_, err = b.Stat("/hard")
	wantErrno(t, "stat of a removed file", err, syscall.ENOENT)
	if got, want := testkit.Names(t, b, "/"), []string{"abs", "dl", "e", "loop1", "loop2"}; !slices.Equal(got, want) {
		t.Fatalf("root lists %v, want %v", got, want)
	}
	if st, err := b.Stat("/"); err != nil || st.Type != node.TypeDir {
		t.Fatalf("stat of the root: %+v %v", st, err)
	}
}

// Names are checked before anything is asked: empty, ".", "..", "/" and
// NUL are invalid, a name longer than 255 bytes too long; ".." does not
// climb above the root.
func TestBadNames(t *testing.T) {
	s := startServer(t)
	a := s.dial(t)
	long := strings.Repeat("x", 256)
	_, err := a.Open("/"+long, os.O_CREATE|os.O_RDWR, 0o644)
	wantErrno(t, "create of a long name", err, syscall.ENAMETOOLONG)
	wantErrno(t, "mkdir of a long name", a.Mkdir("/"+long, 0o755), syscall.ENAMETOOLONG)
	_, err = a.Stat("/" + long)
	wantErrno(t, "stat of a long name", err, syscall.ENAMETOOLONG)
	_, err = a.Open("/a\x00b", os.O_CREATE|os.O_RDWR, 0o644)
	wantErrno(t, "a name with NUL", err, syscall.EINVAL)
	wantErrno(t, "mkdir of the root", a.Mkdir("/", 0o755), syscall.EINVAL)
	testkit.WriteFile(t, a, "/ok", []byte("ok"))
	wantErrno(t, "rename to a long name", a.Rename("/ok", "/"+long), syscall.ENAMETOOLONG)
	wantErrno(t, "link to a long name", a.Link("/ok", "/"+long), syscall.ENAMETOOLONG)
	wantErrno(t, "symlink to a long name", a.Symlink("ok", "/"+long), syscall.ENAMETOOLONG)
	wantFile(t, a, "/../../ok", []byte("ok"))
	wantFile(t, a, "ok", []byte("ok"))
	testkit.WriteFile(t, a, "/"+strings.Repeat("y", 255), []byte("longest"))
	wantFile(t, a, "/"+strings.Repeat("y", 255), []byte("longest"))
}

// Volumes: created, listed, mounted into the tree, crossed by paths, and
// StatFS reports the server's space.
func TestVolumes(t *testing.T) {
	s := startServer(t)
	a := s.dial(t)
	b := s.dial(t, memCache())
	v, err := a.Admin().CreateVolume("proj")
	if err != nil || v.Name != "proj" || v.ID == 0 || v.Root.IsZero() || v.Created.IsZero() {
		t.Fatalf("create volume: %+v %v", v, err)
	}
	_, err = a.Admin().CreateVolume("proj")
	wantErrno(t, "a volume's name twice", err, syscall.EEXIST)
	vols, err := b.Admin().Volumes()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vols {
		names = append(names, v.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"proj", "root"}) {
		t.Fatalf("volumes %v", names)
	}
	must(t, a.Admin().MountVolume("/proj", "proj"))
	wantErrno(t, "mount over a name", a.Admin().MountVolume("/proj", "proj"), syscall.EEXIST)
	testkit.WriteFile(t, a, "/proj/inside", []byte("in the volume"))
	must(t, a.Mkdir("/proj/sub", 0o755))
	testkit.WriteFile(t, a, "/proj/sub/deep", []byte("deep"))
	wantFile(t, b, "/proj/inside", []byte("in the volume"))
	wantFile(t, b, "/proj/sub/deep", []byte("deep"))
	st, err := b.Stat("/proj")
	if err != nil || st.Type != node.TypeDir || st.FID != v.Root {
		t.Fatalf("stat of a mount point: %+v %v (root %v)", st, err, v.Root)
	}
	if lst, err := b.Lstat("/proj"); err != nil || lst.Type != node.TypeMountPoint || lst.Target != "proj" {
		t.Fatalf("lstat of a mount point: %+v %v", lst, err)
	}
	ents, err := b.ReadDir("/proj")
	if err != nil || len(ents) != 2 {
		t.Fatalf("readdir of a mounted volume: %+v %v", ents, err)
	}
	if f, err := b.Open("/proj/inside", os.O_RDONLY, 0); err != nil || f.FID().Volume != v.ID {
		t.Fatalf("a file in the volume: %v, volume %d", err, v.ID)
	} else {
		f.Close()
	}
	// A mount point of a volume that does not exist is refused.
	wantErrno(t, "mount of a missing volume", a.Admin().MountVolume("/ghost", "no-such-volume"), syscall.ENOENT)
	fs, err := b.StatFS()
	if err != nil || fs.Blocks == 0 || fs.BlockSize == 0 {
		t.Fatalf("statfs: %+v %v", fs, err)
	}
	// A rename across volumes is refused.
	wantErrno(t, "rename across volumes", a.Rename("/proj/inside", "/outside"), syscall.EXDEV)
	// A mount point is removed as a name; the volume stays.
	must(t, a.Remove("/proj"))
	_, err = b.Stat("/proj/inside")
	wantErrno(t, "a path through a removed mount point", err, syscall.ENOENT)
	must(t, a.Admin().MountVolume("/again", "proj"))
	wantFile(t, b, "/again/sub/deep", []byte("deep"))
}

// A read of a file larger than a chunk, in pieces of odd sizes, returns
// exactly what was written; a sequential reader gets the chunks after
// the ones it read fetched ahead.
func TestLargeFileAndReadAhead(t *testing.T) {
	s := startServer(t)
	data := testkit.Pattern(3<<20+12345, 7)
	s.seed(t, "/big", data)
	r := s.dial(t)
	f := openFile(t, r, "/big", os.O_RDONLY)
	p := make([]byte, 64<<10)
	var got []byte
	for range 8 { // two 256 KiB chunks, sequentially
		n, err := f.Read(p)
		must(t, err)
		got = append(got, p[:n]...)
	}
	read := int64(len(got))
	waitFor(t, 10*time.Second, func() bool { return r.Client().Stats().BytesFetched > read+256<<10 }, func() string {
		return "no read-ahead after a sequential read"
	})
	rest, err := io.ReadAll(f)
	must(t, err)
	got = append(got, rest...)
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, want %d, equal %v", len(got), len(data), bytes.Equal(got, data))
	}
	// Random reads fetch only what they read.
	c := s.dial(t, memCache())
	g := openFile(t, c, "/big", os.O_RDONLY)
	for _, off := range []int64{3 << 20, 1 << 20, 2<<20 + 7, 512 << 10} {
		n, err := g.ReadAt(p[:100], off)
		if n != 100 || err != nil || !bytes.Equal(p[:100], data[off:off+100]) {
			t.Fatalf("random read at %d: %d %v", off, n, err)
		}
	}
	// Three whole chunks and the short last one.
	if got, want := c.Client().Stats().BytesFetched, int64(3*256<<10+len(data)-3<<20); got != want {
		t.Fatalf("random reads fetched %d bytes, want the %d of the 4 chunks read", got, want)
	}
}

// Edge cases of the namespace calls, as a local file system answers them.
func TestNamespaceEdges(t *testing.T) {
	s := startServer(t)
	a := s.dial(t)
	b := s.dial(t, memCache())
	testkit.WriteFile(t, a, "/f", []byte("data"))
	must(t, a.Mkdir("/d", 0o755))
	must(t, a.Mkdir("/e", 0o755))
	testkit.WriteFile(t, a, "/e/x", []byte("x"))
	must(t, a.Rename("/f", "/f")) // to itself: nothing happens
	wantFile(t, b, "/f", []byte("data"))
	wantErrno(t, "rename of a file over a directory", a.Rename("/f", "/d"), syscall.EISDIR)
	wantErrno(t, "rename of a directory over a file", a.Rename("/d", "/f"), syscall.ENOTDIR)
	must(t, a.Rename("/e", "/d")) // over an empty directory
	wantFile(t, b, "/d/x", []byte("x"))
	_, err := b.Stat("/e")
	wantErrno(t, "the old name of a renamed directory", err, syscall.ENOENT)
	wantErrno(t, "symlink with an empty target", a.Symlink("", "/s"), syscall.EINVAL)
	_, err = a.Readlink("/nope")
	wantErrno(t, "readlink of a missing name", err, syscall.ENOENT)
	wantErrno(t, "truncate of a directory", a.Truncate("/d", 0), syscall.EISDIR)
	wantErrno(t, "truncate past the largest file", a.Truncate("/f", 1<<50), syscall.EFBIG)

	// A write past the end after a seek leaves zeros between.
	g, err := a.Open("/f", os.O_RDWR, 0)
	must(t, err)
	_, err = g.Seek(10, io.SeekStart)
	must(t, err)
	_, err = g.Write([]byte("Z"))
	must(t, err)
	if n, err := g.Read(make([]byte, 4)); n != 0 || err != io.EOF {
		t.Fatalf("read at the end: %d %v", n, err)
	}
	must(t, g.Close())
	wantFile(t, b, "/f", []byte("data\x00\x00\x00\x00\x00\x00Z"))

	// Renaming a hard link onto the file's other name changes nothing.
	testkit.WriteFile(t, a, "/h", []byte("hh"))
	must(t, a.Link("/h", "/h2"))
	must(t, a.Rename("/h", "/h2"))
	if st, err := b.Stat("/h"); err != nil || st.Nlink != 2 {
		t.Fatalf("after renaming a link onto its other name: %+v %v", st, err)
	}
	// Attribute changes and truncation by name follow a symlink.
	must(t, a.Symlink("h2", "/sl"))
	must(t, a.Chmod("/sl", 0o611))
	must(t, a.Truncate("/sl", 1))
	if st, err := b.Stat("/h2"); err != nil || st.Mode&0o777 != 0o611 || st.Size != 1 {
		t.Fatalf("through a symlink: %+v %v", st, err)
	}
	if st, err := b.Lstat("/sl"); err != nil || st.Type != node.TypeSymlink || st.Target != "h2" {
		t.Fatalf("the symlink itself: %+v %v", st, err)
	}
	// O_CREATE of a new file opened read-only creates it.
	n, err := a.Open("/newro", os.O_RDONLY|os.O_CREATE, 0o644)
	must(t, err)
	must(t, n.Close())
	if st, err := b.Stat("/newro"); err != nil || st.Size != 0 {
		t.Fatalf("a file created read-only: %+v %v", st, err)
	}
	// A trailing slash names the directory.
	must(t, a.Mkdir("/t/", 0o755))
	if st, err := b.Stat("/t/"); err != nil || st.Type != node.TypeDir {
		t.Fatalf("a directory made with a trailing slash: %+v %v", st, err)
	}
}

// Concurrent readers of one file share its fetches and each reads the
// right bytes; concurrent writers of different files in one directory
// through two clients lose nothing.
func TestConcurrentAccess(t *testing.T) {
	s := startServer(t)
	data := testkit.Pattern(4<<20, 11)
	w := s.seed(t, "/shared", data)
	r := s.dial(t)
	f := openFile(t, r, "/shared", os.O_RDONLY)
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			p := make([]byte, 100_000)
			for i := range 20 {
				off := int64((g*7919 + i*104729) % (len(data) - len(p)))
				n, err := f.ReadAt(p, off)
				if err != nil || n != len(p) || !bytes.Equal(p, data[off:off+int64(n)]) {
					errs <- fmt.Errorf("reader %d: at %d: %d bytes, %v", g, off, n, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		must(t, <-errs)
	}
	if got := r.Client().Stats().BytesFetched; got > int64(len(data)) {
		t.Fatalf("fetched %d bytes of a %d-byte file", got, len(data))
	}

	must(t, w.Mkdir("/cd", 0o755))
	clients := []*pathfs.FS{w, r}
	for g := range 4 {
		go func() {
			c := clients[g%2]
			for i := range 10 {
				name := fmt.Sprintf("/cd/g%d-%d", g, i)
				h, err := c.Create(name)
				if err == nil {
					_, err = h.Write([]byte(name))
				}
				if err == nil {
					err = h.Close()
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %v", name, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		must(t, <-errs)
	}
	for _, c := range clients {
		ents, err := c.ReadDir("/cd")
		if err != nil || len(ents) != 40 {
			t.Fatalf("listing after concurrent creates: %d entries, %v", len(ents), err)
		}
	}
	for g := range 4 {
		name := fmt.Sprintf("/cd/g%d-9", g)
		wantFile(t, clients[(g+1)%2], name, []byte(name))
	}
}

// A program that reads a directory's files in the order of its listing
// gets the next small files fetched ahead of its opens.
func TestDirectoryReadAhead(t *testing.T) {
	s := startServer(t)
	w := s.dial(t, memCache())
	must(t, w.Mkdir("/tree", 0o755))
	const n, size = 20, 10 << 10
	for i := range n {
		testkit.WriteFile(t, w, fmt.Sprintf("/tree/f%02d", i), testkit.Pattern(size, byte(i)))
	}
	r := s.dial(t)
	ents, err := r.ReadDir("/tree")
	must(t, err)
	for _, e := range ents { // statuses known, as a kernel's lookups make them
		_, err := r.Stat("/tree/" + e.Name)
		must(t, err)
	}
	if got := r.Client().Stats().BytesFetched; got != 0 {
		t.Fatalf("fetched %d bytes before reading", got)
	}
	for i, e := range ents[:3] {
		wantFile(t, r, "/tree/"+e.Name, testkit.Pattern(size, byte(i)))
	}
	waitFor(t, 5*time.Second, func() bool { return r.Client().Stats().BytesFetched > 3*size }, func() string {
		return fmt.Sprintf("fetched %d bytes reading 3 files of %d in order: no read-ahead", r.Client().Stats().BytesFetched, size)
	})
	for i, e := range ents[3:] {
		wantFile(t, r, "/tree/"+e.Name, testkit.Pattern(size, byte(3+i)))
	}
	if got := r.Client().Stats().BytesFetched; got != n*size {
		t.Fatalf("fetched %d bytes for %d files of %d: read-ahead fetched twice", got, n, size)
	}
}
