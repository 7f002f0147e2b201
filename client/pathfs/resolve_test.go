package pathfs_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
	"github.com/hoardfs/hoard/node"
)

func TestMain(m *testing.M) { servertest.Main(m) }

// dial starts a server and dials one client to it.
func dial(t *testing.T) *pathfs.FS {
	t.Helper()
	return servertest.Start(t).Dial(t, servertest.MemCache())
}

// stat is fs.Stat of name (or Lstat, without follow), failing the test
// on error.
func stat(t *testing.T, fs *pathfs.FS, name string, follow bool) node.Status {
	t.Helper()
	get := fs.Lstat
	if follow {
		get = fs.Stat
	}
	st, err := get(name)
	testkit.Must(t, err)
	return st
}

// chain makes the symlinks dir/name1 -> name2 -> ... -> nameN -> target.
func chain(t *testing.T, fs *pathfs.FS, dir, name string, n int, target string) {
	t.Helper()
	for i := 1; i <= n; i++ {
		to := fmt.Sprintf("%s%d", name, i+1)
		if i == n {
			to = target
		}
		testkit.Must(t, fs.Symlink(to, fmt.Sprintf("%s/%s%d", dir, name, i)))
	}
}

// One path resolution follows at most 40 symlinks, as Linux's: counted
// over the whole path, in its middle and at its end alike; the 41st is
// ELOOP, and so is a link to itself. Lstat of a final link follows none.
func TestSymlinkHops(t *testing.T) {
	fs := dial(t)
	testkit.WriteFile(t, fs, "/f", []byte("end"))
	testkit.Must(t, fs.Mkdir("/d", 0o755))
	chain(t, fs, "", "a", 20, "d")                   // /a1: 20 hops to /d
	chain(t, fs, "/d", "b", 21, "../f")              // /d/b1: 21 hops to /f
	testkit.WantFile(t, fs, "/d/b2", []byte("end"))  // 20 hops
	testkit.WantFile(t, fs, "/a1/b2", []byte("end")) // 20 + 20
	testkit.WantFile(t, fs, "/a2/b1", []byte("end")) // 19 + 21
	_, err := fs.Stat("/a1/b1")                      // 20 + 21
	testkit.WantErrno(t, "stat after 41 links", err, syscall.ELOOP)
	_, err = fs.Open("/a1/b1", os.O_RDONLY, 0)
	testkit.WantErrno(t, "open after 41 links", err, syscall.ELOOP)
	_, err = fs.ReadDir("/a1/b1")
	testkit.WantErrno(t, "readdir after 41 links", err, syscall.ELOOP)
	if st := stat(t, fs, "/a1/b1", false); st.Type != node.TypeSymlink || st.Target != "b2" {
		t.Fatalf("lstat after 20 links in the middle: %+v, want the link to b2", st)
	}

	testkit.Must(t, fs.Symlink("self", "/self"))
	_, err = fs.Stat("/self")
	testkit.WantErrno(t, "a link to itself", err, syscall.ELOOP)
	_, err = fs.Stat("/self/x")
	testkit.WantErrno(t, "a link to itself in the middle", err, syscall.ELOOP)
	if st := stat(t, fs, "/self", false); st.Type != node.TypeSymlink {
		t.Fatalf("lstat of a link to itself: %+v", st)
	}
}

// A relative symlink in the middle of a path is followed from the
// directory that holds it, not from the root, and the rest of the path
// is looked up in what it names.
func TestSymlinkInMiddle(t *testing.T) {
	fs := dial(t)
	for _, d := range []string{"/a", "/a/sub", "/a/b", "/sub"} {
		testkit.Must(t, fs.Mkdir(d, 0o755))
	}
	testkit.WriteFile(t, fs, "/a/sub/f", []byte("a's"))
	testkit.WriteFile(t, fs, "/sub/f", []byte("the root's"))
	testkit.Must(t, fs.Symlink("sub", "/a/l"))
	testkit.Must(t, fs.Symlink("l", "/a/ll"))
	testkit.Must(t, fs.Symlink("../sub", "/a/b/up"))
	testkit.Must(t, fs.Symlink("../../sub", "/a/b/top"))
	testkit.Must(t, fs.Symlink("a/sub", "/m"))
	for name, want := range map[string]string{
		"/a/l/f":     "a's",        // beside the link, not at the root
		"/a/ll/f":    "a's",        // a link to a link
		"/a/b/up/f":  "a's",        // ".." from the link's directory
		"/a/b/top/f": "the root's", // and up to the root
		"/m/f":       "a's",        // a target of two names
	} {
		testkit.WantFile(t, fs, name, []byte(want))
	}
	if got, want := testkit.Names(t, fs, "/a/b/up"), []string{"f"}; !slices.Equal(got, want) {
		t.Fatalf("readdir through a link: %v, want %v", got, want)
	}
	// What is made through a link is made where the link points.
	testkit.WriteFile(t, fs, "/a/l/new", []byte("new"))
	testkit.WantFile(t, fs, "/a/sub/new", []byte("new"))
	_, err := fs.Stat("/sub/new")
	testkit.WantErrno(t, "the root's directory of the same name", err, syscall.ENOENT)
}

// An absolute symlink points outside hoard: following it, at the end of
// a path or in its middle, is ENOENT for the op and the path asked, and
// resolution's own error names the link, where it is, and its target.
// The link itself is there for Lstat and Readlink.
func TestAbsoluteSymlink(t *testing.T) {
	fs := dial(t)
	testkit.Must(t, fs.Mkdir("/d", 0o755))
	testkit.Must(t, fs.Symlink("/etc", "/d/abs"))
	testkit.Must(t, fs.Symlink("d", "/dl"))
	for _, name := range []string{"/d/abs", "/d/abs/passwd", "/dl/abs/passwd"} {
		_, err := fs.Stat(name)
		var pe *os.PathError
		if !errors.Is(err, syscall.ENOENT) || !errors.As(err, &pe) || pe.Op != "stat" || pe.Path != name {
			t.Fatalf("stat of %s: %v, want ENOENT for stat %s", name, err, name)
		}
		if want := "stat " + name + ": symlink /d/abs points to /etc, outside hoard: no such file or directory"; err.Error() != want {
			t.Fatalf("stat of %s: %q, want %q", name, err, want)
		}
		_, err = fs.CacheInfo(name)
		testkit.WantErrno(t, "cache info of "+name, err, syscall.ENOENT)
		if want := "symlink /d/abs points to /etc, outside hoard"; !strings.Contains(fmt.Sprint(err), want) {
			t.Fatalf("cache info of %s: %v, want it to say %q", name, err, want)
		}
	}
	_, err := fs.Open("/dl/abs", os.O_RDONLY, 0)
	testkit.WantErrno(t, "open of an absolute link", err, syscall.ENOENT)
	if st := stat(t, fs, "/dl/abs", false); st.Type != node.TypeSymlink || st.Target != "/etc" {
		t.Fatalf("lstat of an absolute link: %+v", st)
	}
	if target, err := fs.Readlink("/dl/abs"); err != nil || target != "/etc" {
		t.Fatalf("readlink of an absolute link: %q %v", target, err)
	}
}

// ".." cannot climb above the root: a path is cleaned lexically first
// (so a name before ".." need not exist), and a link whose target
// climbs past the root stops there too.
func TestDotDotStopsAtRoot(t *testing.T) {
	fs := dial(t)
	testkit.WriteFile(t, fs, "/f", []byte("top"))
	testkit.Must(t, fs.Mkdir("/d", 0o755))
	testkit.Must(t, fs.Symlink("../../../f", "/d/up"))
	for _, name := range []string{"/../f", "/../../f", "../f", "/none/../f", "/d/../../f", "/d/up"} {
		testkit.WantFile(t, fs, name, []byte("top"))
	}
	root := stat(t, fs, "/", true)
	for _, name := range []string{"/..", "..", "/d/../.."} {
		if st := stat(t, fs, name, true); st.FID != root.FID {
			t.Fatalf("stat of %s: %v, want the root %v", name, st.FID, root.FID)
		}
	}
	if got, want := testkit.Names(t, fs, "/.."), []string{"d", "f"}; !slices.Equal(got, want) {
		t.Fatalf("readdir of /..: %v, want the root's %v", got, want)
	}
}

// A file where a directory is needed, in the middle of a path (named or
// reached through a link), is ENOTDIR for lookups and changes alike; a
// missing directory is ENOENT.
func TestFileInMiddleOfPath(t *testing.T) {
	fs := dial(t)
	testkit.WriteFile(t, fs, "/f", []byte("file"))
	testkit.Must(t, fs.Symlink("f", "/lf"))
	for _, name := range []string{"/f/x", "/f/x/y", "/lf/x"} {
		_, err := fs.Stat(name)
		testkit.WantErrno(t, "stat of "+name, err, syscall.ENOTDIR)
		_, err = fs.Lstat(name)
		testkit.WantErrno(t, "lstat of "+name, err, syscall.ENOTDIR)
		_, err = fs.Open(name, os.O_RDONLY, 0)
		testkit.WantErrno(t, "open of "+name, err, syscall.ENOTDIR)
		_, err = fs.Open(name, os.O_RDWR|os.O_CREATE, 0o644)
		testkit.WantErrno(t, "create of "+name, err, syscall.ENOTDIR)
		testkit.WantErrno(t, "mkdir of "+name, fs.Mkdir(name, 0o755), syscall.ENOTDIR)
		testkit.WantErrno(t, "symlink at "+name, fs.Symlink("f", name), syscall.ENOTDIR)
		testkit.WantErrno(t, "remove of "+name, fs.Remove(name), syscall.ENOTDIR)
		testkit.WantErrno(t, "rename to "+name, fs.Rename("/lf", name), syscall.ENOTDIR)
	}
	_, err := fs.ReadDir("/lf")
	testkit.WantErrno(t, "readdir of a link to a file", err, syscall.ENOTDIR)
	_, err = fs.Stat("/none/x")
	testkit.WantErrno(t, "a missing directory in the middle", err, syscall.ENOENT)
	testkit.WantFile(t, fs, "/f", []byte("file"))
}

// Lstat does not follow a final symlink, Stat does; both follow one in
// the middle of the path. Readlink reads the link Lstat sees.
func TestLstatAndStat(t *testing.T) {
	fs := dial(t)
	testkit.Must(t, fs.Mkdir("/d", 0o755))
	testkit.WriteFile(t, fs, "/d/f", []byte("12345"))
	testkit.Must(t, fs.Symlink("f", "/d/l"))
	testkit.Must(t, fs.Symlink("d", "/dl"))
	testkit.Must(t, fs.Symlink("dl/l", "/l2"))
	file := stat(t, fs, "/d/f", false)
	for name, target := range map[string]string{"/d/l": "f", "/dl/l": "f", "/l2": "dl/l"} {
		if st := stat(t, fs, name, false); st.Type != node.TypeSymlink || st.Target != target || st.FID == file.FID {
			t.Fatalf("lstat of %s: %+v, want the link to %s", name, st, target)
		}
		if st := stat(t, fs, name, true); st.Type != node.TypeFile || st.FID != file.FID || st.Size != 5 {
			t.Fatalf("stat of %s: %+v, want the file %v", name, st, file.FID)
		}
		if got, err := fs.Readlink(name); err != nil || got != target {
			t.Fatalf("readlink of %s: %q %v, want %q", name, got, err, target)
		}
	}
	if st := stat(t, fs, "/dl", false); st.Type != node.TypeSymlink {
		t.Fatalf("lstat of a link to a directory: %+v", st)
	}
	if st := stat(t, fs, "/dl", true); st.Type != node.TypeDir {
		t.Fatalf("stat of a link to a directory: %+v", st)
	}
}

// The root has no parent: a change that would make, remove or rename
// the root by name is EINVAL however the path spells the root, and
// changes nothing; the root itself is there to look up.
func TestRootHasNoParent(t *testing.T) {
	fs := dial(t)
	testkit.WriteFile(t, fs, "/f", []byte("kept"))
	testkit.Must(t, fs.Mkdir("/d", 0o755))
	root := stat(t, fs, "/", true)
	for _, name := range []string{"/", "", ".", "/..", "/d/..", "//"} {
		testkit.WantErrno(t, "mkdir of "+name, fs.Mkdir(name, 0o755), syscall.EINVAL)
		testkit.WantErrno(t, "symlink at "+name, fs.Symlink("f", name), syscall.EINVAL)
		testkit.WantErrno(t, "link at "+name, fs.Link("/f", name), syscall.EINVAL)
		testkit.WantErrno(t, "rename of "+name, fs.Rename(name, "/x"), syscall.EINVAL)
		testkit.WantErrno(t, "rename to "+name, fs.Rename("/f", name), syscall.EINVAL)
		testkit.WantErrno(t, "remove of "+name, fs.Remove(name), syscall.EINVAL)
		testkit.WantErrno(t, "mount at "+name, fs.Admin().MountVolume(name, "root"), syscall.EINVAL)
		_, err := fs.Open(name, os.O_RDWR|os.O_CREATE, 0o644)
		testkit.WantErrno(t, "create of "+name, err, syscall.EINVAL)
		if st := stat(t, fs, name, false); st.FID != root.FID || st.Type != node.TypeDir {
			t.Fatalf("lstat of %s: %+v, want the root %v", name, st, root.FID)
		}
	}
	if got, want := testkit.Names(t, fs, "/"), []string{"d", "f"}; !slices.Equal(got, want) {
		t.Fatalf("the root lists %v, want %v", got, want)
	}
	testkit.WantFile(t, fs, "/f", []byte("kept"))
	if err, want := fs.Mkdir("/", 0o755), "mkdir /: the root has no parent: invalid argument"; err == nil || err.Error() != want {
		t.Fatalf("mkdir of the root: %v, want %q", err, want)
	}
}
