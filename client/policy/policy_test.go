package policy

import (
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

func TestDecide(t *testing.T) {
	yes := func() bool { return true }
	no := func() bool { return false }
	big := Facts{Size: 100 << 20, AutoMin: 32 << 20, Free: 10 << 20, UsedAgain: no, PartlyCached: no}
	with := func(edit func(*Facts)) Facts { f := big; edit(&f); return f }
	for _, tc := range []struct {
		name   string
		f      Facts
		bypass bool
		why    string
	}{
		{"large file, first use", big, true, "auto: large file, first use"},
		{"override on the file wins over all", with(func(f *Facts) { f.FileOverride, f.DirOverride, f.Name = Cache, Bypass, "__x" }), false, "override on the file"},
		{"file override auto is none", with(func(f *Facts) { f.FileOverride, f.DirOverride = Auto, Cache }), false, "override on its directory"},
		{"directory override", with(func(f *Facts) { f.DirOverride, f.Name = Bypass, "++x" }), true, "override on its directory"},
		{"++ name caches", with(func(f *Facts) { f.Name, f.Volume = "++x", "__v" }), false, "name starts with ++"},
		{"__ name bypasses", with(func(f *Facts) { f.Name, f.Size = "__x", 1 }), true, "name starts with __"},
		{"__ volume bypasses", with(func(f *Facts) { f.Volume, f.Size = "__v", 1 }), true, "volume __v"},
		{"at the threshold", with(func(f *Facts) { f.Threshold, f.Size = 10, 10 }), true, "size 10 ≥ threshold 10"},
		{"below the threshold", with(func(f *Facts) { f.Threshold, f.Size = 10, 9 }), false, "size 9 < threshold 10"},
		{"small file", with(func(f *Facts) { f.Size = 1 }), false, "auto: small file"},
		{"fits in free space", with(func(f *Facts) { f.Free = f.Size }), false, "auto: fits without evicting"},
		{"used again", with(func(f *Facts) { f.UsedAgain = yes }), false, "auto: used again within the window"},
		{"partly cached", with(func(f *Facts) { f.PartlyCached = yes }), false, "auto: partly cached already"},
	} {
		d := Decide(tc.f)
		if d.Bypass != tc.bypass || d.Why != tc.why || d.Probation != (tc.why == "auto: large file, first use") {
			t.Errorf("%s: got %+v, want bypass=%v why=%q", tc.name, d, tc.bypass, tc.why)
		}
	}
}

// The ghost list is asked only when the rules reach it: asking counts a use.
func TestDecideAsksUseLast(t *testing.T) {
	asked := false
	f := Facts{Name: "__x", UsedAgain: func() bool { asked = true; return false }, PartlyCached: func() bool { asked = true; return false }}
	Decide(f)
	if asked {
		t.Fatal("a rule before auto decided, yet the use was recorded")
	}
}

func TestForDirectory(t *testing.T) {
	for _, o := range []string{"", Auto} {
		if d := ForDirectory(o); d.Bypass {
			t.Errorf("%q: %+v", o, d)
		}
	}
	if d := ForDirectory(Bypass); !d.Bypass {
		t.Errorf("bypass: %+v", d)
	}
	if d := ForDirectory(Cache); d.Bypass {
		t.Errorf("cache: %+v", d)
	}
}

func TestGhosts(t *testing.T) {
	g := NewGhosts(2, time.Minute)
	at := time.Unix(1000, 0)
	a, b, c := node.FID{Vnode: 1}, node.FID{Vnode: 2}, node.FID{Vnode: 3}
	if g.Use(a, at, false) {
		t.Fatal("unseen file used before")
	}
	if g.Use(a, at, true) {
		t.Fatal("first use reported as a second")
	}
	if !g.Use(a, at.Add(time.Minute), true) {
		t.Fatal("second use within the window not seen")
	}
	if g.Use(a, at.Add(3*time.Minute), false) {
		t.Fatal("a use past the window counted")
	}
	g.Use(b, at, true)
	g.Use(c, at, true) // a, the oldest, is forgotten
	if g.Use(a, at.Add(time.Minute), false) {
		t.Fatal("the list kept more than its bound")
	}
	if !g.Use(c, at.Add(time.Second), false) {
		t.Fatal("the newest file was forgotten")
	}
}
