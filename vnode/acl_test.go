package vnode

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/node"
)

func mustACL(t *testing.T, s *Store, dir node.FID) access.ACL {
	t.Helper()
	a, err := s.aclOf(dir)
	if err != nil {
		t.Fatalf("acl of %v: %v", dir, err)
	}
	return a
}

func wantACL(t *testing.T, s *Store, dir node.FID, want access.ACL) {
	t.Helper()
	if got := mustACL(t, s, dir); !slices.Equal(got, want) {
		t.Fatalf("acl of %v: %v, want %v", dir, got, want)
	}
}

func wantACLDir(t *testing.T, s *Store, f, want node.FID) {
	t.Helper()
	got, err := s.aclDirOf(f)
	if err != nil || got != want {
		t.Fatalf("acl dir of %v: %v %v, want %v", f, got, err, want)
	}
	gd, _, err := s.GoverningACL(f)
	if err != nil || gd != want {
		t.Fatalf("governing acl of %v: dir %v %v, want %v", f, gd, err, want)
	}
}

func TestACLDefaultAndInherit(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	wantACL(t, s, r, access.DefaultACL())
	v, err := s.CreateVolume("proj")
	if err != nil {
		t.Fatal(err)
	}
	wantACL(t, s, v.Root, access.DefaultACL())

	// Without an ACL of its own a directory follows its ancestors'.
	a := mustCreate(t, s, r, "a", node.TypeDir).FID
	b := mustCreate(t, s, a, "b", node.TypeDir).FID
	wantACL(t, s, b, access.DefaultACL())

	mine := access.ACL{}.Set(1000, access.All).Set(1005, access.Read|access.Lookup)
	before, _ := s.GetStatus(a)
	st, err := s.SetACL(a, mine)
	if err != nil {
		t.Fatal(err)
	}
	if st.FID != a || !st.Ctime.After(before.Ctime) || st.DataVersion != before.DataVersion {
		t.Fatalf("status after SetACL: %+v (before %+v)", st, before)
	}
	wantACL(t, s, a, mine)
	wantACL(t, s, b, mine)
	wantACL(t, s, r, access.DefaultACL())

	// A new directory gets a copy of its parent's: a later change to the
	// parent's is not the child's.
	c := mustCreate(t, s, a, "c", node.TypeDir).FID
	wantACL(t, s, c, mine)
	other := access.ACL{}.Set(1001, access.Lookup)
	if _, err := s.SetACL(a, other); err != nil {
		t.Fatal(err)
	}
	wantACL(t, s, c, mine)
	wantACL(t, s, b, other)

	// A file is governed by its directory.
	f := mustCreate(t, s, c, "f", node.TypeFile).FID
	wantACLDir(t, s, f, c)
	wantACLDir(t, s, c, c)
	if gd, ga, err := s.GoverningACL(f); err != nil || gd != c || !slices.Equal(ga, mine) {
		t.Fatalf("governing acl of f: %v %v %v", gd, ga, err)
	}

	// An empty ACL is one: it does not fall back to the parent's.
	if _, err := s.SetACL(c, access.ACL{}); err != nil {
		t.Fatal(err)
	}
	wantACL(t, s, c, access.ACL{})

	// Reopened, all of it is still there.
	s.Close()
	s = open(t, dir)
	wantACL(t, s, r, access.DefaultACL())
	wantACL(t, s, a, other)
	wantACL(t, s, b, other)
	wantACL(t, s, c, access.ACL{})
	wantACLDir(t, s, f, c)
}

func TestSetACLErrors(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	f := mustCreate(t, s, r, "f", node.TypeFile).FID
	_, err := s.SetACL(f, access.DefaultACL())
	wantErrno(t, err, syscall.ENOTDIR)
	_, err = s.aclOf(f)
	wantErrno(t, err, syscall.ENOTDIR)

	var big access.ACL
	for i := range access.MaxEntries + 1 {
		big = big.Set(access.FirstID+access.ID(i), access.Read)
	}
	_, err = s.SetACL(r, big)
	wantErrno(t, err, syscall.EINVAL)
	_, err = s.SetACL(r, access.ACL{{ID: 1001, Rights: access.Read}, {ID: 1000, Rights: access.Read}})
	wantErrno(t, err, syscall.EINVAL)
	_, err = s.SetACL(r, access.ACL{{ID: 0, Rights: access.Read}})
	wantErrno(t, err, syscall.EINVAL)
	if _, err := s.SetACL(r, big[:access.MaxEntries]); err != nil {
		t.Fatalf("an ACL of %d entries: %v", access.MaxEntries, err)
	}

	stale := f
	stale.Unique++
	_, err = s.aclDirOf(stale)
	wantErrno(t, err, syscall.ESTALE)
	_, _, err = s.GoverningACL(stale)
	wantErrno(t, err, syscall.ESTALE)
	d := mustCreate(t, s, r, "d", node.TypeDir).FID
	if _, _, err := s.Remove(r, "d", true, ""); err != nil {
		t.Fatal(err)
	}
	_, err = s.SetACL(d, access.DefaultACL())
	wantErrno(t, err, syscall.ESTALE)
	_, err = s.aclOf(d)
	wantErrno(t, err, syscall.ESTALE)
}

// A file's governing directory follows it when it is renamed to another
// directory, and not when it is linked into one.
func TestACLDirOfFiles(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	a := mustCreate(t, s, r, "a", node.TypeDir).FID
	b := mustCreate(t, s, r, "b", node.TypeDir).FID
	for _, typ := range []node.Type{node.TypeFile, node.TypeFifo} {
		name := typ.String()
		f := mustCreate(t, s, a, name, typ).FID
		wantACLDir(t, s, f, a)
		if _, err := s.Rename(a, name, a, name+"2", "", ""); err != nil {
			t.Fatal(err)
		}
		wantACLDir(t, s, f, a)
		if _, err := s.Rename(a, name+"2", b, name, "", ""); err != nil {
			t.Fatal(err)
		}
		wantACLDir(t, s, f, b)
		if _, _, err := s.Link(a, name+"-link", f, ""); err != nil {
			t.Fatal(err)
		}
		wantACLDir(t, s, f, b)
	}
	sl, _, _, err := s.Create(a, "sl", node.TypeSymlink, node.Attr{Mode: 0o777}, "x", true, "")
	if err != nil {
		t.Fatal(err)
	}
	wantACLDir(t, s, sl.FID, a)

	// Files made under a delegation are governed as created ones are.
	fids, err := s.Reserve(b.Volume, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.CreateReserved(b, []node.Reserved{{Name: "res", FID: fids[0], Mtime: time.Now()}}, nil, ""); err != nil {
		t.Fatal(err)
	}
	wantACLDir(t, s, fids[0], b)

	// Once its directory is gone, a file reached by another link is the
	// root's.
	c := mustCreate(t, s, r, "c", node.TypeDir).FID
	g := mustCreate(t, s, c, "g", node.TypeFile).FID
	if _, _, err := s.Link(a, "g", g, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Remove(c, "g", false, ""); err != nil {
		t.Fatal(err)
	}
	wantACLDir(t, s, g, c)
	if _, _, err := s.Remove(r, "c", true, ""); err != nil {
		t.Fatal(err)
	}
	wantACLDir(t, s, g, r)
}

// A record written before files had a Parent is governed by the root.
func TestACLDirOldRecord(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	d := mustCreate(t, s, r, "d", node.TypeDir).FID
	if _, err := s.SetACL(d, access.ACL{}.Set(1000, access.All)); err != nil {
		t.Fatal(err)
	}
	f := mustCreate(t, s, d, "f", node.TypeFile).FID
	err := s.mutate(f.Volume, func(v *vtx) error {
		rec, err := v.get(f)
		if err != nil {
			return err
		}
		rec.Parent = 0
		return v.put(f.Vnode, &rec)
	})
	if err != nil {
		t.Fatal(err)
	}
	wantACLDir(t, s, f, r)
	if _, a, err := s.GoverningACL(f); err != nil || !slices.Equal(a, access.DefaultACL()) {
		t.Fatalf("governing acl: %v %v", a, err)
	}
	// Renamed into a directory, it is that one's.
	if _, err := s.Rename(d, "f", r, "f", "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rename(r, "f", d, "f", "", ""); err != nil {
		t.Fatal(err)
	}
	wantACLDir(t, s, f, d)
}

// A removed directory's ACL goes with it, whether rmdir'ed or replaced by
// a rename.
func TestACLRemoved(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	count := func() int {
		n := 0
		s.view(r.Volume, func(v *vtx) error {
			n = v.acls.Stats().KeyN
			return nil
		})
		return n
	}
	mine := access.ACL{}.Set(1000, access.All)
	d := mustCreate(t, s, r, "d", node.TypeDir).FID
	if _, err := s.SetACL(d, mine); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, d, "e", node.TypeDir)
	mustCreate(t, s, r, "x", node.TypeDir)
	if n := count(); n != 2 {
		t.Fatalf("%d ACLs stored, want 2", n)
	}
	if _, _, err := s.Remove(d, "e", true, ""); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d ACLs stored after rmdir, want 1", n)
	}
	if _, err := s.Rename(r, "x", r, "d", "", ""); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d ACLs stored after the directory was replaced, want 0", n)
	}
}

// A directory moved elsewhere keeps the ACL it had, as in AFS, even one it
// had from its ancestors.
func TestACLMovedDirectory(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	priv := mustCreate(t, s, r, "priv", node.TypeDir).FID
	mine := access.ACL{}.Set(1000, access.All)
	if _, err := s.SetACL(priv, mine); err != nil {
		t.Fatal(err)
	}
	pub := mustCreate(t, s, r, "pub", node.TypeDir).FID
	sub := mustCreate(t, s, pub, "sub", node.TypeDir).FID
	inner := mustCreate(t, s, sub, "inner", node.TypeDir).FID
	if _, err := s.Rename(pub, "sub", priv, "sub", "", ""); err != nil {
		t.Fatal(err)
	}
	wantACL(t, s, sub, access.DefaultACL())
	wantACL(t, s, inner, access.DefaultACL())
	if _, err := s.Rename(priv, "sub", pub, "sub", "", ""); err != nil {
		t.Fatal(err)
	}
	wantACL(t, s, sub, access.DefaultACL())
	// A rename within a directory changes nothing.
	if _, err := s.Rename(pub, "sub", pub, "sub2", "", ""); err != nil {
		t.Fatal(err)
	}
	wantACL(t, s, sub, access.DefaultACL())
}

// A store from before ACLs (format 3, no acls buckets) opens, upgraded,
// with the default ACL everywhere.
func TestACLFormatUpgrade(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	d := mustCreate(t, s, r, "d", node.TypeDir).FID
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bktVolumes).Bucket(u64(r.Volume)).DeleteBucket(bktACLs); err != nil {
			return err
		}
		return tx.Bucket(bktMeta).Put(keyFormat, u64(3))
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)
	wantACL(t, s, d, access.DefaultACL())
	if _, err := s.SetACL(d, access.ACL{}.Set(1000, access.All)); err != nil {
		t.Fatal(err)
	}
	s.view(r.Volume, func(v *vtx) error {
		if f := getU64(v.tx.Bucket(bktMeta).Get(keyFormat)); f != formatVersion {
			t.Errorf("format %d after the upgrade", f)
		}
		return nil
	})
	s.Close()
	// A store from a later hoard is refused.
	db, err := bolt.Open(filepath.Join(dir, "hoard.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bktMeta).Put(keyFormat, u64(formatVersion+1)) })
	db.Close()
	if s, err := Open(dir); err == nil {
		s.Close()
		t.Fatal("opened a store of a later format")
	}
}

// What a store kept before the cell's principal registry is read once,
// its ACLs numbered (names the registry does not know dropped and
// said), and then forgotten.
func TestMoveOldPrincipals(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	d := mustCreate(t, s, r, "d", node.TypeDir).FID
	until := time.Unix(1<<33, 5)
	named := []byte{1, byte(access.All), 5, 'a', 'l', 'i', 'c', 'e', byte(access.Read), 5, 'g', 'h', 'o', 's', 't'}
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bktGroups, bktMemberOf, bktRevoked} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bktGroups).Put([]byte("staff"), []byte("\x05alice\x03bob")); err != nil {
			return err
		}
		exp := binary.BigEndian.AppendUint32(u64(uint64(until.Unix())), uint32(until.Nanosecond()))
		if err := tx.Bucket(bktRevoked).Put([]byte("t1"), exp); err != nil {
			return err
		}
		return tx.Bucket(bktVolumes).Bucket(u64(r.Volume)).Bucket(bktACLs).Put(u64(d.Vnode), named)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.GoverningACL(d); !errors.Is(err, errCorrupt) {
		t.Fatalf("a named ACL read as a numbered one: %v", err)
	}
	groups, revoked, err := s.OldPrincipals()
	if err != nil || len(groups) != 1 || groups[0].Name != "staff" || groups[0].Owner != "alice" ||
		!slices.Equal(groups[0].Members, []string{"bob"}) || len(revoked) != 1 || !revoked["t1"].Equal(until) {
		t.Fatalf("OldPrincipals = %v, %v, %v", groups, revoked, err)
	}
	dropped, err := s.NumberACLs(func(name string) (access.ID, bool) { return 1042, name == "alice" })
	if err != nil || !slices.Equal(dropped, []string{"ghost"}) {
		t.Fatalf("NumberACLs dropped %v, %v", dropped, err)
	}
	wantACL(t, s, d, access.ACL{}.Set(1042, access.All))
	if err := s.DropOldPrincipals(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)
	if groups, revoked, err := s.OldPrincipals(); err != nil || len(groups)+len(revoked) != 0 {
		t.Fatalf("after the drop and a restart: %v, %v, %v", groups, revoked, err)
	}
	if dropped, err := s.NumberACLs(func(string) (access.ID, bool) { return 0, false }); err != nil || len(dropped) != 0 {
		t.Fatalf("numbered twice: %v, %v", dropped, err)
	}
	wantACL(t, s, d, access.ACL{}.Set(1042, access.All))
}
