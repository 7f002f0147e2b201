package vnode

import (
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

// Files made under a directory delegation are created with reserved FIDs,
// all of a batch or none, each FID once, and survive a restart as any
// file does; FIDs handed out later never collide with them.
func TestCreateReserved(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	d := mustCreate(t, s, r, "d", node.TypeDir)
	if _, err := s.Reserve(d.FID.Volume, 0); err == nil {
		t.Fatal("reserved 0 fids")
	}
	fids, err := s.Reserve(d.FID.Volume, 3)
	if err != nil || len(fids) != 3 {
		t.Fatalf("reserve: %v %v", fids, err)
	}
	mt := time.Unix(1700000000, 0)
	batch := []Reserved{{Name: "a", FID: fids[0], Attr: Attr{Mode: 0o640, UID: 7}, Mtime: mt}, {Name: "b", FID: fids[1], Mtime: mt}}
	sts, dst, err := s.CreateReserved(d.FID, batch, "op1")
	if err != nil || len(sts) != 2 {
		t.Fatalf("create reserved: %v %v", sts, err)
	}
	if sts[0].FID != fids[0] || sts[0].Mode&0o777 != 0o640 || sts[0].UID != 7 || !sts[0].Mtime.Equal(mt) || sts[0].Nlink != 1 {
		t.Fatalf("status of a: %+v", sts[0])
	}
	if dst.DataVersion != d.DataVersion+2 {
		t.Fatalf("dir version %d after two creates, was %d", dst.DataVersion, d.DataVersion)
	}
	// A retry answers as the first attempt; a new op finds the FIDs used.
	if again, _, err := s.CreateReserved(d.FID, batch, "op1"); err != nil || again[1].FID != fids[1] {
		t.Fatalf("retry: %v %v", again, err)
	}
	// So does one under another op id, with a file more.
	extra, err := s.Reserve(d.FID.Volume, 1)
	if err != nil {
		t.Fatal(err)
	}
	if again, dst2, err := s.CreateReserved(d.FID, []Reserved{batch[0], {Name: "a2", FID: extra[0]}}, "op1b"); err != nil ||
		again[0].FID != fids[0] || again[1].FID != extra[0] || dst2.DataVersion != dst.DataVersion+1 {
		t.Fatalf("a later attempt with one more file: %v %+v %v", again, dst2, err)
	}
	_, _, err = s.CreateReserved(d.FID, []Reserved{{Name: "c", FID: fids[0]}}, "op2")
	wantErrno(t, err, syscall.EINVAL)
	// All or none: a taken name fails the batch, and its FIDs stay reserved.
	_, _, err = s.CreateReserved(d.FID, []Reserved{{Name: "c", FID: fids[2]}, {Name: "a", FID: fids[2]}}, "op3")
	wantErrno(t, err, syscall.EEXIST)
	if _, _, err := s.Lookup(d.FID, "c"); err == nil {
		t.Fatal("a failed batch left a name")
	}
	forged := fids[2]
	forged.Unique++
	_, _, err = s.CreateReserved(d.FID, []Reserved{{Name: "c", FID: forged}}, "op4")
	wantErrno(t, err, syscall.EINVAL)
	_, _, err = s.CreateReserved(d.FID, []Reserved{{Name: "../x", FID: fids[2]}}, "op5")
	wantErrno(t, err, syscall.EINVAL)
	s.Close()
	s = open(t, dir)
	if st, _, err := s.Lookup(d.FID, "b"); err != nil || st.FID != fids[1] {
		t.Fatalf("after a restart b is %+v %v", st, err)
	}
	if _, _, err := s.CreateReserved(d.FID, []Reserved{{Name: "c", FID: fids[2]}}, "op6"); err != nil {
		t.Fatalf("a reservation did not survive the restart: %v", err)
	}
	later := mustCreate(t, s, d.FID, "later", node.TypeFile)
	for _, f := range fids {
		if later.FID.Vnode == f.Vnode {
			t.Fatalf("a later create got reserved vnode %d", f.Vnode)
		}
	}
}
