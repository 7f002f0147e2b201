package pathfs_test

import (
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
	"github.com/hoardfs/hoard/node"
)

// Directories, symlinks, hard links, attributes and renames, each seen by
// a second client.
func TestNamespace(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t)
	b := s.Dial(t, servertest.MemCache())

	testkit.Must(t, a.Mkdir("/d", 0o755))
	testkit.WriteFile(t, a, "/d/target", []byte("through the link"))
	testkit.Must(t, a.Symlink("d/target", "/link"))
	if tgt, err := b.Readlink("/link"); err != nil || tgt != "d/target" {
		t.Fatalf("readlink: %q %v", tgt, err)
	}
	testkit.WantFile(t, b, "/link", []byte("through the link"))
	if st, err := b.Lstat("/link"); err != nil || st.Type != node.TypeSymlink {
		t.Fatalf("lstat: %+v %v", st, err)
	}
	if st, err := b.Stat("/link"); err != nil || st.Type != node.TypeFile {
		t.Fatalf("stat through a link: %+v %v", st, err)
	}
	// A link in the middle of a path, and one that climbs with "..".
	testkit.Must(t, a.Symlink("d", "/dl"))
	testkit.WantFile(t, b, "/dl/target", []byte("through the link"))
	testkit.Must(t, a.Mkdir("/d/sub", 0o755))
	testkit.Must(t, a.Symlink("../target", "/d/sub/up"))
	testkit.WantFile(t, b, "/d/sub/up", []byte("through the link"))
	// An absolute link points outside hoard.
	testkit.Must(t, a.Symlink("/etc/passwd", "/abs"))
	testkit.WantErrno(t, "open of an absolute link", func() error { _, err := b.Open("/abs", os.O_RDONLY, 0); return err }(), syscall.ENOENT)
	// O_CREATE through a link opens its target; a directory is no file.
	h, err := b.Open("/link", os.O_CREATE|os.O_RDONLY, 0o644)
	testkit.Must(t, err)
	testkit.Must(t, h.Close())
	_, err = b.Open("/d", os.O_CREATE|os.O_WRONLY, 0o644)
	testkit.WantErrno(t, "O_CREATE of a directory", err, syscall.EISDIR)
	_, err = b.Open("/d", os.O_RDONLY, 0)
	testkit.WantErrno(t, "open of a directory", err, syscall.EISDIR)
	_, err = b.Open("/link", os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	testkit.WantErrno(t, "O_EXCL of a link", err, syscall.EEXIST)
	_, err = b.Readlink("/d/target")
	testkit.WantErrno(t, "readlink of a file", err, syscall.EINVAL)
	testkit.Must(t, a.Symlink("loop2", "/loop1"))
	testkit.Must(t, a.Symlink("loop1", "/loop2"))
	_, err = b.Stat("/loop1")
	testkit.WantErrno(t, "a symlink loop", err, syscall.ELOOP)
	testkit.WantErrno(t, "symlink over a name", a.Symlink("x", "/link"), syscall.EEXIST)

	// Hard links.
	testkit.Must(t, a.Link("/d/target", "/hard"))
	if st, err := b.Stat("/hard"); err != nil || st.Nlink != 2 {
		t.Fatalf("nlink after link: %+v %v", st, err)
	}
	testkit.WriteFile(t, a, "/hard", []byte("changed via the other name"))
	testkit.WantFile(t, b, "/d/target", []byte("changed via the other name"))
	testkit.WantErrno(t, "hard link to a directory", a.Link("/d", "/dirlink"), syscall.EPERM)
	testkit.WantErrno(t, "link of a missing file", a.Link("/none", "/x"), syscall.ENOENT)
	testkit.WantErrno(t, "link into a missing directory", a.Link("/hard", "/none/x"), syscall.ENOENT)
	testkit.WantErrno(t, "link over a name", a.Link("/hard", "/link"), syscall.EEXIST)

	// Attributes.
	testkit.Must(t, a.Chmod("/hard", 0o600|os.ModeSetuid|os.ModeSetgid|os.ModeSticky))
	if st, _ := b.Stat("/hard"); st.Mode&0o7777 != 0o7600 {
		t.Fatalf("mode with setuid, setgid, sticky: %o", st.Mode)
	}
	testkit.Must(t, a.Chmod("/hard", 0o600))
	mt := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	testkit.Must(t, a.Chtimes("/hard", mt, mt))
	testkit.Must(t, a.Chown("/hard", 1234, 5678))
	testkit.Must(t, a.Chown("/hard", -1, -1)) // nothing to change
	testkit.Must(t, a.Chown("/hard", -1, 42))
	st, err := b.Stat("/d/target")
	if err != nil || st.Mode&0o7777 != 0o600 || !st.Mtime.Equal(mt) || !st.Atime.Equal(mt) || st.UID != 1234 || st.GID != 42 {
		t.Fatalf("attributes: %+v %v", st, err)
	}
	testkit.WantErrno(t, "chmod of a missing file", a.Chmod("/none", 0o600), syscall.ENOENT)

	// Rename over a file, of a directory, and the rules.
	testkit.WriteFile(t, a, "/d/other", []byte("other"))
	testkit.Must(t, a.Rename("/d/other", "/hard"))
	testkit.WantFile(t, b, "/hard", []byte("other"))
	if st, _ := b.Stat("/d/target"); st.Nlink != 1 {
		t.Fatalf("the replaced name still counted: nlink %d", st.Nlink)
	}
	testkit.Must(t, a.Mkdir("/e", 0o755))
	testkit.Must(t, a.Rename("/d", "/e/d"))
	testkit.WantFile(t, b, "/e/d/target", []byte("changed via the other name"))
	testkit.WantErrno(t, "a directory into itself", a.Rename("/e", "/e/d/inside"), syscall.EINVAL)
	testkit.WantErrno(t, "rename of a missing name", a.Rename("/none", "/x"), syscall.ENOENT)
	testkit.WantErrno(t, "rename into a missing directory", a.Rename("/hard", "/none/x"), syscall.ENOENT)
	testkit.WantErrno(t, "rename of the root", a.Rename("/", "/x"), syscall.EINVAL)
	testkit.WantErrno(t, "remove of a non-empty directory", a.Remove("/e"), syscall.ENOTEMPTY)
	testkit.WantErrno(t, "mkdir over a directory", a.Mkdir("/e", 0o755), syscall.EEXIST)
	testkit.WantErrno(t, "mkdir in a missing directory", a.Mkdir("/none/x", 0o755), syscall.ENOENT)
	ents, err := b.ReadDir("/e/d")
	if err != nil || len(ents) != 2 || ents[0].Name != "sub" && ents[1].Name != "sub" {
		t.Fatalf("readdir: %+v %v", ents, err)
	}
	_, err = b.ReadDir("/hard")
	testkit.WantErrno(t, "readdir of a file", err, syscall.ENOTDIR)
	_, err = b.ReadDir("/none")
	testkit.WantErrno(t, "readdir of a missing directory", err, syscall.ENOENT)
	_, err = b.Stat("/hard/x")
	testkit.WantErrno(t, "a file in the middle of a path", err, syscall.ENOTDIR)
	_, err = b.Open("/hard/x", os.O_CREATE|os.O_RDWR, 0o644)
	testkit.WantErrno(t, "create under a file", err, syscall.ENOTDIR)

	// Remove: a file, a symlink, an empty directory.
	testkit.Must(t, a.Remove("/hard"))
	testkit.Must(t, a.Remove("/link"))
	testkit.Must(t, a.Remove("/e/d/sub/up"))
	testkit.Must(t, a.Remove("/e/d/sub"))
	testkit.WantErrno(t, "remove of a missing name", a.Remove("/hard"), syscall.ENOENT)
	testkit.WantErrno(t, "remove of the root", a.Remove("/"), syscall.EINVAL)
	_, err = b.Stat("/hard")
	testkit.WantErrno(t, "stat of a removed file", err, syscall.ENOENT)
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
	s := servertest.Start(t)
	a := s.Dial(t)
	long := strings.Repeat("x", 256)
	_, err := a.Open("/"+long, os.O_CREATE|os.O_RDWR, 0o644)
	testkit.WantErrno(t, "create of a long name", err, syscall.ENAMETOOLONG)
	testkit.WantErrno(t, "mkdir of a long name", a.Mkdir("/"+long, 0o755), syscall.ENAMETOOLONG)
	_, err = a.Stat("/" + long)
	testkit.WantErrno(t, "stat of a long name", err, syscall.ENAMETOOLONG)
	_, err = a.Open("/a\x00b", os.O_CREATE|os.O_RDWR, 0o644)
	testkit.WantErrno(t, "a name with NUL", err, syscall.EINVAL)
	testkit.WantErrno(t, "mkdir of the root", a.Mkdir("/", 0o755), syscall.EINVAL)
	testkit.WriteFile(t, a, "/ok", []byte("ok"))
	testkit.WantErrno(t, "rename to a long name", a.Rename("/ok", "/"+long), syscall.ENAMETOOLONG)
	testkit.WantErrno(t, "link to a long name", a.Link("/ok", "/"+long), syscall.ENAMETOOLONG)
	testkit.WantErrno(t, "symlink to a long name", a.Symlink("ok", "/"+long), syscall.ENAMETOOLONG)
	testkit.WantFile(t, a, "/../../ok", []byte("ok"))
	testkit.WantFile(t, a, "ok", []byte("ok"))
	testkit.WriteFile(t, a, "/"+strings.Repeat("y", 255), []byte("longest"))
	testkit.WantFile(t, a, "/"+strings.Repeat("y", 255), []byte("longest"))
}

// Volumes: created, listed, mounted into the tree, crossed by paths, and
// StatFS reports the server's space.
func TestVolumes(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t)
	b := s.Dial(t, servertest.MemCache())
	v, err := a.Admin().CreateVolume("proj")
	if err != nil || v.Name != "proj" || v.ID == 0 || v.Root.IsZero() || v.Created.IsZero() {
		t.Fatalf("create volume: %+v %v", v, err)
	}
	_, err = a.Admin().CreateVolume("proj")
	testkit.WantErrno(t, "a volume's name twice", err, syscall.EEXIST)
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
	testkit.Must(t, a.Admin().MountVolume("/proj", "proj"))
	testkit.WantErrno(t, "mount over a name", a.Admin().MountVolume("/proj", "proj"), syscall.EEXIST)
	testkit.WriteFile(t, a, "/proj/inside", []byte("in the volume"))
	testkit.Must(t, a.Mkdir("/proj/sub", 0o755))
	testkit.WriteFile(t, a, "/proj/sub/deep", []byte("deep"))
	testkit.WantFile(t, b, "/proj/inside", []byte("in the volume"))
	testkit.WantFile(t, b, "/proj/sub/deep", []byte("deep"))
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
	testkit.WantErrno(t, "mount of a missing volume", a.Admin().MountVolume("/ghost", "no-such-volume"), syscall.ENOENT)
	fs, err := b.StatFS()
	if err != nil || fs.Blocks == 0 || fs.BlockSize == 0 {
		t.Fatalf("statfs: %+v %v", fs, err)
	}
	// A rename across volumes is refused.
	testkit.WantErrno(t, "rename across volumes", a.Rename("/proj/inside", "/outside"), syscall.EXDEV)
	// A mount point is removed as a name; the volume stays.
	testkit.Must(t, a.Remove("/proj"))
	_, err = b.Stat("/proj/inside")
	testkit.WantErrno(t, "a path through a removed mount point", err, syscall.ENOENT)
	testkit.Must(t, a.Admin().MountVolume("/again", "proj"))
	testkit.WantFile(t, b, "/again/sub/deep", []byte("deep"))
}

// Edge cases of the namespace calls, as a local file system answers them.
func TestNamespaceEdges(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t)
	b := s.Dial(t, servertest.MemCache())
	testkit.WriteFile(t, a, "/f", []byte("data"))
	testkit.Must(t, a.Mkdir("/d", 0o755))
	testkit.Must(t, a.Mkdir("/e", 0o755))
	testkit.WriteFile(t, a, "/e/x", []byte("x"))
	testkit.Must(t, a.Rename("/f", "/f")) // to itself: nothing happens
	testkit.WantFile(t, b, "/f", []byte("data"))
	testkit.WantErrno(t, "rename of a file over a directory", a.Rename("/f", "/d"), syscall.EISDIR)
	testkit.WantErrno(t, "rename of a directory over a file", a.Rename("/d", "/f"), syscall.ENOTDIR)
	testkit.Must(t, a.Rename("/e", "/d")) // over an empty directory
	testkit.WantFile(t, b, "/d/x", []byte("x"))
	_, err := b.Stat("/e")
	testkit.WantErrno(t, "the old name of a renamed directory", err, syscall.ENOENT)
	testkit.WantErrno(t, "symlink with an empty target", a.Symlink("", "/s"), syscall.EINVAL)
	_, err = a.Readlink("/nope")
	testkit.WantErrno(t, "readlink of a missing name", err, syscall.ENOENT)
	testkit.WantErrno(t, "truncate of a directory", a.Truncate("/d", 0), syscall.EISDIR)
	testkit.WantErrno(t, "truncate past the largest file", a.Truncate("/f", 1<<50), syscall.EFBIG)

	// A write past the end after a seek leaves zeros between.
	g, err := a.Open("/f", os.O_RDWR, 0)
	testkit.Must(t, err)
	_, err = g.Seek(10, io.SeekStart)
	testkit.Must(t, err)
	_, err = g.Write([]byte("Z"))
	testkit.Must(t, err)
	if n, err := g.Read(make([]byte, 4)); n != 0 || err != io.EOF {
		t.Fatalf("read at the end: %d %v", n, err)
	}
	testkit.Must(t, g.Close())
	testkit.WantFile(t, b, "/f", []byte("data\x00\x00\x00\x00\x00\x00Z"))

	// Renaming a hard link onto the file's other name changes nothing.
	testkit.WriteFile(t, a, "/h", []byte("hh"))
	testkit.Must(t, a.Link("/h", "/h2"))
	testkit.Must(t, a.Rename("/h", "/h2"))
	if st, err := b.Stat("/h"); err != nil || st.Nlink != 2 {
		t.Fatalf("after renaming a link onto its other name: %+v %v", st, err)
	}
	// Attribute changes and truncation by name follow a symlink.
	testkit.Must(t, a.Symlink("h2", "/sl"))
	testkit.Must(t, a.Chmod("/sl", 0o611))
	testkit.Must(t, a.Truncate("/sl", 1))
	if st, err := b.Stat("/h2"); err != nil || st.Mode&0o777 != 0o611 || st.Size != 1 {
		t.Fatalf("through a symlink: %+v %v", st, err)
	}
	if st, err := b.Lstat("/sl"); err != nil || st.Type != node.TypeSymlink || st.Target != "h2" {
		t.Fatalf("the symlink itself: %+v %v", st, err)
	}
	// O_CREATE of a new file opened read-only creates it.
	n, err := a.Open("/newro", os.O_RDONLY|os.O_CREATE, 0o644)
	testkit.Must(t, err)
	testkit.Must(t, n.Close())
	if st, err := b.Stat("/newro"); err != nil || st.Size != 0 {
		t.Fatalf("a file created read-only: %+v %v", st, err)
	}
	// A trailing slash names the directory.
	testkit.Must(t, a.Mkdir("/t/", 0o755))
	if st, err := b.Stat("/t/"); err != nil || st.Type != node.TypeDir {
		t.Fatalf("a directory made with a trailing slash: %+v %v", st, err)
	}
}
