package callback

import (
	"testing"

	"github.com/hoardfs/hoard/node"
)

func TestDelegates(t *testing.T) {
	for _, tc := range []struct {
		name        string
		id          ClientID
		typ         node.Type
		write, only bool
		want        bool
	}{
		{"a file, read", 1, node.TypeFile, false, false, true},
		{"a file, delegation alone", 1, node.TypeFile, true, true, true},
		{"no session", 0, node.TypeFile, true, false, false},
		{"a directory, write delegation alone", 1, node.TypeDir, true, true, true},
		{"a directory opened for writing", 1, node.TypeDir, true, false, false},
		{"a directory, read delegation alone", 1, node.TypeDir, false, true, false},
		{"a directory, no session", 0, node.TypeDir, true, true, false},
		{"a symlink", 1, node.TypeSymlink, true, true, false},
	} {
		if got := Delegates(tc.id, tc.typ, tc.write, tc.only); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDirDelegable(t *testing.T) {
	dir := fid(1)
	promise := func(s *Server, id ClientID) {
		if _, _, ok := s.Grant(id, dir, s.Seq(), t0); !ok {
			t.Fatal("grant refused")
		}
	}
	for _, tc := range []struct {
		name   string
		policy DirPolicy
		lease  bool
		setup  func(s *Server, a, b ClientID)
		want   bool
	}{
		{"private, nobody else", DirPrivate, true, nil, true},
		{"private, its own promise", DirPrivate, true, func(s *Server, a, _ ClientID) { promise(s, a) }, true},
		{"private, another's promise", DirPrivate, true, func(s *Server, _, b ClientID) { promise(s, b) }, false},
		{"any, another's promise", DirAny, true, func(s *Server, _, b ClientID) { promise(s, b) }, true},
		{"none", DirNone, true, nil, false},
		{"unset", "", true, nil, false},
		{"no lease", DirAny, false, nil, false},
		{"a change under way", DirAny, true, func(s *Server, _, _ ClientID) { s.BeginChange([]node.FID{dir}) }, false},
		{"another's read delegation", DirAny, true, func(s *Server, _, b ClientID) { s.Open(b, dir, false, t0) }, false},
		{"another's open", DirAny, true, func(s *Server, _, b ClientID) { s.OpenWith(b, dir, Opening{}, t0) }, false},
		{"its own read delegation, upgraded", DirPrivate, true, func(s *Server, a, _ ClientID) { s.Open(a, dir, false, t0) }, true},
		{"its own write delegation, kept under none", DirNone, true, func(s *Server, a, _ ClientID) { s.Open(a, dir, true, t0) }, true},
		{"its own write delegation, another's promise since", DirPrivate, true, func(s *Server, a, b ClientID) {
			s.Open(a, dir, true, t0)
			promise(s, b)
		}, true},
		{"its own write delegation, a change under way", DirAny, true, func(s *Server, a, _ ClientID) {
			s.Open(a, dir, true, t0)
			s.BeginChange([]node.FID{dir})
		}, false},
	} {
		c := cfg()
		if tc.lease {
			c = dcfg()
		}
		c.Dirs = tc.policy
		s := NewServer(1, c)
		a, b := s.Connect("a", 0, t0), s.Connect("b", 0, t0)
		if tc.setup != nil {
			tc.setup(s, a, b)
		}
		if got := s.DirDelegable(a, dir, t0); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
