package site

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// server is a fake file server: Reserve, Locate and Renew, counted.
type server struct {
	pb.FileServerClient
	reserves, locates, renews atomic.Int64
	// where answers Locate; fids is how many FIDs a Reserve hands out.
	where func(*pb.LocateRequest) *pb.Location
	fids  int
	next  atomic.Uint64
	gate  chan struct{} // when set, Reserve waits for it
}

func (s *server) Reserve(_ context.Context, in *pb.ReserveRequest, _ ...grpc.CallOption) (*pb.ReserveReply, error) {
	s.reserves.Add(1)
	if s.gate != nil {
		<-s.gate
	}
	out := &pb.ReserveReply{}
	for range s.fids {
		out.Fids = append(out.Fids, pb.FromFID(node.FID{Volume: in.Volume, Vnode: s.next.Add(1), Unique: 1}))
	}
	return out, nil
}

func (s *server) Locate(_ context.Context, in *pb.LocateRequest, _ ...grpc.CallOption) (*pb.Location, error) {
	s.locates.Add(1)
	return s.where(in), nil
}

func (s *server) Renew(context.Context, *pb.RenewRequest, ...grpc.CallOption) (*pb.RenewReply, error) {
	s.renews.Add(1)
	return &pb.RenewReply{}, nil
}

// link calls at once; down makes it unreachable.
type link struct{ down atomic.Bool }

func (l *link) As(string) Caller { return l }
func (l *link) Call(fn func(ctx context.Context) error) error {
	if l.down.Load() {
		return errors.New("unreachable")
	}
	return fn(context.Background())
}
func (l *link) CallData(fn func(ctx context.Context) error) error           { return l.Call(fn) }
func (l *link) CallOnce(_ string, fn func(ctx context.Context) error) error { return l.Call(fn) }
func (l *link) CallPatient(_ time.Duration, fn func(ctx context.Context) error) error {
	return l.Call(fn)
}
func (l *link) Ready() bool                           { return !l.down.Load() }
func (l *link) AwaitReady(time.Time) error            { return nil }
func (l *link) Data() datapath.Path                   { return nil }
func (l *link) Session() string                       { return "" }
func (l *link) AwaitSession(string, time.Time) string { return "" }
func (l *link) GiveUp(time.Time)                      {}
func (l *link) GiveUpAt() time.Time                   { return time.Time{} }
func (l *link) RPCs() int64                           { return 0 }
func (l *link) Close()                                {}

func newSite(srv *server) *Site { return New("s:1", "", &link{}, srv, false, nil) }

// FIDs are reserved in batches, one Reserve at a time per volume however
// many ask, and those of a server's earlier life are never handed out.
func TestReservedBatchesAndLives(t *testing.T) {
	srv := &server{fids: 4, gate: make(chan struct{})}
	s := newSite(srv)
	s.Welcome(&pb.Welcome{Epoch: 1})
	dir := node.FID{Volume: 9, Vnode: 1, Unique: 1}
	var wg sync.WaitGroup
	got := make(chan node.FID, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, life, err := s.Reserved(dir, "")
			if err != nil || life != 1 {
				t.Errorf("reserved: %v life %d", err, life)
			}
			got <- f
		}()
	}
	for srv.reserves.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(srv.gate)
	wg.Wait()
	close(got)
	seen := map[node.FID]bool{}
	for f := range got {
		if seen[f] {
			t.Fatalf("FID %v handed out twice", f)
		}
		seen[f] = true
	}
	if n := srv.reserves.Load(); n != 1 {
		t.Fatalf("%d Reserves for 4 FIDs of one batch, want 1", n)
	}
	f, life, _ := s.Reserved(dir, "") // a second batch
	s.Welcome(&pb.Welcome{Epoch: 2})  // the server restarted
	s.Unreserve(f, life)              // of the old life: dropped
	g, life2, _ := s.Reserved(dir, "")
	if life2 != 2 || g == f {
		t.Fatalf("after a restart got %v of life %d, want a new FID of life 2", g, life2)
	}
}

// Delegations lapse with the lease: Answered and KeepLease hand them
// back once it ran out, and KeepLease renews while a third is left.
func TestLeaseLapseAndRenewal(t *testing.T) {
	srv := &server{}
	s := newSite(srv)
	s.Welcome(&pb.Welcome{Epoch: 1, LeaseMs: 30_000})
	if !s.Delegating() || s.Lease() != 30*time.Second {
		t.Fatalf("delegating %v lease %v", s.Delegating(), s.Lease())
	}
	fid := node.FID{Volume: 1, Vnode: 2, Unique: 1}
	// An Open's reply: the call answered (extending the lease), then the
	// delegation it granted installed.
	tk := s.Begin()
	now := time.Now()
	if lapsed := s.Answered(now); len(lapsed) != 0 {
		t.Fatalf("lapsed with none held: %v", lapsed)
	}
	s.Table(func(cb *callback.Client) { cb.Delegated(tk.T, fid, callback.DelegWrite, 5, cb.Epoch()) })
	tk.End()
	if h, ok := s.Delegation(fid); !ok || h.State != 5 {
		t.Fatalf("delegation %+v %v", h, ok)
	}
	if lapsed := s.KeepLease(now.Add(time.Second)); len(lapsed) != 0 || srv.renews.Load() != 0 {
		t.Fatalf("lapsed %v, renewals %d with most of the lease left", lapsed, srv.renews.Load())
	}
	s.KeepLease(now.Add(21 * time.Second))
	for deadline := time.Now().Add(5 * time.Second); srv.renews.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no renewal with a third of the lease left")
		}
	}
	lapsed := s.KeepLease(now.Add(time.Minute))
	if len(lapsed) != 1 || lapsed[0].FID != fid {
		t.Fatalf("lapsed %v, want the delegation", lapsed)
	}
	if _, ok := s.Delegation(fid); ok {
		t.Fatal("a lapsed delegation is still held")
	}
}

// cell records what Sites tells the cache manager.
type cell struct {
	mu       sync.Mutex
	dialled  []string
	handed   map[uint64]*Site
	forgot   []string
	failDial bool
}

func (c *cell) Dial(key, addr string, _ time.Duration) (*Site, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dialled = append(c.dialled, key)
	if c.failDial {
		return nil, syscall.ECONNREFUSED
	}
	return New(addr, "", &link{}, &server{}, false, nil), nil
}

func (c *cell) HandOver(vol uint64, to *Site) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handed[vol] = to
	return true
}

func (c *cell) Forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgot = append(c.forgot, name)
}

// Locations are asked once and kept; a volume elsewhere gets a session
// with its server, begun once; a move hands the volume's files over.
func TestSitesLocateAndMove(t *testing.T) {
	srv := &server{where: func(in *pb.LocateRequest) *pb.Location {
		if in.Name == "home" || in.Id == 3 {
			return &pb.Location{Id: 3, Name: "home", Here: true, Rw: &pb.Site{Name: "first", Addr: "s:1"}}
		}
		return &pb.Location{Id: 4, Name: "data", Rw: &pb.Site{Name: "other", Addr: "s:2"}}
	}}
	cl := &cell{handed: map[uint64]*Site{}}
	ss := NewSites(cl, newSite(srv))
	for range 3 {
		if at, err := ss.Of("home", ""); err != nil || at != ss.First() {
			t.Fatalf("home at %v %v, want the first site", at, err)
		}
	}
	if n := srv.locates.Load(); n != 1 {
		t.Fatalf("%d Locates for one volume, want 1 (kept)", n)
	}
	at, err := ss.Of("data", "")
	if err != nil || at == ss.First() || at.Addr != "s:2" {
		t.Fatalf("data at %v %v, want the other server's site", at, err)
	}
	if again, _ := ss.OfID(4, ""); again != at || len(cl.dialled) != 1 {
		t.Fatalf("the other server dialled %v times", cl.dialled)
	}
	ss.Moved(&pb.Location{Id: 4, Name: "data", Rw: &pb.Site{Name: "first", Addr: "s:1"}})
	if cl.handed[4] != ss.First() {
		t.Fatal("a move to the first server did not hand the volume's files to it")
	}
	if ss.Stale("data", errors.New("unrelated")) {
		t.Fatal("an unrelated error made a location stale")
	}
	if !ss.Stale("data", syscall.ENOENT) || len(cl.forgot) != 1 {
		t.Fatal("ENOENT did not make the location stale")
	}
	if len(ss.Close()) != 2 {
		t.Fatal("Close did not return both sites")
	}
	if _, err := ss.Server(&pb.Site{Name: "third", Addr: "s:3"}); err == nil {
		t.Fatal("a site begun after Close")
	}
}

// A read-only copy's site that stops answering is passed over: its files
// go to the copy's next site, and back to it only when all are down.
func TestSitesFailover(t *testing.T) {
	ro := &pb.Location{Id: 5, Name: "sw.readonly", ReadOnly: true,
		Ro: []*pb.Site{{Name: "a", Addr: "a:1"}, {Name: "b", Addr: "b:1"}}}
	srv := &server{where: func(*pb.LocateRequest) *pb.Location { return ro }}
	cl := &cell{handed: map[uint64]*Site{}}
	ss := NewSites(cl, newSite(srv))
	a, err := ss.OfID(5, "")
	if err != nil || a.Addr != "a:1" || !ss.ReadOnly(5) {
		t.Fatalf("copy at %v %v", a, err)
	}
	if ss.Failover(5, a, errors.New("not a transport error")) {
		t.Fatal("failed over on a refusal")
	}
	a.Conn.(*link).down.Store(true)
	unreach := status.Error(codes.Unavailable, "connection refused")
	if !ss.Failover(5, a, unreach) || cl.handed[5] == nil || cl.handed[5].Addr != "b:1" {
		t.Fatalf("failover handed to %v, want b", cl.handed[5])
	}
	if b, _ := ss.For(ro); b.Addr != "b:1" {
		t.Fatalf("the copy is read from %s after failover, want b", b.Addr)
	}
}
