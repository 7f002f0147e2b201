package client_test

import (
	"testing"

	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// Files named by the entries the client holds, across a mount point,
// all levels found in one call; a file never looked up is left out.
func TestPaths(t *testing.T) {
	s := startServer(t)
	a := s.dial(t)
	_, err := a.Admin().CreateVolume("proj")
	must(t, err)
	must(t, a.Admin().MountVolume("/proj", "proj"))
	must(t, a.Mkdir("/d", 0o755))
	must(t, a.Mkdir("/proj/src", 0o755))
	testkit.WriteFile(t, a, "/d/f", []byte("f"))
	testkit.WriteFile(t, a, "/proj/src/g", []byte("g"))

	b := s.dial(t, memCache())
	fid := func(name string) node.FID {
		st, err := b.Stat(name)
		must(t, err)
		return st.FID
	}
	f, g, d := fid("/d/f"), fid("/proj/src/g"), fid("/d")
	unknown := node.FID{Volume: f.Volume, Vnode: 1 << 40, Unique: 1}
	got := b.Cache().Paths([]node.FID{f, g, d, unknown})
	want := map[node.FID]string{f: "/d/f", g: "/proj/src/g", d: "/d"}
	if len(got) != len(want) {
		t.Fatalf("Paths = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("Paths[%v] = %q, want %q", k, got[k], v)
		}
	}
}
