package vnode

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

// A size the data file system cannot take is refused (EFBIG) before
// anything is published: published, it failed when carried out, and then
// at every replay of its redo record, and the server could not start.
func TestSizesPastTheFileSystemRefused(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if s.maxSize < 1<<30 {
		t.Fatalf("probed a largest file of %d bytes", s.maxSize)
	}
	f := mustCreate(t, s, root(t, s), "f", node.TypeFile).FID
	st := write(t, s, f, 0, []byte("kept"))
	for _, size := range []uint64{uint64(s.maxSize) + 1, 1 << 44, 1 << 62, 1 << 63, 1<<64 - 1} {
		if size <= uint64(s.maxSize) {
			continue // a file system that takes 16 TiB
		}
		_, err := s.SetAttr(f, node.Change{Mask: node.SetSize, Size: size})
		wantErrno(t, err, syscall.EFBIG)
		u, err := s.BeginUpdate(f)
		if err != nil {
			t.Fatal(err)
		}
		u.SetSize(size)
		_, err = u.Commit(true, st.Mtime, "")
		wantErrno(t, err, syscall.EFBIG)
	}
	if now, err := s.GetStatus(f); err != nil || now.DataVersion != st.DataVersion || now.Size != 4 {
		t.Fatalf("after refused sizes: %+v %v, want version %d, 4 bytes", now, err, st.DataVersion)
	}
	s.Close()
	s = open(t, dir)
	if got := read(t, s, f); string(got) != "kept" {
		t.Fatalf("after a restart f reads %q", got)
	}
	write(t, s, f, 4, []byte("+more"))
}

// A redo record that cannot be carried out at the start quarantines its
// file, which answers EIO, and the server starts and serves the others.
func TestRecoveryQuarantinesOneFile(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	bad := mustCreate(t, s, r, "bad", node.TypeFile).FID
	write(t, s, bad, 0, bytes.Repeat([]byte("b"), 100<<10))
	good := mustCreate(t, s, r, "good", node.TypeFile).FID
	write(t, s, good, 0, []byte("good"))
	// A published store (new generation, new size, its redo record)
	// whose staging file and target are both gone: what a disk that
	// lost them would leave.
	p := pending{vol: bad.Volume, vnode: bad.Vnode, newGen: 1<<40 + 1, size: 5}
	if err := s.mutate(bad.Volume, func(v *vtx) error {
		rec, err := v.get(bad)
		if err != nil {
			return err
		}
		rec.DataGen, rec.Size = p.newGen, p.size
		if err := v.put(bad.Vnode, &rec); err != nil {
			return err
		}
		return v.tx.Bucket(bktPending).Put([]byte("s-lost"), p.encode())
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)
	q := s.Quarantined()
	if len(q) != 1 || q[node.FID{Volume: bad.Volume, Vnode: bad.Vnode}] == nil {
		t.Fatalf("quarantined: %v, want %v", q, bad)
	}
	if _, _, err := s.ReadAt(bad, make([]byte, 10), 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a quarantined file: %v, want EIO", err)
	}
	u, err := s.BeginUpdate(bad)
	if err != nil {
		t.Fatal(err)
	}
	u.WriteAt([]byte("x"), 0)
	if _, err := u.Commit(true, time.Time{}, ""); !errors.Is(err, syscall.EIO) {
		t.Fatalf("store to a quarantined file: %v, want EIO", err)
	}
	if got := read(t, s, good); string(got) != "good" {
		t.Fatalf("another file reads %q", got)
	}
	write(t, s, good, 0, []byte("GOOD"))
	mustCreate(t, s, r, "new", node.TypeFile)
	// The record stays for a later start, which tries again: once the
	// staging file is back, the commit is carried out.
	s.Close()
	if err := os.WriteFile(filepath.Join(dir, "staging", "s-lost"), []byte("fixed"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	if q := s.Quarantined(); len(q) != 0 {
		t.Fatalf("still quarantined after the staging file came back: %v", q)
	}
	if got := read(t, s, bad); string(got) != "fixed" {
		t.Fatalf("the file whose commit was carried out reads %q", got)
	}
}
