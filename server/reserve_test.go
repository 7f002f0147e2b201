package server

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/hoardfs/hoard/hoardpb"
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
	req := &pb.ReserveRequest{Volume: v.ID, Count: vnode.MaxReserve}
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
