package client

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hoardfs/hoard/node"
)

// A listing kept through random adds and removes lists what a plain
// ordered model does, in the same order, across compactions.
func TestListingAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var es []DirEntry
	for i := range 100 {
		es = append(es, DirEntry{Name: fmt.Sprint("f", i), Type: node.TypeFile, FID: node.FID{Volume: 1, Vnode: uint64(i + 2), Unique: 1}})
	}
	l := completeListing(es)
	model := slices.Clone(es)
	for step := range 20000 {
		name := fmt.Sprint("f", rng.IntN(300))
		i := slices.IndexFunc(model, func(e DirEntry) bool { return e.Name == name })
		if rng.IntN(2) == 0 {
			e := DirEntry{Name: name, Type: node.TypeFile, FID: node.FID{Volume: 1, Vnode: uint64(1000 + step), Unique: 1}}
			l.add(name, e.FID, e.Type)
			if i >= 0 {
				model[i] = e // a new file under a known name keeps its place
			} else {
				model = append(model, e)
			}
		} else {
			l.del(name)
			if i >= 0 {
				model = slices.Delete(model, i, i+1)
			}
		}
		if d, ok := l.get(name); ok != slices.ContainsFunc(model, func(e DirEntry) bool { return e.Name == name }) || ok && d.fid != model[slices.IndexFunc(model, func(e DirEntry) bool { return e.Name == name })].FID {
			t.Fatalf("step %d: get(%s) = %v, %v", step, name, d, ok)
		}
		if step%97 == 0 {
			if got := l.entries(); !slices.Equal(got, model) {
				t.Fatalf("step %d: listing %v, want %v", step, got, model)
			}
		}
		if l.holes > len(l.order)/2 {
			t.Fatalf("step %d: %d holes in an order of %d", step, l.holes, len(l.order))
		}
	}
}

// A partial listing (names looked up) keeps no order and is not complete.
func TestListingPartial(t *testing.T) {
	var l *listing
	if _, ok := l.get("x"); ok || l.isComplete() {
		t.Fatal("a nil listing knows a name")
	}
	l = &listing{names: map[string]dirent{}}
	l.add("x", node.FID{Volume: 1, Vnode: 2, Unique: 1}, node.TypeFile)
	l.del("y")
	if _, ok := l.get("x"); !ok || l.isComplete() || len(l.order) != 0 {
		t.Fatalf("partial listing: %+v", l)
	}
}

func TestMadeListOrder(t *testing.T) {
	var m madeList
	ns := make([]*Node, 10)
	for i := range ns {
		ns[i] = &Node{fid: node.FID{Volume: 1, Vnode: uint64(i + 2), Unique: 1}}
		m.push(fmt.Sprint("f", i), ns[i], i == 7, User{})
	}
	m.remove(ns[3].fid)
	m.find(ns[5].fid).name = "renamed"
	if m.find(ns[3].fid) != nil {
		t.Fatal("a removed file is found")
	}
	got := m.first(3)
	if len(got) != 3 || got[0].n != ns[0] || got[2].n != ns[2] {
		t.Fatalf("first 3: %v", got)
	}
	m.dropFirst(4)
	if got := m.first(100); m.len() != 5 || got[0].name != "renamed" || got[4].n != ns[9] || !got[2].removed || got[1].removed {
		t.Fatalf("after dropping 4: %d left, %v", m.len(), got)
	}
}

// One settle is one user's: the files made by a user after the first
// one's wait for the next.
func TestMadeListFirstIsOneUsers(t *testing.T) {
	var m madeList
	alice, bob := NewUser("alice's token"), NewUser("bob's token")
	for i, u := range []User{alice, alice, bob, alice} {
		m.push(fmt.Sprint("f", i), &Node{fid: node.FID{Volume: 1, Vnode: uint64(i + 2), Unique: 1}}, false, u)
	}
	for _, want := range []struct {
		n int
		u User
	}{{2, alice}, {1, bob}, {1, alice}} {
		got := m.first(100)
		if len(got) != want.n || got[0].u != want.u {
			t.Fatalf("first: %d files of %v, want %d of %v", len(got), got[0].u.key, want.n, want.u.key)
		}
		m.dropFirst(len(got))
	}
}
