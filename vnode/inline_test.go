package vnode

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/node"
)

// dataFiles lists f's data files on disk.
func dataFiles(s *Store, f node.FID) []string {
	m, _ := filepath.Glob(filepath.Join(s.Dir(), "data", "*", "*", fmt.Sprintf("%d.*", f.Vnode)))
	return m
}

// stagingFiles counts the files in the staging directory.
func stagingFiles(t *testing.T, s *Store) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.Dir(), "staging"))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A small file lives in the database: no data file, no staging file, and
// it reads back, across a restart too. Growing past inlineMax moves it to
// a data file with every old byte, shrinking moves it back, and each
// change in between keeps what it did not overwrite.
func TestInlineFiles(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	f := mustCreate(t, s, root(t, s), "f", node.TypeFile).FID
	want := bytes.Repeat([]byte("a"), 5000)
	write(t, s, f, 0, want)
	if files := dataFiles(s, f); len(files) != 0 || stagingFiles(t, s) != 0 {
		t.Fatalf("a 5000-byte file made data files %v and %d staging files", files, stagingFiles(t, s))
	}
	check := func(when string) {
		t.Helper()
		if got := read(t, s, f); !bytes.Equal(got, want) {
			t.Fatalf("%s: read %d bytes, not what was written (%d)", when, len(got), len(want))
		}
	}
	check("inline")

	// A write in the middle and one past the end, inline still.
	write(t, s, f, 100, []byte("middle"))
	copy(want[100:], "middle")
	write(t, s, f, 6000, []byte("tail"))
	want = append(append(want, make([]byte, 1000)...), "tail"...)
	check("patched")
	s.Close()
	s = open(t, dir)
	check("after a restart")

	// Past inlineMax: a data file, holding the inline bytes too.
	write(t, s, f, inlineMax, []byte("far"))
	want = append(append(want, make([]byte, inlineMax-len(want))...), "far"...)
	check("grown")
	if files := dataFiles(s, f); len(files) != 1 {
		t.Fatalf("a file past inlineMax has data files %v", files)
	}
	s.view(f.Volume, func(v *vtx) error {
		if v.inline.Get(u64(f.Vnode)) != nil {
			t.Fatal("inline bytes left behind a data file")
		}
		return nil
	})

	// Truncated back to a small size: inline again, the data file gone.
	u, err := s.BeginUpdate(f)
	if err != nil {
		t.Fatal(err)
	}
	u.Truncate(3000)
	u.WriteAt([]byte("end"), 2997)
	if _, err := u.Commit(true, time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	want = append(want[:2997:2997], "end"...)
	check("shrunk")
	if files := dataFiles(s, f); len(files) != 0 || stagingFiles(t, s) != 0 {
		t.Fatalf("a shrunk file left data files %v and %d staging files", files, stagingFiles(t, s))
	}
	s.db.View(func(tx *bolt.Tx) error {
		if n := tx.Bucket(bktGarbage).Stats().KeyN; n != 0 {
			t.Fatalf("%d garbage records left", n)
		}
		return nil
	})

	// Truncated to nothing: no bytes anywhere. Removed: nothing left.
	u, _ = s.BeginUpdate(f)
	u.SetSize(0)
	if st, err := u.Commit(true, time.Time{}, ""); err != nil || st.Size != 0 {
		t.Fatalf("truncate to 0: %+v %v", st, err)
	}
	want = nil
	check("emptied")
	write(t, s, f, 0, []byte("again"))
	if _, _, err := s.Remove(root(t, s), "f", false, ""); err != nil {
		t.Fatal(err)
	}
	s.view(f.Volume, func(v *vtx) error {
		if n := v.inline.Stats().KeyN; n != 0 {
			t.Fatalf("%d inline values left after the file was removed", n)
		}
		return nil
	})
}

// A store of format 2 (before inline files) is upgraded when opened: its
// files keep their data files and new small files go inline.
func TestFormatUpgrade(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	old := mustCreate(t, s, r, "old", node.TypeFile).FID
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bktVolumes).Bucket(u64(old.Volume)).DeleteBucket(bktInline); err != nil {
			return err
		}
		return tx.Bucket(bktMeta).Put(keyFormat, u64(2))
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)
	write(t, s, old, 0, []byte("small"))
	if got := read(t, s, old); string(got) != "small" {
		t.Fatalf("after the upgrade: %q", got)
	}
}
