package vnode

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

// A request carried out and sent again (its reply lost) answers as the
// first time did, also after a restart, rather than acting twice or
// failing.
func TestOpRepeated(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	st, _, created, err := s.Create(r, "a", node.TypeFile, node.Attr{Mode: 0o644}, "", true, "op-create")
	if err != nil || !created {
		t.Fatal(err, created)
	}
	res, err := s.Rename(r, "a", r, "b", "", "op-rename")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)

	again, _, created, err := s.Create(r, "a", node.TypeFile, node.Attr{Mode: 0o644}, "", true, "op-create")
	if err != nil || created || again.FID != st.FID {
		t.Fatalf("repeated exclusive create: %v %v %v, want the first one's %v", err, created, again.FID, st.FID)
	}
	if _, _, err := s.Lookup(r, "a"); err == nil {
		t.Fatal("the repeated create made the file again")
	}
	res2, err := s.Rename(r, "a", r, "b", "", "op-rename")
	if err != nil || res2.Moved.FID != res.Moved.FID || res2.Replaced != nil {
		t.Fatalf("repeated rename: %v %+v", err, res2)
	}
	// Without an op, the same rename is an error: a is gone.
	_, err = s.Rename(r, "a", r, "b", "", "")
	wantErrno(t, err, syscall.ENOENT)

	mustCreate(t, s, r, "c", node.TypeFile)
	res, err = s.Rename(r, "b", r, "c", "", "op-over")
	if err != nil || res.Replaced == nil {
		t.Fatal(err, res.Replaced)
	}
	res2, err = s.Rename(r, "b", r, "c", "", "op-over")
	if err != nil || res2.Replaced == nil || res2.Replaced.FID != res.Replaced.FID || res2.Replaced.Nlink != 0 || res2.Replaced.Type != node.TypeFile {
		t.Fatalf("repeated rename over a file: %v %+v", err, res2.Replaced)
	}

	_, gone, err := s.Remove(r, "c", false, "op-remove")
	if err != nil {
		t.Fatal(err)
	}
	_, gone2, err := s.Remove(r, "c", false, "op-remove")
	if err != nil || gone2.FID != gone.FID || gone2.Nlink != 0 || gone2.Type != node.TypeFile {
		t.Fatalf("repeated remove: %v %+v", err, gone2)
	}
	_, _, err = s.Remove(r, "c", false, "op-other")
	wantErrno(t, err, syscall.ENOENT)

	f := mustCreate(t, s, r, "f", node.TypeFile)
	if _, _, err := s.Link(r, "g", f.FID, "op-link"); err != nil {
		t.Fatal(err)
	}
	lst, _, err := s.Link(r, "g", f.FID, "op-link")
	if err != nil || lst.Nlink != 2 {
		t.Fatalf("repeated link: %v, nlink %d", err, lst.Nlink)
	}
}

// A failed request records nothing: sent again, it is carried out.
func TestOpFailedNotRecorded(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	_, err := s.Rename(r, "x", r, "y", "", "op")
	wantErrno(t, err, syscall.ENOENT)
	x := mustCreate(t, s, r, "x", node.TypeFile)
	res, err := s.Rename(r, "x", r, "y", "", "op")
	if err != nil || res.Moved.FID != x.FID {
		t.Fatalf("rename after a failed attempt: %v %+v", err, res)
	}
}

// Outcomes are forgotten after opKeep.
func TestOpForgotten(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	record := func(op node.Op, at int64) {
		t.Helper()
		err := s.mutate(r.Volume, func(v *vtx) error {
			v.now = at
			return v.recordOp(op, done{vnodes: []named{{r, node.TypeDir}}})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	found := func(op node.Op) bool {
		var ok bool
		s.view(r.Volume, func(v *vtx) error { _, ok = v.findOp(op); return nil })
		return ok
	}
	now := time.Now().UnixNano()
	record("old", now-int64(opKeep)-1)
	record("recent", now-int64(time.Minute))
	if !found("old") || !found("recent") {
		t.Fatal("outcomes not recorded")
	}
	record("new", now)
	if found("old") {
		t.Fatal("an outcome older than opKeep was kept")
	}
	if !found("recent") || !found("new") {
		t.Fatal("recent outcomes were forgotten")
	}
}

func TestCheckOp(t *testing.T) {
	for _, op := range []node.Op{"", "0123456789abcdef", node.Op(strings.Repeat("a", node.MaxOp))} {
		if err := CheckOp(op); err != nil {
			t.Errorf("%q: %v", op, err)
		}
	}
	for _, op := range []node.Op{node.Op(strings.Repeat("a", node.MaxOp+1)), "a b", "a\x00", "\xff"} {
		if err := CheckOp(op); err == nil {
			t.Errorf("%q accepted", op)
		}
	}
}
