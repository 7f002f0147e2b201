package vnode

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

// Concurrent changes are committed together, and each gets the answer it
// would have got alone: a create whose name an earlier one in the same
// batch took fails with EEXIST, and the others are made once each. A
// failure costs its batch a second commit, never more.
func TestGroupCommit(t *testing.T) {
	s := open(t, t.TempDir())
	dir := root(t, s)
	const n = 200
	creates := func(name func(i int) string) (made, exist int, commits int64) {
		before := s.group.commits.Load()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, _, _, errs[i] = s.Create(dir, name(i), node.TypeFile, node.Attr{Mode: 0o644}, "", true, "")
			})
		}
		wg.Wait()
		for _, err := range errs {
			switch {
			case err == nil:
				made++
			case errors.Is(err, syscall.EEXIST):
				exist++
			default:
				t.Fatal(err)
			}
		}
		return made, exist, s.group.commits.Load() - before
	}
	made, exist, commits := creates(func(i int) string { return fmt.Sprint("a", i) })
	if made != n || exist != 0 || commits > n/2 {
		t.Fatalf("%d made, %d EEXIST in %d commits; want %d made in at most %d", made, exist, commits, n, n/2)
	}
	// Pairs share a name: exactly one of each pair is made.
	made, exist, commits = creates(func(i int) string { return fmt.Sprint("b", i/2) })
	if made != n/2 || exist != n/2 || commits > 2*n {
		t.Fatalf("%d made, %d EEXIST in %d commits; want %d of each in at most %d", made, exist, commits, n/2, 2*n)
	}
	ents, _, _, err := s.ReadDir(dir, 0, 0)
	if err != nil || len(ents) != n+n/2 {
		t.Fatalf("%d entries (%v), want %d", len(ents), err, n+n/2)
	}
	d, err := s.GetStatus(dir)
	if err != nil || d.DataVersion != 1+n+n/2 {
		t.Fatalf("directory at version %d (%v), want one step per file made: %d", d.DataVersion, err, 1+n+n/2)
	}
}

// Concurrent stores of different files, each with its redo record, land
// whole and are readable after a restart.
func TestGroupCommitStores(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	const n = 64
	fids := make([]node.FID, n)
	for i := range fids {
		fids[i] = mustCreate(t, s, r, fmt.Sprint("f", i), node.TypeFile).FID
	}
	var wg sync.WaitGroup
	for i, f := range fids {
		wg.Go(func() {
			u, err := s.BeginUpdate(f)
			if err == nil {
				err = u.WriteAt([]byte(fmt.Sprint("contents of ", i)), 0)
			}
			if err == nil {
				_, err = u.Commit(true, time.Time{}, "")
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	s.Close()
	s = open(t, dir)
	for i, f := range fids {
		want := fmt.Sprint("contents of ", i)
		buf := make([]byte, 64)
		k, st, err := s.ReadAt(f, buf, 0)
		if string(buf[:k]) != want || st.DataVersion != 2 {
			t.Fatalf("file %d after a restart: %q at version %d (%v), want %q at 2", i, buf[:k], st.DataVersion, err, want)
		}
	}
}
