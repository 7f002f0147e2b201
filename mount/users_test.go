package mount

import (
	"context"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/user"
)

func callerCtx(uid uint32) context.Context {
	return &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: uid}}}
}

// Each local user acts with their own token, the one who started the
// mount with the mount's, anyone else anonymously.
func TestUsersMulti(t *testing.T) {
	own, alice, bob := user.New("mount's"), user.New("alice's"), user.New("bob's")
	r := newUsers(new(client.Nodes).As(own), 0, false)
	if err := r.set(1001, alice); err != nil {
		t.Fatal(err)
	}
	if err := r.set(1002, bob); err != nil {
		t.Fatal(err)
	}
	for uid, want := range map[uint32]user.User{0: own, 1001: alice, 1002: bob, 1003: {}} {
		if got := r.of(callerCtx(uid)).User(); got != want {
			t.Errorf("uid %d acts as %v, want %v", uid, got, want)
		}
	}
	if err := r.drop(1002); err != nil {
		t.Fatal(err)
	}
	if !r.of(callerCtx(1002)).User().Anonymous() || r.of(callerCtx(1001)).User() != alice {
		t.Errorf("after bob's logout: bob %v, alice %v", r.of(callerCtx(1002)).User(), r.of(callerCtx(1001)).User())
	}
	if err := r.drop(0); err != nil || !r.of(callerCtx(0)).User().Anonymous() {
		t.Errorf("the mount's starter logged out: %v, acts as %v", err, r.of(callerCtx(0)).User())
	}
}

// A single-user mount acts for everyone with its own token, which only
// the one who started it changes.
func TestUsersSingle(t *testing.T) {
	own, alice := user.New("mount's"), user.New("alice's")
	r := newUsers(new(client.Nodes).As(own), 1000, true)
	if err := r.set(1001, alice); err == nil {
		t.Fatal("another uid set the token of a single-user mount")
	}
	if err := r.drop(1001); err == nil {
		t.Fatal("another uid logged a single-user mount out")
	}
	for _, uid := range []uint32{0, 1000, 1001} {
		if got := r.of(callerCtx(uid)).User(); got != own {
			t.Errorf("uid %d acts as %v, want the mount's", uid, got)
		}
	}
	if err := r.set(1000, alice); err != nil || r.of(callerCtx(0)).User() != alice {
		t.Errorf("the starter's new token: %v; uid 0 acts as %v", err, r.of(callerCtx(0)).User())
	}
}
