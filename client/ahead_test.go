package client

import (
	"fmt"
	"testing"

	"github.com/hoardfs/hoard/node"
)

// TestAheadLooksOncePerPass: opening a listing's files in order looks at
// each entry once, not the window's width each open (a warm tree of
// cached files paid 64 lookups an open for nothing), still fetches every
// file after the first opens ahead of its own open, and never more than
// the window's files ahead of the reader.
func TestAheadLooksOncePerPass(t *testing.T) {
	const n = 1000
	order := make([]string, n)
	for i := range order {
		order[i] = fmt.Sprint("f", i)
	}
	looked := 0
	file := func(name string) (node.FID, bool) {
		looked++
		var i uint32
		fmt.Sscan(name[1:], &i)
		return node.FID{Vnode: uint64(i)}, i%10 != 9 // every tenth is a directory
	}
	var a dirAhead
	ahead := map[uint64]int{} // file → the open that fetched it
	for at := range n {
		if at%10 == 9 {
			continue // not a file: never opened
		}
		for _, f := range a.step(at, order, file) {
			if _, dup := ahead[f.Vnode]; dup {
				t.Fatalf("open %d fetches %d again", at, f.Vnode)
			}
			ahead[f.Vnode] = at
		}
		past := 0
		for f := range ahead {
			if f > uint64(at) {
				past++
			}
		}
		if past > a.window || past > maxAhead {
			t.Fatalf("open %d: %d files fetched past it, window %d", at, past, a.window)
		}
	}
	if looked > n {
		t.Fatalf("looked at %d entries for one pass over %d", looked, n)
	}
	for i := 2; i < n; i++ {
		if i%10 == 9 {
			continue
		}
		if by, ok := ahead[uint64(i)]; !ok || by >= i {
			t.Fatalf("file %d: fetched ahead by open %d (%v)", i, by, ok)
		}
	}
	// Out of order: the window closes, and a new pass starts over.
	if next := a.step(5, order, file); next != nil {
		t.Fatalf("an open out of order fetched %v", next)
	}
	if next := a.step(6, order, file); len(next) == 0 || next[0].Vnode != 7 {
		t.Fatalf("the next pass fetches %v", next)
	}
}
