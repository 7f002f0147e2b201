package vnode

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/hoardfs/hoard/node"
)

// A release's passes into a read-only copy never write over what its
// readers read: a pass brings a changed file under a generation of its
// own and the copy reads as before until the pass is published; then it
// reads the new bytes, and the old file is gone. The copy's site knows
// which read-write versions it holds (CopyHas), so a release sends only
// what changed.
func TestReleaseCopy(t *testing.T) {
	src, dst := open(t, t.TempDir()), open(t, t.TempDir())
	v, err := src.CreateVolume("sw")
	if err != nil {
		t.Fatal(err)
	}
	const copyID = 99
	old := bytes.Repeat([]byte("old release "), 30000)
	big := mustCreate(t, src, v.Root, "big", node.TypeFile)
	write(t, src, big.FID, 0, old)
	keep := mustCreate(t, src, v.Root, "keep", node.TypeFile)
	write(t, src, keep.FID, 0, bytes.Repeat([]byte("k"), 200000))

	copyVolume(t, src, dst, v.ID, nil, copyID, true)
	inCopy := node.FID{Volume: copyID, Vnode: big.FID.Vnode, Unique: big.FID.Unique}
	if got := read(t, dst, inCopy); !bytes.Equal(got, old) {
		t.Fatalf("the copy reads %d bytes, not the %d released", len(got), len(old))
	}
	if cv, err := dst.VolumeByName("sw" + node.ReadOnlySuffix); err != nil || cv.ID != copyID {
		t.Fatalf("the copy's name: %+v %v", cv, err)
	}
	files := func() []string {
		m, _ := filepath.Glob(filepath.Join(dst.dir, "data", "99", "*", "*"))
		return m
	}
	before := files()

	// A small write: the read-write volume changes its data file in
	// place, under the same generation.
	neu := append([]byte("NEW RELEASE "), old[12:]...)
	write(t, src, big.FID, 0, neu[:12])
	has, err := dst.CopyHas(copyID)
	if err != nil || len(has) != 2 {
		t.Fatalf("the copy has %v (%v), want both files", has, err)
	}
	have := map[DataFile]bool{}
	for _, df := range has {
		have[df] = true
	}
	sent, _ := copyVolume(t, src, dst, v.ID, have, copyID, false)
	if len(sent) != 2 {
		t.Fatalf("the pass covered %d files", len(sent))
	}
	if got := read(t, dst, inCopy); !bytes.Equal(got, old) {
		t.Fatal("an unpublished pass changed what the copy reads")
	}
	for _, f := range before {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("a published data file went before the next release was published: %v", err)
		}
	}
	copyVolume(t, src, dst, v.ID, have, copyID, true)
	if got := read(t, dst, inCopy); !bytes.Equal(got, neu) {
		t.Fatal("the published release does not read as the read-write volume")
	}
	after := files()
	if len(after) != 2 {
		t.Fatalf("data files of the copy after the release: %v", after)
	}
	gone := 0
	for _, f := range before {
		if _, err := os.Stat(f); err != nil {
			gone++
		}
	}
	if gone != 1 {
		t.Fatalf("%d of the last release's data files gone, want the changed one", gone)
	}
	if err := dst.RemoveVolume(copyID); err != nil {
		t.Fatal(err)
	}
	if has, _ := dst.CopyHas(copyID); len(has) != 0 {
		t.Fatalf("a removed copy still has %v", has)
	}
}
