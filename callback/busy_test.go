package callback

import (
	"testing"

	"github.com/hoardfs/hoard/node"
)

// No delegation is granted on a FID while a change to it is under way;
// changes overlap, and the last one to end frees it.
func TestBusyRefusesDelegations(t *testing.T) {
	one := []node.FID{fid(1)}
	for _, tc := range []struct {
		name       string
		begin, end int // changes to fid(1) begun and ended before the open
		elsewhere  bool
		want       DelegKind
	}{
		{"no change under way", 0, 0, false, DelegWrite},
		{"a change under way", 1, 0, false, DelegNone},
		{"one of two changes ended", 2, 1, false, DelegNone},
		{"both ended", 2, 2, false, DelegWrite},
		{"a change to another file", 1, 0, true, DelegWrite},
	} {
		s := NewServer(1, dcfg())
		a := s.Connect("", 0, t0)
		fids := one
		if tc.elsewhere {
			fids = []node.FID{fid(2)}
		}
		for range tc.begin {
			s.BeginChange(fids)
		}
		for range tc.end {
			s.EndChange(fids)
		}
		if got := s.Delegable(a, fid(1), true, t0); got != (tc.want != DelegNone) {
			t.Errorf("%s: delegable %v", tc.name, got)
		}
		if r := open(t, s, a, fid(1), true, t0); r.Kind != tc.want || r.Recorded != (tc.want == DelegNone) {
			t.Errorf("%s: open %+v, want %v", tc.name, r, tc.want)
		}
	}
}

// A change under way takes no delegation away: one held still covers the
// holder's opens. A change ended more often than begun leaves no debt.
func TestBusyKeepsHeldAndCountsFromZero(t *testing.T) {
	s := NewServer(1, dcfg())
	a := s.Connect("", 0, t0)
	one := []node.FID{fid(1)}
	held := open(t, s, a, fid(1), true, t0)
	s.BeginChange(one)
	if r := open(t, s, a, fid(1), true, t0); r != held {
		t.Fatalf("open under a held delegation during a change: %+v, want %+v", r, held)
	}
	s.EndChange(one)
	two := []node.FID{fid(2)}
	s.BeginChange(two)
	s.EndChange(two)
	s.EndChange(two)
	s.BeginChange(two)
	if s.Delegable(a, fid(2), true, t0) {
		t.Fatal("a change begun after one ended twice does not count")
	}
	if len(s.busy) != 1 {
		t.Fatalf("busy %v: ended changes left behind", s.busy)
	}
}
