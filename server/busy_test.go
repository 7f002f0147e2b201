package server

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server/session"
)

// heldRename is a store whose renames wait, before they are applied,
// until release: a rename stays under way, its recalls done, as long as
// the test needs.
type heldRename struct {
	Backend
	entered, release chan struct{}
}

func (h heldRename) Rename(src node.FID, sname string, dst node.FID, dname, keep string, op node.Op) (node.RenameResult, error) {
	close(h.entered)
	<-h.release
	return h.Backend.Rename(src, sname, dst, dname, keep, op)
}

// No delegation is granted on a file while a rename that replaces it is
// under way: it could only be recalled after the file was gone, and its
// holder's writes, acknowledged by close, would be refused (seen through
// a proxy: a client's write to a file another client renamed over went
// to lost/ while the client still read the file).
func TestNoDelegationOnAFileBeingReplaced(t *testing.T) {
	store, v := testStore(t)
	victim, _, _, err := store.Create(v.Root, "f", node.TypeFile, node.Attr{Mode: 0o644}, "", true, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := store.Create(v.Root, "g", node.TypeFile, node.Attr{Mode: 0o644}, "", true, ""); err != nil {
		t.Fatal(err)
	}
	held := heldRename{Local(store), make(chan struct{}), make(chan struct{})}
	s, as, a, b := twoClients(t, held, store.Epoch())
	renamed := make(chan error, 1)
	go func() {
		_, err := s.Rename(as(a), &pb.RenameRequest{SrcDir: pb.FromFID(v.Root), SrcName: "g", DstDir: pb.FromFID(v.Root), DstName: "f"})
		renamed <- err
	}()
	<-held.entered
	reply, err := s.Open(as(b), &pb.OpenRequest{Fid: pb.FromFID(victim.FID), Write: true})
	close(held.release)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Kind != pb.DelegKind_DELEG_NONE {
		t.Fatalf("an open of the file a rename is replacing got delegation %v (state %d)", reply.Kind, reply.State)
	}
	if err := <-renamed; err != nil {
		t.Fatal(err)
	}
}

// twoClients starts a server on backend, with two clients connected to
// its callback machine, and as, which makes a request's context for one.
func twoClients(t *testing.T, backend Backend, epoch uint64) (s *Server, as func(callback.ClientID) context.Context, a, b callback.ClientID) {
	cfg := DefaultConfig()
	cfg.Grace, cfg.BreakTimeout = 0, 50*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s = New(backend, cfg)
	t.Cleanup(s.Shutdown)
	s.mu.Lock()
	a, b = s.cb.Connect("a", 0, time.Now()), s.cb.Connect("b", 0, time.Now())
	for _, id := range []callback.ClientID{a, b} {
		s.conns[id] = &conn{out: make(chan *pb.ServerMsg, 64), cancel: func() {}}
	}
	s.mu.Unlock()
	as = func(id callback.ClientID) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(pb.ClientMetadata, s.key.Make(session.Token{Epoch: epoch, ID: id, Line: id})))
	}
	return s, as, a, b
}

// takenBack is a backend (a proxy's, say) whose delegations are taken
// back, once asked for, before the server can grant them on.
type takenBack struct{ Backend }

func (takenBack) Delegation(node.FID, bool) (callback.DelegKind, func() bool) {
	return callback.DelegWrite, func() bool { return false }
}

// A delegation the backend no longer holds when the server is about to
// grant it is not granted: a proxy's origin recalled it meanwhile, and
// the proxy's recall of its own clients may already have passed (found
// by the checker through a proxy: two clients each wrote as if alone).
func TestNoDelegationTakenBackMeanwhile(t *testing.T) {
	store, v := testStore(t)
	f, _, _, err := store.Create(v.Root, "f", node.TypeFile, node.Attr{Mode: 0o644}, "", true, "")
	if err != nil {
		t.Fatal(err)
	}
	s, as, a, _ := twoClients(t, takenBack{Local(store)}, store.Epoch())
	reply, err := s.Open(as(a), &pb.OpenRequest{Fid: pb.FromFID(f.FID), Write: true})
	if err != nil || reply.Kind != pb.DelegKind_DELEG_NONE {
		t.Fatalf("open for writing: delegation %v, %v; want none", reply.GetKind(), err)
	}
	created, err := s.Create(as(a), &pb.CreateRequest{Dir: pb.FromFID(v.Root), Name: "g", Type: pb.FromType(node.TypeFile), Mode: 0o644, Open: true})
	if err != nil || !created.Created || created.Kind != pb.DelegKind_DELEG_NONE {
		t.Fatalf("create with open: %+v, %v; want made, no delegation", created, err)
	}

	// The same backend, holding on: the open gets one.
	s, as, a, _ = twoClients(t, Local(store), store.Epoch())
	if reply, err := s.Open(as(a), &pb.OpenRequest{Fid: pb.FromFID(f.FID), Write: true}); err != nil || reply.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("open for writing with the delegation held: %v, %v", reply.GetKind(), err)
	}
}

// A create that opens its file for its maker records no open when it
// grants no delegation: the maker did not get one and opens the file as
// any other client does, so an open recorded by the create would never be
// closed, and would keep every other client from a delegation on it.
func TestCreateRecordsNoOpenWithoutDelegation(t *testing.T) {
	store, v := testStore(t)
	g, _, _, err := store.Create(v.Root, "g", node.TypeFile, node.Attr{Mode: 0o644}, "", true, "")
	if err != nil {
		t.Fatal(err)
	}
	s, as, a, b := twoClients(t, Local(store), store.Epoch())
	// a takes g's write delegation and lets b's recall of it run out: a
	// gets no delegation for a while (RecallBackoff).
	if r, err := s.Open(as(a), &pb.OpenRequest{Fid: pb.FromFID(g.FID), Write: true}); err != nil || r.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("a's open: %v %v", r, err)
	}
	if _, err := s.Open(as(b), &pb.OpenRequest{Fid: pb.FromFID(g.FID), Write: true}); err != nil {
		t.Fatal(err)
	}
	created, err := s.Create(as(a), &pb.CreateRequest{Dir: pb.FromFID(v.Root), Name: "h", Type: pb.FromType(node.TypeFile), Mode: 0o644, Open: true})
	if err != nil {
		t.Fatal(err)
	}
	if created.Kind != pb.DelegKind_DELEG_NONE {
		t.Fatalf("a client backing off got delegation %v", created.Kind)
	}
	r, err := s.Open(as(b), &pb.OpenRequest{Fid: created.Status.Fid, Write: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("b's open of h got delegation %v: the create recorded an open for a that nobody closes", r.Kind)
	}
}
