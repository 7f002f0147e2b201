package vnode

import (
	"bytes"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

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
	batch := []node.Reserved{{Name: "a", FID: fids[0], Attr: node.Attr{Mode: 0o640, UID: 7}, Mtime: mt}, {Name: "b", FID: fids[1], Mtime: mt}}
	sts, _, dst, err := s.CreateReserved(d.FID, batch, nil, "op1")
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
	if again, _, _, err := s.CreateReserved(d.FID, batch, nil, "op1"); err != nil || again[1].FID != fids[1] {
		t.Fatalf("retry: %v %v", again, err)
	}
	// So does one under another op id, with a file more.
	extra, err := s.Reserve(d.FID.Volume, 1)
	if err != nil {
		t.Fatal(err)
	}
	if again, _, dst2, err := s.CreateReserved(d.FID, []node.Reserved{batch[0], {Name: "a2", FID: extra[0]}}, nil, "op1b"); err != nil ||
		again[0].FID != fids[0] || again[1].FID != extra[0] || dst2.DataVersion != dst.DataVersion+1 {
		t.Fatalf("a later attempt with one more file: %v %+v %v", again, dst2, err)
	}
	_, _, _, err = s.CreateReserved(d.FID, []node.Reserved{{Name: "c", FID: fids[0]}}, nil, "op2")
	wantErrno(t, err, syscall.EINVAL)
	// All or none: a taken name fails the batch, and its FIDs stay reserved.
	_, _, _, err = s.CreateReserved(d.FID, []node.Reserved{{Name: "c", FID: fids[2]}, {Name: "a", FID: fids[2]}}, nil, "op3")
	wantErrno(t, err, syscall.EEXIST)
	if _, _, err := s.Lookup(d.FID, "c"); err == nil {
		t.Fatal("a failed batch left a name")
	}
	forged := fids[2]
	forged.Unique++
	_, _, _, err = s.CreateReserved(d.FID, []node.Reserved{{Name: "c", FID: forged}}, nil, "op4")
	wantErrno(t, err, syscall.EINVAL)
	_, _, _, err = s.CreateReserved(d.FID, []node.Reserved{{Name: "../x", FID: fids[2]}}, nil, "op5")
	wantErrno(t, err, syscall.EINVAL)
	s.Close()
	s = open(t, dir)
	if st, _, err := s.Lookup(d.FID, "b"); err != nil || st.FID != fids[1] {
		t.Fatalf("after a restart b is %+v %v", st, err)
	}
	if _, _, _, err := s.CreateReserved(d.FID, []node.Reserved{{Name: "c", FID: fids[2]}}, nil, "op6"); err != nil {
		t.Fatalf("a reservation did not survive the restart: %v", err)
	}
	later := mustCreate(t, s, d.FID, "later", node.TypeFile)
	for _, f := range fids {
		if later.FID.Vnode == f.Vnode {
			t.Fatalf("a later create got reserved vnode %d", f.Vnode)
		}
	}
}

// Files removed under a directory delegation go in the same transaction
// as the files made there, removes first: a name removed may be made
// again by the same batch. A retry, under the same op or another, finds
// them gone; a directory or a forged FID fails the whole batch.
func TestCreateReservedRemoves(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	d := mustCreate(t, s, r, "d", node.TypeDir)
	a := mustCreate(t, s, d.FID, "a", node.TypeFile)
	write(t, s, a.FID, 0, bytes.Repeat([]byte("a"), 200<<10)) // in a data file, not inline
	b := mustCreate(t, s, d.FID, "b", node.TypeFile)
	write(t, s, b.FID, 0, []byte("b"))
	sub := mustCreate(t, s, d.FID, "sub", node.TypeDir)
	d, err := s.GetStatus(d.FID)
	if err != nil {
		t.Fatal(err)
	}
	fids, err := s.Reserve(d.FID.Volume, 1)
	if err != nil {
		t.Fatal(err)
	}
	forged := b.FID
	forged.Unique++
	_, _, _, err = s.CreateReserved(d.FID, nil, []node.Removed{{Name: "a", FID: a.FID}, {Name: "b", FID: forged}}, "bad1")
	wantErrno(t, err, syscall.ESTALE)
	_, _, _, err = s.CreateReserved(d.FID, nil, []node.Removed{{Name: "a", FID: a.FID}, {Name: "sub", FID: sub.FID}}, "bad2")
	wantErrno(t, err, syscall.EISDIR)
	if st, _, err := s.Lookup(d.FID, "a"); err != nil || st.FID != a.FID {
		t.Fatalf("a failed batch removed a: %+v %v", st, err)
	}
	made := []node.Reserved{{Name: "a", FID: fids[0], Mtime: time.Unix(1700000000, 0)}}
	rm := []node.Removed{{Name: "a", FID: a.FID}, {Name: "b", FID: b.FID}}
	sts, gone, dst, err := s.CreateReserved(d.FID, made, rm, "op1")
	if err != nil || len(sts) != 1 || len(gone) != 2 {
		t.Fatalf("settle: %v %v %v", sts, gone, err)
	}
	if gone[0].FID != a.FID || gone[0].Nlink != 0 || gone[1].Nlink != 0 || dst.DataVersion != d.DataVersion+3 {
		t.Fatalf("removed %+v, dir version %d from %d: want both gone, three changes", gone, dst.DataVersion, d.DataVersion)
	}
	if st, _, err := s.Lookup(d.FID, "a"); err != nil || st.FID != fids[0] {
		t.Fatalf("a names %+v %v, want the file made again", st, err)
	}
	if _, _, err := s.Lookup(d.FID, "b"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("b after its remove: %v", err)
	}
	for _, f := range []node.FID{a.FID, b.FID} {
		if _, err := s.GetStatus(f); err == nil {
			t.Fatalf("removed file %v still has a status", f)
		}
	}
	for _, op := range []node.Op{"op1", "op2"} {
		_, again, dst2, err := s.CreateReserved(d.FID, made, rm, op)
		if err != nil || len(again) != 2 || again[1].FID != b.FID || dst2.DataVersion != dst.DataVersion {
			t.Fatalf("retry as %s: %+v %+v %v", op, again, dst2, err)
		}
	}
	s.Close()
	s = open(t, dir)
	if _, err := s.GetStatus(a.FID); err == nil {
		t.Fatal("a removed file is back after a restart")
	}
	if _, _, err := s.Lookup(d.FID, "b"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("b after a restart: %v", err)
	}
}

// A reservation lives through one restart, when the files made with it
// are settled in the grace period, and is dropped at the next: a client
// that reserves and never creates does not fill the store. One written
// before reservations carried their epoch counts as the previous life's.
func TestReservationsPrunedAfterTwoStarts(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	d := mustCreate(t, s, root(t, s), "d", node.TypeDir)
	fids, err := s.Reserve(d.FID.Volume, 3)
	if err != nil {
		t.Fatal(err)
	}
	// fids[2] as an older server wrote it: the uniquifier alone.
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bktReserved).Put(reservedKey(fids[2]), u64(fids[2].Unique))
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)
	if _, _, _, err := s.CreateReserved(d.FID, []node.Reserved{{Name: "a", FID: fids[0]}}, nil, "op1"); err != nil {
		t.Fatalf("a reservation after one restart: %v", err)
	}
	s.Close()
	s = open(t, dir)
	for i, f := range fids[1:] {
		_, _, _, err := s.CreateReserved(d.FID, []node.Reserved{{Name: fmt.Sprint("b", i), FID: f}}, nil, node.Op(fmt.Sprint("op2", i)))
		wantErrno(t, err, syscall.EINVAL)
	}
	if err := s.db.View(func(tx *bolt.Tx) error {
		if n := tx.Bucket(bktReserved).Stats().KeyN; n != 0 {
			t.Fatalf("%d reservations left after two restarts", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
