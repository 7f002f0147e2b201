package vnode

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

// A status counts the blocks the data takes, not its size: a file
// truncated to 1 GiB takes none, a written one its bytes, a sparse one
// only what was written; inline files their size rounded up; a
// directory a block as ext4's. The status a store answers says so too.
func TestBlocksSparseAndDense(t *testing.T) {
	s := open(t, t.TempDir())
	dir := root(t, s)
	blocks := func(f node.FID) uint64 {
		t.Helper()
		st, err := s.GetStatus(f)
		if err != nil {
			t.Fatal(err)
		}
		return st.Blocks
	}
	within := func(what string, got, lo, hi uint64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s: %d blocks, want %d..%d", what, got, lo, hi)
		}
	}

	sparse := mustCreate(t, s, dir, "sparse", node.TypeFile).FID
	st, err := s.SetAttr(sparse, node.Change{Mask: node.SetSize, Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if st.Size != 1<<30 {
		t.Fatalf("size %d", st.Size)
	}
	within("truncated to 1 GiB, as answered", st.Blocks, 0, 8)
	within("truncated to 1 GiB", blocks(sparse), 0, 8)

	dense := mustCreate(t, s, dir, "dense", node.TypeFile).FID
	st = write(t, s, dense, 0, bytes.Repeat([]byte{7}, 1<<20))
	within("1 MiB written, as answered", st.Blocks, 2048, 2048+64)
	within("1 MiB written", blocks(dense), 2048, 2048+64)
	// Written in place into the middle: the same blocks.
	write(t, s, dense, 4096, []byte("in place"))
	within("1 MiB after an in-place write", blocks(dense), 2048, 2048+64)

	// 4 KiB at 100 MiB, then 4 KiB more into the hole, in place.
	holes := mustCreate(t, s, dir, "holes", node.TypeFile).FID
	write(t, s, holes, 100<<20, bytes.Repeat([]byte{1}, 4096))
	within("4 KiB at 100 MiB", blocks(holes), 8, 64)
	write(t, s, holes, 50<<20, bytes.Repeat([]byte{2}, 4096))
	within("two 4 KiB runs", blocks(holes), 16, 128)

	small := mustCreate(t, s, dir, "small", node.TypeFile).FID
	write(t, s, small, 0, make([]byte, 1000))
	within("1000 bytes inline", blocks(small), 2, 2)

	within("empty file", blocks(mustCreate(t, s, dir, "empty", node.TypeFile).FID), 0, 0)
	within("directory", blocks(mustCreate(t, s, dir, "d", node.TypeDir).FID), 8, 8)
}

// A pinned version survives a commit that replaces the data file: the
// reader gets all of its version, and the commit does not wait for it.
func TestPinSurvivesReplace(t *testing.T) {
	s := open(t, t.TempDir())
	f := mustCreate(t, s, root(t, s), "f", node.TypeFile).FID
	old := bytes.Repeat([]byte("old version "), 100_000)
	write(t, s, f, 0, old)
	p, err := s.PinData(f, 0, int64(len(old)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	done := make(chan node.Status)
	go func() {
		u, err := s.BeginUpdate(f)
		if err != nil {
			t.Error(err)
		}
		u.WriteAt(bytes.Repeat([]byte("NEW VERSION "), 200_000), 0)
		st, err := u.Commit(true, time.Time{}, "")
		if err != nil {
			t.Error(err)
		}
		done <- st
	}()
	var st node.Status
	select {
	case st = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a commit waited for a pinned reader")
	}
	if st.DataVersion <= p.Status.DataVersion {
		t.Fatalf("commit made version %d, pinned %d", st.DataVersion, p.Status.DataVersion)
	}
	got, err := io.ReadAll(io.NewSectionReader(p.File, 0, p.Have))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, old) || p.Have != int64(len(old)) || p.Spoiled() {
		t.Fatalf("pinned reader got %d bytes (have %d, spoiled %v), not its version's %d", len(got), p.Have, p.Spoiled(), len(old))
	}
}

// A commit that writes into a pinned data file in place does not wait
// either; the pins whose range it touches learn that they are spoiled,
// the others not.
func TestPinSpoiledByInPlaceWrite(t *testing.T) {
	s := open(t, t.TempDir())
	f := mustCreate(t, s, root(t, s), "f", node.TypeFile).FID
	write(t, s, f, 0, bytes.Repeat([]byte{1}, 4<<20))
	hit, err := s.PinData(f, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer hit.Release()
	miss, err := s.PinData(f, 2<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer miss.Release()
	gen := dataFiles(s, f)
	done := make(chan struct{})
	go func() {
		write(t, s, f, 4096, []byte("a small write, applied in place"))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an in-place commit waited for a pinned reader")
	}
	if now := dataFiles(s, f); len(now) != 1 || len(gen) != 1 || now[0] != gen[0] {
		t.Fatalf("the commit was not in place: data files %v, then %v", gen, now)
	}
	if !hit.Spoiled() {
		t.Error("a pin whose range was written over in place is not spoiled")
	}
	if miss.Spoiled() {
		t.Error("a pin of a range the write missed is spoiled")
	}
}
