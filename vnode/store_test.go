package vnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/internal/fsx"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/node"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func root(t *testing.T, s *Store) node.FID {
	t.Helper()
	v, err := s.VolumeByName(node.RootVolume)
	if err != nil {
		t.Fatal(err)
	}
	return v.Root
}

func mustCreate(t *testing.T, s *Store, dir node.FID, name string, typ node.Type) node.Status {
	t.Helper()
	st, _, created, err := s.Create(dir, name, typ, node.Attr{Mode: 0o644}, "", true, "")
	if err != nil || !created {
		t.Fatalf("create %s: %v created=%v", name, err, created)
	}
	return st
}

func write(t *testing.T, s *Store, f node.FID, off int64, data []byte) node.Status {
	t.Helper()
	u, err := s.BeginUpdate(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := u.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	st, err := u.Commit(true, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func read(t *testing.T, s *Store, f node.FID) []byte {
	t.Helper()
	st, err := s.GetStatus(f)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, st.Size)
	n, _, err := s.ReadAt(f, p, 0)
	if err != nil && !(err == io.EOF && st.Size == 0) {
		t.Fatal(err)
	}
	return p[:n]
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got error %v, want %v", err, want)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o600)
	if _, err := Open(file); err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("open on a file: %v", err)
	}
	if _, err := Open(filepath.Join(dir, "no", "such")); err == nil || !strings.Contains(err.Error(), "no/such") {
		t.Fatalf("open under a missing parent: %v", err)
	}
	s := open(t, filepath.Join(dir, "d"))
	if _, err := Open(s.Dir()); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open: %v", err)
	}
}

func TestEpochAndRootVolume(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	e1 := s.Epoch()
	vs, err := s.Volumes()
	if err != nil || len(vs) != 1 || vs[0].Name != node.RootVolume {
		t.Fatalf("volumes %v %v", vs, err)
	}
	s.Close()
	s2 := open(t, dir)
	if s2.Epoch() <= e1 {
		t.Fatalf("epoch did not advance: %d then %d", e1, s2.Epoch())
	}
	vs, _ = s2.Volumes()
	if len(vs) != 1 {
		t.Fatalf("root volume created twice: %v", vs)
	}
}

func TestVolumes(t *testing.T) {
	s := open(t, t.TempDir())
	v, err := s.CreateVolume("proj")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume("proj"); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("duplicate volume: %v", err)
	}
	for _, bad := range []string{"", "a/b", "..", ".x", strings.Repeat("v", 65)} {
		if _, err := s.CreateVolume(bad); err == nil {
			t.Fatalf("volume %q accepted", bad)
		}
	}
	got, err := s.VolumeByID(v.ID)
	if err != nil || got.Name != "proj" || got.Root.Volume != v.ID {
		t.Fatalf("by id: %+v %v", got, err)
	}
	if _, err := s.VolumeByName("nope"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("missing volume: %v", err)
	}
	r := root(t, s)
	mp, _, _, err := s.Create(r, "proj", node.TypeMountPoint, node.Attr{Mode: 0o755}, "proj", true, "")
	if err != nil || mp.Type != node.TypeMountPoint || mp.Target != "proj" {
		t.Fatalf("mount point: %+v %v", mp, err)
	}
	// Files in the new volume are separate from root's.
	f := mustCreate(t, s, v.Root, "x", node.TypeFile)
	if f.FID.Volume != v.ID {
		t.Fatalf("fid %v not in volume %d", f.FID, v.ID)
	}
	if _, _, err := s.Link(r, "x", f.FID, ""); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("cross-volume link: %v", err)
	}
	if _, err := s.Rename(v.Root, "x", r, "x", "", ""); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("cross-volume rename: %v", err)
	}
}

func TestBadNames(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	for name, want := range map[string]syscall.Errno{
		"":                       syscall.EINVAL,
		".":                      syscall.EINVAL,
		"..":                     syscall.EINVAL,
		"a/b":                    syscall.EINVAL,
		"a\x00b":                 syscall.EINVAL,
		strings.Repeat("n", 256): syscall.ENAMETOOLONG,
	} {
		_, _, _, err := s.Create(r, name, node.TypeFile, node.Attr{}, "", true, "")
		wantErrno(t, err, want)
		_, _, err = s.Lookup(r, name)
		wantErrno(t, err, want)
		_, err = s.Rename(r, "x", r, name, "", "")
		wantErrno(t, err, want)
	}
	mustCreate(t, s, r, strings.Repeat("n", 255), node.TypeFile)
}

func TestCreateLookupRemove(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	d0, _ := s.GetStatus(r)
	st, d, created, err := s.Create(r, "f", node.TypeFile, node.Attr{Mode: 0o640, UID: 7, GID: 8}, "", true, "")
	if err != nil || !created || st.Mode != 0o640 || st.UID != 7 || st.GID != 8 || st.Nlink != 1 || st.Type != node.TypeFile {
		t.Fatalf("create: %+v %v", st, err)
	}
	if d.DataVersion <= d0.DataVersion {
		t.Fatalf("directory version did not advance: %d -> %d", d0.DataVersion, d.DataVersion)
	}
	// O_CREAT without O_EXCL returns the existing file.
	again, _, created, err := s.Create(r, "f", node.TypeFile, node.Attr{}, "", false, "")
	if err != nil || created || again.FID != st.FID {
		t.Fatalf("non-exclusive create: %+v created=%v %v", again, created, err)
	}
	_, _, _, err = s.Create(r, "f", node.TypeFile, node.Attr{}, "", true, "")
	wantErrno(t, err, syscall.EEXIST)
	_, _, _, err = s.Create(r, "f", node.TypeDir, node.Attr{}, "", false, "")
	wantErrno(t, err, syscall.EEXIST)
	got, _, err := s.Lookup(r, "f")
	if err != nil || got.FID != st.FID {
		t.Fatalf("lookup: %+v %v", got, err)
	}
	_, _, err = s.Remove(r, "f", true, "")
	wantErrno(t, err, syscall.ENOTDIR)
	_, gone, err := s.Remove(r, "f", false, "")
	if err != nil || gone.Nlink != 0 {
		t.Fatalf("remove: %+v %v", gone, err)
	}
	_, _, err = s.Lookup(r, "f")
	wantErrno(t, err, syscall.ENOENT)
	_, err = s.GetStatus(st.FID)
	wantErrno(t, err, syscall.ESTALE)
	// A new file never gets the old FID.
	st2 := mustCreate(t, s, r, "f", node.TypeFile)
	if st2.FID == st.FID {
		t.Fatalf("FID reused: %v", st.FID)
	}
	_, err = s.GetStatus(node.FID{Volume: st2.FID.Volume, Vnode: st2.FID.Vnode, Unique: st2.FID.Unique + 1})
	wantErrno(t, err, syscall.ESTALE)
}

func TestDirectories(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	d := mustCreate(t, s, r, "d", node.TypeDir)
	if d.Nlink != 2 {
		t.Fatalf("new dir nlink %d", d.Nlink)
	}
	rs, _ := s.GetStatus(r)
	if rs.Nlink != 3 {
		t.Fatalf("parent nlink %d after mkdir", rs.Nlink)
	}
	mustCreate(t, s, d.FID, "inner", node.TypeFile)
	_, _, err := s.Remove(r, "d", true, "")
	wantErrno(t, err, syscall.ENOTEMPTY)
	_, _, err = s.Remove(r, "d", false, "")
	wantErrno(t, err, syscall.EISDIR)
	if _, _, err := s.Remove(d.FID, "inner", false, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Remove(r, "d", true, ""); err != nil {
		t.Fatal(err)
	}
	rs, _ = s.GetStatus(r)
	if rs.Nlink != 2 {
		t.Fatalf("parent nlink %d after rmdir", rs.Nlink)
	}
	_, _, err = s.Lookup(d.FID, "x")
	wantErrno(t, err, syscall.ESTALE)
	f := mustCreate(t, s, r, "file", node.TypeFile)
	_, _, err = s.Lookup(f.FID, "x")
	wantErrno(t, err, syscall.ENOTDIR)
}

func TestSymlinkAndLink(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	sl, _, _, err := s.Create(r, "l", node.TypeSymlink, node.Attr{Mode: 0o777}, "../target", true, "")
	if err != nil || sl.Target != "../target" || sl.Size != 9 {
		t.Fatalf("symlink: %+v %v", sl, err)
	}
	_, _, _, err = s.Create(r, "l2", node.TypeSymlink, node.Attr{}, "", true, "")
	wantErrno(t, err, syscall.EINVAL)
	f := mustCreate(t, s, r, "f", node.TypeFile)
	write(t, s, f.FID, 0, []byte("shared"))
	ln, _, err := s.Link(r, "g", f.FID, "")
	if err != nil || ln.Nlink != 2 || ln.FID != f.FID {
		t.Fatalf("link: %+v %v", ln, err)
	}
	d := mustCreate(t, s, r, "d", node.TypeDir)
	_, _, err = s.Link(r, "d2", d.FID, "")
	wantErrno(t, err, syscall.EPERM)
	_, _, err = s.Link(r, "g", f.FID, "")
	wantErrno(t, err, syscall.EEXIST)
	_, st, err := s.Remove(r, "f", false, "")
	if err != nil || st.Nlink != 1 {
		t.Fatalf("remove one link: %+v %v", st, err)
	}
	if got := read(t, s, f.FID); string(got) != "shared" {
		t.Fatalf("data after removing one link: %q", got)
	}
}

func TestRename(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	a := mustCreate(t, s, r, "a", node.TypeDir)
	b := mustCreate(t, s, r, "b", node.TypeDir)
	f := mustCreate(t, s, a.FID, "f", node.TypeFile)
	g := mustCreate(t, s, b.FID, "g", node.TypeFile)
	write(t, s, g.FID, 0, []byte("old"))

	// File across directories, replacing an existing file.
	res, err := s.Rename(a.FID, "f", b.FID, "g", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Replaced == nil || res.Replaced.FID != g.FID || res.Replaced.Nlink != 0 || res.Moved.FID != f.FID {
		t.Fatalf("rename result %+v", res)
	}
	if _, _, err := s.Lookup(a.FID, "f"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("source still there: %v", err)
	}
	if got, _, _ := s.Lookup(b.FID, "g"); got.FID != f.FID {
		t.Fatalf("target names %v, want %v", got.FID, f.FID)
	}
	if _, err := s.GetStatus(g.FID); !errors.Is(err, syscall.ESTALE) {
		t.Fatalf("replaced file still exists: %v", err)
	}

	// Directory moves: nlink bookkeeping and the subtree rule.
	c := mustCreate(t, s, a.FID, "c", node.TypeDir)
	if _, err := s.Rename(r, "a", c.FID, "x", "", ""); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("move into own subtree: %v", err)
	}
	if _, err := s.Rename(r, "a", a.FID, "x", "", ""); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("move into itself: %v", err)
	}
	res, err = s.Rename(a.FID, "c", b.FID, "c", "", "")
	if err != nil || res.SrcDir.Nlink != 2 || res.DstDir.Nlink != 3 {
		t.Fatalf("dir move: %+v %v", res, err)
	}
	// Dir over non-empty dir, dir over file, file over dir.
	mustCreate(t, s, r, "full", node.TypeDir)
	full, _, _ := s.Lookup(r, "full")
	mustCreate(t, s, full.FID, "x", node.TypeFile)
	if _, err := s.Rename(r, "a", r, "full", "", ""); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("over non-empty dir: %v", err)
	}
	mustCreate(t, s, r, "plain", node.TypeFile)
	if _, err := s.Rename(r, "a", r, "plain", "", ""); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("dir over file: %v", err)
	}
	if _, err := s.Rename(r, "plain", r, "a", "", ""); !errors.Is(err, syscall.EISDIR) {
		t.Fatalf("file over dir: %v", err)
	}
	// Dir over empty dir.
	mustCreate(t, s, r, "empty", node.TypeDir)
	rs0, _ := s.GetStatus(r)
	if _, err := s.Rename(r, "a", r, "empty", "", ""); err != nil {
		t.Fatal(err)
	}
	rs1, _ := s.GetStatus(r)
	if rs1.Nlink != rs0.Nlink-1 {
		t.Fatalf("root nlink %d -> %d after replacing a dir", rs0.Nlink, rs1.Nlink)
	}
	// Same-directory rename and rename onto a hard link of itself.
	before, _ := s.GetStatus(r)
	if res, err := s.Rename(r, "plain", r, "plain2", "", ""); err != nil || res.DstDir.DataVersion != before.DataVersion+1 {
		t.Fatalf("same-dir rename must bump the version once: %d -> %d, %v", before.DataVersion, res.DstDir.DataVersion, err)
	}
	p, _, _ := s.Lookup(r, "plain2")
	s.Link(r, "alias", p.FID, "")
	if _, err := s.Rename(r, "plain2", r, "alias", "", ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Lookup(r, "plain2"); err != nil {
		t.Fatalf("rename onto own hard link must do nothing: %v", err)
	}
	if _, err := s.Rename(r, "missing", r, "x", "", ""); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("missing source: %v", err)
	}
}

// A rename given a name to keep the file it replaces under moves that
// file there in the same change; one that fails changes nothing.
func TestRenameKeepsReplaced(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	f := mustCreate(t, s, r, "f", node.TypeFile)
	g := mustCreate(t, s, r, "g", node.TypeFile)
	write(t, s, g.FID, 0, []byte("kept"))
	if _, err := s.Rename(r, "missing", r, "g", ".hidden", ""); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("missing source: %v", err)
	}
	if got, _, err := s.Lookup(r, "g"); err != nil || got.FID != g.FID {
		t.Fatalf("g after a failed rename: %v %v", got.FID, err)
	}
	if _, _, err := s.Lookup(r, ".hidden"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("the kept name after a failed rename: %v", err)
	}
	mustCreate(t, s, r, ".taken", node.TypeFile)
	if _, err := s.Rename(r, "f", r, "g", ".taken", ""); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("keeping under a taken name: %v", err)
	}
	res, err := s.Rename(r, "f", r, "g", ".hidden", "op")
	if err != nil || res.Replaced == nil || res.Replaced.FID != g.FID || res.Replaced.Nlink != 1 || res.Moved.FID != f.FID {
		t.Fatalf("rename keeping g: %+v %v", res, err)
	}
	if got, _, err := s.Lookup(r, ".hidden"); err != nil || got.FID != g.FID {
		t.Fatalf("the kept file: %v %v", got.FID, err)
	}
	if got, _, err := s.Lookup(r, "g"); err != nil || got.FID != f.FID {
		t.Fatalf("g after the rename: %v %v", got.FID, err)
	}
	if again, err := s.Rename(r, "f", r, "g", ".hidden", "op"); err != nil || again.Replaced == nil || again.Replaced.FID != g.FID {
		t.Fatalf("the rename repeated: %+v %v", again, err)
	}
	// A directory is replaced as ever: it is never kept.
	mustCreate(t, s, r, "d", node.TypeDir)
	e := mustCreate(t, s, r, "e", node.TypeDir)
	if res, err := s.Rename(r, "d", r, "e", ".dir", ""); err != nil || res.Replaced == nil || res.Replaced.FID != e.FID || res.Replaced.Nlink != 0 {
		t.Fatalf("a directory over a directory: %+v %v", res, err)
	}
	if _, _, err := s.Lookup(r, ".dir"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("a replaced directory was kept: %v", err)
	}
}

func TestReadDirCookies(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	const n = 2500
	for i := 0; i < n; i++ {
		mustCreate(t, s, r, fmt.Sprintf("f%05d", i), node.TypeFile)
	}
	seen := map[string]bool{}
	var cookie uint64
	pages := 0
	for {
		ents, eof, _, err := s.ReadDir(r, cookie, 300)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, e := range ents {
			if seen[e.Name] {
				t.Fatalf("%s listed twice", e.Name)
			}
			seen[e.Name] = true
			cookie = e.Cookie
		}
		if pages == 2 {
			// Changes mid-listing: removing a listed entry and an unlisted
			// one, and adding one, must not repeat or skip others.
			s.Remove(r, "f00000", false, "")
			s.Remove(r, fmt.Sprintf("f%05d", n-1), false, "")
			mustCreate(t, s, r, "late", node.TypeFile)
		}
		if eof {
			break
		}
	}
	for i := 1; i < n-1; i++ {
		if !seen[fmt.Sprintf("f%05d", i)] {
			t.Fatalf("f%05d skipped", i)
		}
	}
	if !seen["late"] || seen[fmt.Sprintf("f%05d", n-1)] {
		t.Fatalf("late entry seen=%v, removed entry seen=%v", seen["late"], seen[fmt.Sprintf("f%05d", n-1)])
	}
}

func TestDataStores(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	f := mustCreate(t, s, r, "f", node.TypeFile).FID
	dv0, _ := s.GetStatus(f)

	// Whole-file store: staging becomes the data file.
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	st := write(t, s, f, 0, big)
	if st.Size != uint64(len(big)) || st.DataVersion != dv0.DataVersion+1 {
		t.Fatalf("status after store: %+v", st)
	}
	if !bytes.Equal(read(t, s, f), big) {
		t.Fatal("whole-file store read back wrong")
	}
	// Small overwrite in the middle of a big file: applied in place.
	want := append([]byte(nil), big...)
	copy(want[5000:], "HELLO")
	st = write(t, s, f, 5000, []byte("HELLO"))
	if !bytes.Equal(read(t, s, f), want) || st.DataVersion != dv0.DataVersion+2 {
		t.Fatal("in-place store read back wrong")
	}
	// Large overwrite: gap fill and swap.
	patch := bytes.Repeat([]byte{'Z'}, 900<<10)
	copy(want[10:], patch)
	write(t, s, f, 10, patch)
	if !bytes.Equal(read(t, s, f), want) {
		t.Fatal("gap-filled store read back wrong")
	}
	// Truncate down then write past the new end: the bytes in between are zeros.
	u, _ := s.BeginUpdate(f)
	u.Truncate(100)
	u.WriteAt([]byte("tail"), 300)
	if _, err := u.Commit(true, time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	want = append(append(append([]byte(nil), want[:100]...), make([]byte, 200)...), "tail"...)
	if got := read(t, s, f); !bytes.Equal(got, want) {
		t.Fatalf("truncate+write: got %d bytes, want %d (%q...)", len(got), len(want), got[95:110])
	}
	// Truncate down then write far past the old end.
	u, _ = s.BeginUpdate(f)
	u.Truncate(2)
	u.WriteAt([]byte("far"), 2000)
	if _, err := u.Commit(true, time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	farWant := append(append(append([]byte(nil), want[:2]...), make([]byte, 1998)...), "far"...)
	if got := read(t, s, f); !bytes.Equal(got, farWant) {
		t.Fatalf("truncate+far write: got %d bytes, first %q", len(got), got[:8])
	}
	want = farWant
	// Setattr size: extend with zeros, then shrink.
	st, err := s.SetAttr(f, node.Change{Mask: node.SetSize, Size: 3000})
	if err != nil || st.Size != 3000 {
		t.Fatalf("extend: %+v %v", st, err)
	}
	if got := read(t, s, f); !bytes.Equal(got[:len(want)], want) || !bytes.Equal(got[len(want):], make([]byte, 3000-len(want))) {
		t.Fatal("extended file read back wrong")
	}
	st, _ = s.SetAttr(f, node.Change{Mask: node.SetSize | node.SetMode, Size: 2, Mode: 0o600})
	if st.Size != 2 || st.Mode != 0o600 || string(read(t, s, f)) != "01" {
		t.Fatalf("shrink: %+v %q", st, read(t, s, f))
	}
	// Reads past the end, at the end, and of a never-written file.
	if _, _, err := s.ReadAt(f, make([]byte, 4), 2); err != io.EOF {
		t.Fatalf("read at end: %v", err)
	}
	e := mustCreate(t, s, r, "empty", node.TypeFile).FID
	s.SetAttr(e, node.Change{Mask: node.SetSize, Size: 10})
	if got := read(t, s, e); !bytes.Equal(got, make([]byte, 10)) {
		t.Fatalf("sparse file: %q", got)
	}
	// Writes to a directory are refused, stale FIDs too.
	if _, err := s.BeginUpdate(r); !errors.Is(err, syscall.EISDIR) {
		t.Fatalf("write to dir: %v", err)
	}
	// An aborted update changes nothing.
	u, _ = s.BeginUpdate(f)
	u.WriteAt([]byte("xxxxxxxx"), 0)
	u.Abort()
	if string(read(t, s, f)) != "01" {
		t.Fatal("aborted update visible")
	}
	// Removing the file deletes its data file.
	s.Remove(r, "f", false, "")
	files, _ := filepath.Glob(filepath.Join(s.Dir(), "data", "*", "*", fmt.Sprintf("%d.*", f.Vnode)))
	if len(files) != 0 {
		t.Fatalf("data files left after remove: %v", files)
	}
	staged, _ := os.ReadDir(filepath.Join(s.Dir(), "staging"))
	if len(staged) != 0 {
		t.Fatalf("staging files left: %d", len(staged))
	}
}

// TestRedoAfterCrash publishes a commit and stops before carrying it out, as
// a crash would; reopening must finish it.
func TestRedoAfterCrash(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		t.Run(fmt.Sprint("inPlace=", inPlace), func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			r := root(t, s)
			f := mustCreate(t, s, r, "f", node.TypeFile).FID
			base := bytes.Repeat([]byte("b"), 1<<20)
			write(t, s, f, 0, base)
			want := append([]byte(nil), base...)
			off, data := int64(0), bytes.Repeat([]byte("n"), 1<<20)
			if inPlace {
				off, data = 4096, []byte("new")
			}
			copy(want[off:], data)
			// Stage and publish by hand, skipping finish.
			u, _ := s.BeginUpdate(f)
			u.WriteAt(data, off)
			u.spill() // as a commit of a file past inlineMax does
			u.staging.Sync()
			var rec record
			s.view(f.Volume, func(v *vtx) (err error) { rec, err = v.get(f); return })
			p := pending{vol: f.Volume, vnode: f.Vnode, size: uint64(len(want))}
			if inPlace {
				p.ranges = []extent{{off, off + int64(len(data))}}
			} else {
				p.oldGen, p.newGen = rec.DataGen, s.newGen()
			}
			err = s.db.Update(func(tx *bolt.Tx) error {
				v, _ := openVol(tx, f.Volume)
				rec.DV++
				if p.newGen != 0 {
					rec.DataGen = p.newGen
				}
				v.put(f.Vnode, &rec)
				return tx.Bucket(bktPending).Put([]byte(u.name), p.encode())
			})
			if err != nil {
				t.Fatal(err)
			}
			u.staging.Close()
			s.Close()

			s2 := open(t, dir)
			if got := read(t, s2, f); !bytes.Equal(got, want) {
				t.Fatal("redo did not produce the published version")
			}
			st, _ := s2.GetStatus(f)
			if st.DataVersion != rec.DV {
				t.Fatalf("data version %d, want %d", st.DataVersion, rec.DV)
			}
			s2.db.View(func(tx *bolt.Tx) error {
				if n := tx.Bucket(bktPending).Stats().KeyN; n != 0 {
					t.Fatalf("%d redo records left", n)
				}
				return nil
			})
			files, _ := filepath.Glob(filepath.Join(dir, "data", "*", "*", fmt.Sprintf("%d.*", f.Vnode)))
			if len(files) != 1 {
				t.Fatalf("data files after redo: %v", files)
			}
		})
	}
}

func TestWriteBounds(t *testing.T) {
	s := open(t, t.TempDir())
	f := mustCreate(t, s, root(t, s), "f", node.TypeFile).FID
	u, _ := s.BeginUpdate(f)
	defer u.Abort()
	wantErrno(t, u.WriteAt([]byte("x"), -1), syscall.EFBIG)
	wantErrno(t, u.WriteAt([]byte("x"), s.maxSize), syscall.EFBIG)
	if _, _, err := s.ReadAt(f, make([]byte, 1), -5); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("negative read offset: %v", err)
	}
}

// TestTruncateThenWrite checks a store that carries a truncation point, writes
// and a final size, as a client sends after write, truncate, write, truncate.
func TestTruncateThenWrite(t *testing.T) {
	for _, oldSize := range []int{1000, 4 << 20} {
		s := open(t, t.TempDir())
		f := mustCreate(t, s, root(t, s), "f", node.TypeFile).FID
		write(t, s, f, 0, bytes.Repeat([]byte("o"), oldSize))
		u, _ := s.BeginUpdate(f)
		u.Truncate(10)
		u.WriteAt(bytes.Repeat([]byte("a"), 10), 0)
		u.WriteAt(bytes.Repeat([]byte("b"), 10), 50)
		u.SetSize(55)
		st, err := u.Commit(true, time.Time{}, "")
		if err != nil {
			t.Fatal(err)
		}
		want := string(bytes.Repeat([]byte("a"), 10)) + string(make([]byte, 40)) + "bbbbb"
		if got := read(t, s, f); string(got) != want || st.Size != 55 {
			t.Fatalf("old size %d: got %q (size %d)", oldSize, got, st.Size)
		}
		// A pure extension keeps the data and adds zeros, in place.
		u, _ = s.BeginUpdate(f)
		u.SetSize(60)
		u.Commit(true, time.Time{}, "")
		if got := read(t, s, f); string(got) != want+string(make([]byte, 5)) {
			t.Fatalf("extend: got %q", got)
		}
	}
}

// TestTruncateThenExtend checks a store that carries only a truncation
// point and a larger final size, as after ftruncate down then up with no
// write between: the bytes past the point read as zeros, in every layout
// the old data may have (inline, a data file, a large one).
func TestTruncateThenExtend(t *testing.T) {
	for _, oldSize := range []int{1000, 4 << 20, 12 << 20} {
		s := open(t, t.TempDir())
		f := mustCreate(t, s, root(t, s), "f", node.TypeFile).FID
		write(t, s, f, 0, bytes.Repeat([]byte("o"), oldSize))
		u, _ := s.BeginUpdate(f)
		u.Truncate(100)
		u.SetSize(uint64(oldSize / 2))
		if _, err := u.Commit(true, time.Time{}, ""); err != nil {
			t.Fatal(err)
		}
		want := string(bytes.Repeat([]byte("o"), 100)) + string(make([]byte, oldSize/2-100))
		if got := read(t, s, f); string(got) != want {
			t.Fatalf("old size %d: %d bytes, first difference at %d", oldSize, len(got), fsx.FirstDiff(got, []byte(want)))
		}
	}
}

// TestReadDirHuge lists a directory of 120,000 entries in pages, resuming
// by cookie, while entries are removed and added between pages.
func TestReadDirHuge(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short")
	}
	s := open(t, t.TempDir())
	r := root(t, s)
	d := mustCreate(t, s, r, "big", node.TypeDir).FID
	const n = 120000
	// Insert in one transaction, as Create would one by one.
	err := s.mutate(d.Volume, func(v *vtx) error {
		dr, err := v.getDir(d)
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			rec := record{Type: node.TypeFile, Mode: 0o644, Nlink: 1, DV: 1, Parent: d.Vnode}
			vn, err := v.alloc(&rec)
			if err != nil {
				return err
			}
			if err := v.addEntry(d.Vnode, &dr, fmt.Sprintf("e%06d", i), vn, node.TypeFile); err != nil {
				return err
			}
		}
		v.touchDir(&dr)
		return v.put(d.Vnode, &dr)
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]bool, n)
	var cookie uint64
	for page := 0; ; page++ {
		ents, eof, _, err := s.ReadDir(d, cookie, 5000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			var i int
			fmt.Sscanf(e.Name, "e%06d", &i)
			if e.Name != "late" {
				if seen[i] {
					t.Fatalf("%s listed twice", e.Name)
				}
				seen[i] = true
			}
			cookie = e.Cookie
		}
		if page == 3 {
			s.Remove(d, "e000001", false, "")
			s.Remove(d, fmt.Sprintf("e%06d", n-1), false, "")
		}
		if eof {
			break
		}
	}
	for i := 2; i < n-1; i++ {
		if !seen[i] {
			t.Fatalf("e%06d skipped", i)
		}
	}
	if seen[n-1] {
		t.Fatal("an entry removed before it was reached was listed")
	}
}

// A remove that frees a file's data waits for a store of that file in
// flight (which holds the file's lock from its publication to the end of
// its redo): deleting the data file under the store, with the redo record
// still there, left a redo that a restart could not carry out. The test
// holds the lock shared, so that the remove waiting for it shows: a
// writer waiting keeps new readers out.
func TestRemoveWaitsForCommitInFlight(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	f := mustCreate(t, s, r, "f", node.TypeFile).FID
	write(t, s, f, 0, make([]byte, inlineMax+1)) // in a data file
	files := func() []string {
		m, _ := filepath.Glob(filepath.Join(s.Dir(), "data", "*", "*", fmt.Sprintf("%d.*", f.Vnode)))
		return m
	}
	l := s.lock(f)
	l.RLock()
	removed := make(chan error, 1)
	go func() { _, _, err := s.Remove(r, "f", false, ""); removed <- err }()
	// A writer waiting for the lock keeps new readers out.
	if !poll.Until(10*time.Second, func() bool {
		if l.TryRLock() {
			l.RUnlock()
			return false
		}
		return true
	}) {
		l.RUnlock()
		t.Fatal("the remove did not wait for the file's lock")
	}
	if len(files()) != 1 {
		l.RUnlock()
		t.Fatal("the data file went while a store of it held the file's lock")
	}
	l.RUnlock()
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if left := files(); len(left) != 0 {
		t.Fatalf("data files left after remove: %v", left)
	}
}

// A store sent again because its reply was lost is not made twice: made
// again after another store, it would undo that one.
func TestStoreOnce(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	f := mustCreate(t, s, r, "f", node.TypeFile).FID
	commit := func(data string, op node.Op) node.Status {
		t.Helper()
		u, err := s.BeginUpdate(f)
		if err != nil {
			t.Fatal(err)
		}
		u.WriteAt([]byte(data), 0)
		u.SetSize(uint64(len(data)))
		st, err := u.Commit(false, time.Time{}, op)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	first := commit("first", "op-1")
	other := commit("other", "op-2")
	again := commit("first", "op-1")
	if again.DataVersion != other.DataVersion || string(read(t, s, f)) != "other" {
		t.Fatalf("op-1 sent again: version %d (want %d), data %q (want the later store's)", again.DataVersion, other.DataVersion, read(t, s, f))
	}
	if other.DataVersion <= first.DataVersion {
		t.Fatal("versions did not advance")
	}
	if staged, _ := os.ReadDir(filepath.Join(s.Dir(), "staging")); len(staged) != 0 {
		t.Fatalf("%d staging files left", len(staged))
	}
	// Unnamed stores are made every time.
	commit("x", "")
	if st := commit("x", ""); st.DataVersion != other.DataVersion+2 {
		t.Fatalf("version %d after two unnamed stores, want %d", st.DataVersion, other.DataVersion+2)
	}
}
