package client_test

import (
	"slices"
	"syscall"
	"testing"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
)

// Extended attributes are kept under the promise: asked of the server
// once, then answered from the node, absent names too; another client's
// change reaches this one before that change returns, and this one's own
// change is seen at once.
func TestXattrsKeptUnderPromise(t *testing.T) {
	s := servertest.Start(t)
	w := s.Dial(t)
	testkit.WriteFile(t, w, "/f", []byte("f"))
	testkit.Must(t, w.Close()) // stores it and gives back its delegation
	a := s.Dial(t)
	b := s.Dial(t, servertest.MemCache())
	ka, kb := a.Client().Nodes(), b.Client().Nodes()
	na, _, err := ka.Lookup(root(t, ka), "f")
	testkit.Must(t, err)
	_, err = ka.SetXattr(na, "user.x", []byte("1"), 0)
	testkit.Must(t, err)
	nb, _, err := kb.Lookup(root(t, kb), "f")
	testkit.Must(t, err)

	want := func(what, name, value string) {
		t.Helper()
		v, err := kb.GetXattr(nb, name)
		switch {
		case value == "" && client.Errno(err) != syscall.ENODATA:
			t.Fatalf("%s: %s = %q, %v; want ENODATA", what, name, v, err)
		case value != "" && (err != nil || string(v) != value):
			t.Fatalf("%s: %s = %q, %v; want %q", what, name, v, err, value)
		}
	}
	wantList := func(what string, names ...string) {
		t.Helper()
		got, err := kb.ListXattr(nb)
		if err != nil || !slices.Equal(got, names) {
			t.Fatalf("%s: list = %q, %v; want %q", what, got, err, names)
		}
	}
	asked := b.Client().Stats().RPCs
	want("first get", "user.x", "1")
	want("first get of an absent name", "user.none", "")
	wantList("first list", "user.x")
	if n := b.Client().Stats().RPCs - asked; n != 3 {
		t.Fatalf("the first get, absent get and list sent %d requests, want 3", n)
	}
	asked = b.Client().Stats().RPCs
	for range 3 {
		want("kept get", "user.x", "1")
		wantList("kept list", "user.x")
		want("kept get of an absent name", "user.none", "")
		want("a name the kept list lacks", "user.other", "")
	}
	if n := b.Client().Stats().RPCs - asked; n != 0 {
		t.Fatalf("answers kept under the promise sent %d requests, want 0", n)
	}

	_, err = ka.SetXattr(na, "user.x", []byte("2"), 0)
	testkit.Must(t, err)
	want("after another client's set", "user.x", "2")
	_, err = ka.RemoveXattr(na, "user.x")
	testkit.Must(t, err)
	want("after another client's remove", "user.x", "")
	wantList("after another client's remove")
	_, err = kb.SetXattr(nb, "user.y", []byte("y"), 0)
	testkit.Must(t, err)
	wantList("after its own set", "user.y")
	want("after its own set", "user.y", "y")
}
