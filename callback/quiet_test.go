package callback

import (
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

// A quiet volume gets no promise and no delegation, and Quiesce names
// what was held on it, and only on it.
func TestQuiesce(t *testing.T) {
	now := time.Unix(1000, 0)
	s := NewServer(1, Config{PromiseTTL: time.Minute, BreakTimeout: time.Second, Lease: 30 * time.Second, Dirs: DirAny})
	a := s.Connect("a", 0, now)
	b := s.Connect("b", 0, now)
	f1 := node.FID{Volume: 2, Vnode: 3, Unique: 1}
	f2 := node.FID{Volume: 2, Vnode: 5, Unique: 1}
	other := node.FID{Volume: 3, Vnode: 3, Unique: 1}
	for _, f := range []node.FID{f1, other} {
		if _, _, ok := s.Grant(a, f, 0, now); !ok {
			t.Fatalf("grant on %v refused", f)
		}
	}
	if res, _ := s.Open(b, f2, true, now); res.Kind != DelegWrite {
		t.Fatalf("open of f2: %+v, want a write delegation", res)
	}
	held := s.Quiesce(2)
	if len(held) != 2 || held[0] != f1 || held[1] != f2 {
		t.Fatalf("held on the quiet volume: %v, want %v and %v", held, f1, f2)
	}
	if _, _, ok := s.Grant(b, f1, 0, now); ok {
		t.Fatal("a promise granted on a quiet volume")
	}
	if res, _ := s.Open(a, node.FID{Volume: 2, Vnode: 9, Unique: 1}, true, now); res.Kind != DelegNone {
		t.Fatalf("open on a quiet volume: %+v, want no delegation", res)
	}
	if s.DirDelegable(a, node.FID{Volume: 2, Vnode: 1, Unique: 1}, now) {
		t.Fatal("a directory delegation on a quiet volume")
	}
	if _, _, ok := s.Grant(b, other, 0, now); !ok {
		t.Fatal("a promise on another volume refused")
	}
	s.Resume(2)
	if _, _, ok := s.Grant(b, f1, 0, now); !ok {
		t.Fatal("a promise refused after Resume")
	}
}
