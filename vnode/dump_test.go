package vnode

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/hoardfs/hoard/node"
)

// copyVolume restores volume id of src into dst as a move's pass does:
// the metadata, and each data file not in have. With to set it is a
// release's pass instead, into read-only copy to, published if publish.
func copyVolume(t *testing.T, src, dst *Store, id uint64, have map[DataFile]bool, to uint64, publish bool) (sent map[DataFile]bool, changed int) {
	t.Helper()
	name, kvs, files, err := src.DumpMeta(id)
	if err != nil {
		t.Fatal(err)
	}
	sent = map[DataFile]bool{}
	rv := dst.Receive(id, false)
	if to != 0 {
		rv = dst.Receive(to, true)
	}
	buf := make([]byte, 1<<16)
	for _, df := range files {
		if have[df] {
			sent[df] = true
			continue
		}
		rf, err := rv.File(df)
		if err != nil {
			t.Fatal(err)
		}
		f := node.FID{Volume: id, Vnode: df.Vnode, Unique: df.Unique}
		ok := true
		for off := int64(0); ; {
			n, err := src.ReadVersion(f, df.DV, buf, off)
			if errors.Is(err, ErrChanged) {
				ok = false
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := rf.WriteAt(buf[:n], off); err != nil {
				t.Fatal(err)
			}
			if off += int64(n); n < len(buf) {
				break
			}
		}
		if !ok {
			rf.Abort()
			changed++
			continue
		}
		if err := rf.Commit(); err != nil {
			t.Fatal(err)
		}
		sent[df] = true
	}
	if err := rv.Sync(); err != nil {
		t.Fatal(err)
	}
	switch {
	case changed > 0 || to != 0 && !publish:
	case to != 0:
		if err := dst.PublishCopy(to, name+node.ReadOnlySuffix, kvs); err != nil {
			t.Fatal(err)
		}
	default:
		if err := dst.RestoreMeta(id, name, kvs); err != nil {
			t.Fatal(err)
		}
	}
	return sent, changed
}

// A volume dumped and restored elsewhere has the same names, statuses and
// bytes; a second pass sends only what changed; a file read after it
// changed is reported, not sent; data files no record names are dropped.
func TestDumpRestore(t *testing.T) {
	src, dst := open(t, t.TempDir()), open(t, t.TempDir())
	v, err := src.CreateVolume("proj")
	if err != nil {
		t.Fatal(err)
	}
	big := mustCreate(t, src, v.Root, "big", node.TypeFile)
	bigData := bytes.Repeat([]byte("0123456789abcdef"), 20000) // past the inline size
	write(t, src, big.FID, 0, bigData)
	small := mustCreate(t, src, v.Root, "small", node.TypeFile)
	write(t, src, small.FID, 0, []byte("inline"))
	dir := mustCreate(t, src, v.Root, "d", node.TypeDir)
	mustCreate(t, src, dir.FID, "e", node.TypeFile)

	have, changed := copyVolume(t, src, dst, v.ID, nil, 0, true)
	if changed != 0 || len(have) != 1 {
		t.Fatalf("first pass: %d data files sent, %d changed; want 1, 0", len(have), changed)
	}
	check := func(name string, want []byte) {
		t.Helper()
		r, err := dst.VolumeByName("proj")
		if err != nil || r.ID != v.ID {
			t.Fatalf("restored volume: %+v %v", r, err)
		}
		st, _, err := dst.Lookup(r.Root, name)
		if err != nil {
			t.Fatalf("lookup %s: %v", name, err)
		}
		got := make([]byte, len(want)+1)
		n, _, err := dst.ReadAt(st.FID, got, 0)
		if n != len(want) || !bytes.Equal(got[:n], want) {
			t.Fatalf("%s: %d bytes, %v", name, n, err)
		}
	}
	check("big", bigData)
	check("small", []byte("inline"))
	if _, _, err := dst.Lookup(dir.FID, "e"); err != nil {
		t.Fatalf("lookup d/e: %v", err)
	}
	// Nothing changed: the second pass sends no data file.
	again, _ := copyVolume(t, src, dst, v.ID, have, 0, true)
	if len(again) != 1 {
		t.Fatalf("second pass knows %d files", len(again))
	}
	// A file rewritten whole gets a new data file; the old one goes.
	bigData2 := bytes.Repeat([]byte("fedcba9876543210"), 20000)
	write(t, src, big.FID, 0, bigData2)
	third, _ := copyVolume(t, src, dst, v.ID, have, 0, true)
	check("big", bigData2)
	files := 0
	filepath.WalkDir(filepath.Join(dst.Dir(), "data", strconv.FormatUint(v.ID, 10)), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files++
		}
		return nil
	})
	if files != 1 || len(third) != 1 {
		t.Fatalf("after a rewrite the target holds %d data files, knows %d; want 1", files, len(third))
	}
	// A file that changes after the metadata was read is reported.
	_, _, filesNow, _ := src.DumpMeta(v.ID)
	write(t, src, big.FID, 0, []byte("x"))
	if _, err := src.ReadVersion(node.FID{Volume: v.ID, Vnode: filesNow[0].Vnode, Unique: filesNow[0].Unique}, filesNow[0].DV, make([]byte, 10), 0); !errors.Is(err, ErrChanged) {
		t.Fatalf("read of a changed file: %v, want ErrChanged", err)
	}
}

// Metadata naming a data file the target lacks is refused whole.
func TestRestoreMetaMissingFile(t *testing.T) {
	src, dst := open(t, t.TempDir()), open(t, t.TempDir())
	v, _ := src.CreateVolume("proj")
	f := mustCreate(t, src, v.Root, "big", node.TypeFile)
	write(t, src, f.FID, 0, make([]byte, 200<<10))
	name, kvs, _, err := src.DumpMeta(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.RestoreMeta(v.ID, name, kvs); err == nil {
		t.Fatal("metadata restored without its data file")
	}
	if _, err := dst.VolumeByName("proj"); err == nil {
		t.Fatal("a refused restore left a volume")
	}
}

// A request for a volume the store does not hold says which.
func TestNoVolume(t *testing.T) {
	s := open(t, t.TempDir())
	_, err := s.GetStatus(node.FID{Volume: 42, Vnode: 1, Unique: 1})
	var nv *NoVolumeError
	if !errors.As(err, &nv) || nv.ID != 42 {
		t.Fatalf("status in a missing volume: %v", err)
	}
}
