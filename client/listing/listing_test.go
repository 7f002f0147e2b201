package listing

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hoardfs/hoard/node"
)

func fid(v uint64) node.FID { return node.FID{Volume: 1, Vnode: v, Unique: 1} }

// names is a listing's names in order, through All.
func names(l *Listing) []string {
	var out []string
	for name, e := range l.All() {
		if l.Order()[e.At] != name {
			panic(fmt.Sprintf("%s is at %d, where Order has %q", name, e.At, l.Order()[e.At]))
		}
		out = append(out, name)
	}
	return out
}

// op is one change to a listing: Add name with fid vnode v, or (v 0) Del.
type op struct {
	name string
	v    uint64
}

func TestListing(t *testing.T) {
	for _, tc := range []struct {
		what     string
		partial  bool
		ops      []op
		want     []string          // All's names, in order (complete listings)
		fids     map[string]uint64 // Get's answers; 0: not found
		holesMax int
	}{
		{what: "empty", want: nil, fids: map[string]uint64{"a": 0}},
		{what: "adds keep their order", ops: []op{{"c", 2}, {"a", 3}, {"b", 4}},
			want: []string{"c", "a", "b"}, fids: map[string]uint64{"a": 3, "b": 4, "c": 2}},
		{what: "a new file under a known name keeps its place", ops: []op{{"a", 2}, {"b", 3}, {"a", 9}},
			want: []string{"a", "b"}, fids: map[string]uint64{"a": 9}},
		{what: "del leaves a hole", ops: []op{{"a", 2}, {"b", 3}, {"c", 4}, {"b", 0}},
			want: []string{"a", "c"}, fids: map[string]uint64{"b": 0, "c": 4}, holesMax: 1},
		{what: "del of an unknown name changes nothing", ops: []op{{"a", 2}, {"x", 0}},
			want: []string{"a"}, fids: map[string]uint64{"a": 2}},
		{what: "a name removed and made again goes last", ops: []op{{"a", 2}, {"b", 3}, {"c", 4}, {"a", 0}, {"a", 5}},
			want: []string{"b", "c", "a"}, fids: map[string]uint64{"a": 5}, holesMax: 1},
		{what: "compacted once holes are more than half", ops: []op{{"a", 2}, {"b", 3}, {"c", 4}, {"d", 5}, {"a", 0}, {"b", 0}, {"c", 0}},
			want: []string{"d"}, fids: map[string]uint64{"d": 5}},
		{what: "all removed", ops: []op{{"a", 2}, {"b", 3}, {"a", 0}, {"b", 0}},
			want: nil, fids: map[string]uint64{"a": 0, "b": 0}},
		{what: "partial: lookups, no order", partial: true, ops: []op{{"x", 2}, {"y", 3}, {"y", 0}, {"z", 0}},
			fids: map[string]uint64{"x": 2, "y": 0}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			l := Complete(len(tc.ops))
			if tc.partial {
				l = &Listing{}
			}
			for _, o := range tc.ops {
				if o.v == 0 {
					l.Del(o.name)
				} else {
					l.Add(o.name, fid(o.v), node.TypeFile)
				}
			}
			if l.IsComplete() == tc.partial {
				t.Errorf("IsComplete = %v", l.IsComplete())
			}
			if got := names(l); !slices.Equal(got, tc.want) {
				t.Errorf("All: %v, want %v", got, tc.want)
			}
			if l.Len() != len(tc.want) && !tc.partial {
				t.Errorf("Len = %d, want %d", l.Len(), len(tc.want))
			}
			for name, v := range tc.fids {
				e, ok := l.Get(name)
				if ok != (v != 0) || ok && (e.FID != fid(v) || e.Type != node.TypeFile) {
					t.Errorf("Get(%s) = %+v, %v; want vnode %d", name, e, ok, v)
				}
			}
			if l.holes > tc.holesMax || l.holes > len(l.order)/2 {
				t.Errorf("%d holes in an order of %d", l.holes, len(l.order))
			}
		})
	}
}

// A nil listing knows nothing, and is not complete.
func TestNilListing(t *testing.T) {
	var l *Listing
	if _, ok := l.Get("x"); ok || l.IsComplete() {
		t.Fatal("a nil listing knows a name")
	}
}

// A listing kept through random adds and removes lists what a plain
// ordered model does, in the same order, across compactions.
func TestListingAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	type ent struct {
		name string
		fid  node.FID
	}
	l := Complete(100)
	var model []ent
	for i := range 100 {
		model = append(model, ent{fmt.Sprint("f", i), fid(uint64(i + 2))})
		l.Add(model[i].name, model[i].fid, node.TypeFile)
	}
	for step := range 20000 {
		name := fmt.Sprint("f", rng.IntN(300))
		i := slices.IndexFunc(model, func(e ent) bool { return e.name == name })
		if rng.IntN(2) == 0 {
			e := ent{name, fid(uint64(1000 + step))}
			l.Add(name, e.fid, node.TypeFile)
			if i >= 0 {
				model[i] = e
			} else {
				model = append(model, e)
				i = len(model) - 1
			}
		} else {
			l.Del(name)
			if i >= 0 {
				model = slices.Delete(model, i, i+1)
				i = -1
			}
		}
		if d, ok := l.Get(name); ok != (i >= 0) || ok && d.FID != model[i].fid {
			t.Fatalf("step %d: Get(%s) = %v, %v", step, name, d, ok)
		}
		if step%97 == 0 {
			var got []ent
			for name, e := range l.All() {
				got = append(got, ent{name, e.FID})
			}
			if !slices.Equal(got, model) {
				t.Fatalf("step %d: listing %v, want %v", step, got, model)
			}
		}
		if l.holes > len(l.order)/2 {
			t.Fatalf("step %d: %d holes in an order of %d", step, l.holes, len(l.order))
		}
	}
}

// file stands for the client's node.
type file struct{ fid node.FID }

func (f *file) FID() node.FID { return f.fid }

// push is one file queued: f's index, its name, removed, by whom.
type push struct {
	f       int
	name    string
	removed bool
	u       string
}

func TestMade(t *testing.T) {
	for _, tc := range []struct {
		what   string
		pushes []push
		remove []int // files removed after the pushes (7: never pushed)
		rename map[int]string
		n      int    // Len then
		first  int    // First(first) is want
		want   []push // the queue's front, at least drop files of it unless all
		drop   int    // then DropFirst(drop)
		left   []push // First(100) after it
	}{
		{what: "empty", first: 5, drop: 2},
		{what: "in order", pushes: []push{{0, "a", false, "u"}, {1, "b", true, "u"}, {2, "c", false, "u"}},
			n: 3, first: 2, want: []push{{0, "a", false, "u"}, {1, "b", true, "u"}},
			drop: 1, left: []push{{1, "b", true, "u"}, {2, "c", false, "u"}}},
		{what: "removed ones are gone", pushes: []push{{0, "a", false, "u"}, {1, "b", false, "u"}, {2, "c", false, "u"}},
			remove: []int{1, 7}, n: 2, first: 10, want: []push{{0, "a", false, "u"}, {2, "c", false, "u"}},
			drop: 1, left: []push{{2, "c", false, "u"}}},
		{what: "a rename changes the name in place", pushes: []push{{0, "a", false, "u"}, {1, "b", false, "u"}},
			rename: map[int]string{0: "z"}, n: 2, first: 10, want: []push{{0, "z", false, "u"}, {1, "b", false, "u"}},
			drop: 5},
		{what: "one user's at a time", pushes: []push{{0, "a", false, "alice"}, {1, "b", false, "alice"}, {2, "c", false, "bob"}, {3, "d", false, "alice"}},
			n: 4, first: 10, want: []push{{0, "a", false, "alice"}, {1, "b", false, "alice"}},
			drop: 2, left: []push{{2, "c", false, "bob"}}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			files := make([]*file, 8)
			for i := range files {
				files[i] = &file{fid(uint64(i + 2))}
			}
			var m Made[*file, string]
			for _, p := range tc.pushes {
				m.Push(p.name, files[p.f], p.removed, p.u)
			}
			for _, i := range tc.remove {
				m.Remove(files[i].fid)
				if m.Find(files[i].fid) != nil {
					t.Errorf("file %d found after Remove", i)
				}
			}
			for i, name := range tc.rename {
				m.Find(files[i].fid).Name = name
			}
			if m.Len() != tc.n {
				t.Errorf("Len = %d, want %d", m.Len(), tc.n)
			}
			check := func(what string, got []MadeFile[*file, string], want []push) {
				t.Helper()
				if len(got) != len(want) {
					t.Fatalf("%s: %d files, want %d", what, len(got), len(want))
				}
				for i, w := range want {
					if g := got[i]; g.Node != files[w.f] || g.Name != w.name || g.Removed != w.removed || g.User != w.u {
						t.Errorf("%s[%d] = %+v, want %+v", what, i, g, w)
					}
				}
			}
			check("First", m.First(tc.first), tc.want)
			m.DropFirst(tc.drop)
			if want := max(tc.n-tc.drop, 0); m.Len() != want {
				t.Errorf("Len after DropFirst = %d, want %d", m.Len(), want)
			}
			for _, p := range tc.want[:min(tc.drop, len(tc.want))] {
				if m.Find(files[p.f].fid) != nil {
					t.Errorf("file %d found after DropFirst", p.f)
				}
			}
			check("after DropFirst", m.First(100), tc.left)
		})
	}
}
