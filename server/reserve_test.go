package server

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/vnode"
)

// Reservations outlive the session that made them (the store keeps them
// until the second start after), so the server's bound on them counts
// ended sessions too: reserving its most, reconnecting and reserving
// again grew the store without end.
func TestReservedBoundOutlivesSessions(t *testing.T) {
	store, v := testStore(t)
	s, as, a, b := twoClients(t, Local(store), store.Epoch())
	s.cfg.MaxReserved = 2 * vnode.MaxReserve
	req := &pb.ReserveRequest{Volume: v.ID, Count: vnode.MaxReserve, Dir: pb.FromFID(v.Root)}
	for range 2 {
		if _, err := s.Reserve(as(a), req); err != nil {
			t.Fatal(err)
		}
	}
	s.ended(a, s.conns[a], "")
	if _, err := s.Reserve(as(b), req); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a reservation past the server's bound, after its holder left: %v, want RESOURCE_EXHAUSTED", err)
	}
}

// Reserving needs the right to insert in the directory the files are
// for, and one user's reservations are bounded across their sessions:
// a low-privilege user filled the server's pool, and its store.
func TestReserveNeedsInsertBoundedPerUser(t *testing.T) {
	s, _ := newFuzzServer(t)
	store := s.store
	root, _ := store.VolumeByName(node.RootVolume)
	ids := sessions(s, 3)
	as := func(id callback.ClientID, user string) context.Context { return asIn(s, id, user) }
	req := &pb.ReserveRequest{Volume: root.ID, Count: vnode.MaxReserve, Dir: pb.FromFID(root.Root)}
	// bob has only the default rl at the root: no insert.
	if _, err := s.Reserve(as(ids[0], "bob"), req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("bob reserves where he may not insert: %v", err)
	}
	other := &pb.ReserveRequest{Volume: root.ID + 1, Count: 1, Dir: pb.FromFID(root.Root)}
	if _, err := s.Reserve(as(ids[0], "alice"), other); err == nil {
		t.Fatal("a reservation in another volume than its directory's")
	}
	// alice may insert: her sessions together stop at her bound.
	got := 0
	for i := 0; ; i++ {
		_, err := s.Reserve(as(ids[i%3], "alice"), req)
		if status.Code(err) == codes.ResourceExhausted {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if got += vnode.MaxReserve; got > MaxReservedPerUser {
			t.Fatalf("alice holds %d reserved fids across sessions, past %d", got, MaxReservedPerUser)
		}
	}
	if got != MaxReservedPerUser {
		t.Fatalf("alice stopped at %d, want %d", got, MaxReservedPerUser)
	}
}
