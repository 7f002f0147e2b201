package integration

import (
	"context"
	"syscall"
	"testing"
	"time"

	pb "github.com/hoardfs/hoard/hoardpb"
)

// rawClient is a protocol-level client: a back channel and its session,
// for driving the server's delegation RPCs directly.
type rawClient struct {
	rpc     pb.FileServerClient
	ctx     context.Context // carries the session
	welcome *pb.Welcome
	cancel  context.CancelFunc // ends the back channel
	msgs    chan *pb.ServerMsg
	back    pb.FileServer_ConnectClient
	// lease from the Welcome
	lease time.Duration
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	return connectRaw(t, anonRPC(t, addr), t.Name(), "")
}

// connectRaw says Hello on rpc's connection, as name, continuing the
// session whose token is previous (if any).
func connectRaw(t *testing.T, rpc pb.FileServerClient, name, previous string) *rawClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rc := &rawClient{rpc: rpc, cancel: cancel, msgs: make(chan *pb.ServerMsg, 100)}
	var err error
	if rc.back, err = rc.rpc.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	rc.back.Send(&pb.ClientMsg{Msg: &pb.ClientMsg_Hello{Hello: &pb.Hello{Version: pb.Version, Name: name, Previous: previous}}})
	first, err := rc.back.Recv()
	if err != nil || first.GetWelcome().GetSession() == "" {
		t.Fatalf("welcome: %v %v", first, err)
	}
	rc.welcome = first.GetWelcome()
	rc.lease = time.Duration(rc.welcome.LeaseMs) * time.Millisecond
	rc.ctx = metadataCtx(ctx, rc.welcome.Session)
	go func() {
		for {
			m, err := rc.back.Recv()
			if err != nil {
				close(rc.msgs)
				return
			}
			if m.GetPing() == nil {
				rc.msgs <- m
			}
		}
	}()
	return rc
}

// next is the next message other than a ping, within d.
func (rc *rawClient) next(t *testing.T, d time.Duration) *pb.ServerMsg {
	t.Helper()
	select {
	case m := <-rc.msgs:
		return m
	case <-time.After(d):
		t.Fatalf("no message within %v", d)
		return nil
	}
}

// create makes a regular file in the root volume's root directory.
func (rc *rawClient) create(t *testing.T, name string) *pb.FID {
	t.Helper()
	vol, err := rc.rpc.GetVolume(rc.ctx, &pb.GetVolumeRequest{Name: "root"})
	if err != nil {
		t.Fatal(err)
	}
	cr, err := rc.rpc.Create(rc.ctx, &pb.CreateRequest{Dir: vol.Root, Name: name, Type: pb.FileType_FILE_TYPE_FILE, Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	return cr.Status.Fid
}

func (rc *rawClient) store(fid *pb.FID, data []byte, state uint64) (*pb.StoreReply, error) {
	s, err := rc.rpc.Store(rc.ctx)
	if err != nil {
		return nil, err
	}
	s.Send(&pb.StoreRequest{Fid: fid, HasTruncate: true, HasSize: true, Size: uint64(len(data)), Data: data, DelegState: state, Sync: true})
	return s.CloseAndRecv()
}

// The delegation protocol end to end against a real server: a lone writer
// gets a write delegation; a reader's open waits while the writer is
// recalled, stores under its delegation and returns it; the reader then
// sees the stored bytes. A holder that stops talking loses its delegation
// after the lease, the waiting opener goes on, and the holder's late
// store is refused (EKEYEXPIRED).
func TestDelegationProtocol(t *testing.T) {
	srv := startServer(t, t.TempDir(), "--lease", "2s")
	a, b := dialRaw(t, srv.addr), dialRaw(t, srv.addr)
	if a.lease != 2*time.Second {
		t.Fatalf("lease in the welcome: %v", a.lease)
	}
	fid := a.create(t, "f")
	wa, err := a.rpc.Open(a.ctx, &pb.OpenRequest{Fid: fid, Write: true})
	if err != nil || wa.Kind != pb.DelegKind_DELEG_WRITE || wa.State == 0 {
		t.Fatalf("lone writer's open: %v %v", wa, err)
	}
	type result struct {
		r   *pb.OpenReply
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := b.rpc.Open(b.ctx, &pb.OpenRequest{Fid: fid})
		done <- result{r, err}
	}()
	m := a.next(t, 5*time.Second)
	if rc := m.GetRecall(); rc == nil || len(rc.States) != 1 || rc.States[0] != wa.State {
		t.Fatalf("holder got %v, want a recall of state %d", m, wa.State)
	}
	select {
	case r := <-done:
		t.Fatalf("reader's open answered before the return: %v", r)
	case <-time.After(300 * time.Millisecond):
	}
	// The holder flushes its dirty data under the delegation, then returns it.
	if _, err := a.store(fid, []byte("written under a delegation"), wa.State); err != nil {
		t.Fatalf("store under the recalled delegation: %v", err)
	}
	if rr, err := a.rpc.Return(a.ctx, &pb.ReturnRequest{Fid: fid, State: wa.State}); err != nil || !rr.Accepted {
		t.Fatalf("return: %v %v", rr, err)
	}
	r := <-done
	if r.err != nil || r.r.Status.Size != uint64(len("written under a delegation")) || r.r.Kind != pb.DelegKind_DELEG_READ {
		t.Fatalf("reader's open after the return: %v %v", r.r, r.err)
	}
	// A returned delegation no longer covers stores.
	if _, err := a.store(fid, []byte("late"), wa.State); pb.Errno(err) != syscall.EKEYEXPIRED {
		t.Fatalf("store under a returned delegation: %v", err)
	}

	// The reader is done with the file and gives its delegation back.
	if rr, err := b.rpc.Return(b.ctx, &pb.ReturnRequest{Fid: fid, State: r.r.State}); err != nil || !rr.Accepted {
		t.Fatalf("reader's return: %v %v", rr, err)
	}
	// A holder that keeps renewing keeps its delegation past the lease:
	// past the revocation of a witness's, taken after it and never
	// renewed.
	wa2, err := a.rpc.Open(a.ctx, &pb.OpenRequest{Fid: fid, Write: true})
	if err != nil || wa2.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("writer's second open: %v %v", wa2, err)
	}
	w := dialRaw(t, srv.addr)
	h := w.create(t, "h")
	if ww, err := w.rpc.Open(w.ctx, &pb.OpenRequest{Fid: h, Write: true}); err != nil || ww.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("witness's open: %v %v", ww, err)
	}
	renewing := make(chan struct{})
	renewed := make(chan error, 1)
	go func() {
		for {
			select {
			case <-renewing:
				renewed <- nil
				return
			case <-time.After(a.lease / 4):
			}
			if _, err := a.rpc.Renew(a.ctx, &pb.RenewRequest{}); err != nil {
				renewed <- err
				return
			}
		}
	}()
	if m := w.next(t, 3*w.lease); m.GetRevoke() == nil {
		t.Fatalf("the witness got %v, want its delegation revoked after the lease", m)
	}
	close(renewing)
	if err := <-renewed; err != nil {
		t.Fatal(err)
	}
	if rr, err := a.rpc.Return(a.ctx, &pb.ReturnRequest{Fid: fid, State: wa2.State}); err != nil || !rr.Accepted {
		t.Fatalf("a renewed delegation was lost after the lease: %v %v", rr, err)
	}

	// A holder that goes silent: c takes a write delegation on g, and
	// says nothing more.
	c := dialRaw(t, srv.addr)
	g := c.create(t, "g")
	wc, err := c.rpc.Open(c.ctx, &pb.OpenRequest{Fid: g, Write: true})
	if err != nil || wc.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("silent holder's open: %v %v", wc, err)
	}
	start := time.Now()
	rb, err := b.rpc.Open(b.ctx, &pb.OpenRequest{Fid: g, Write: true})
	took := time.Since(start)
	if err != nil || rb.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("open against a silent holder: %v %v", rb, err)
	}
	if took < time.Second || took > 5*time.Second {
		t.Fatalf("open against a silent holder took %v with a 2 s lease", took)
	}
	if _, err := c.store(g, []byte("too late"), wc.State); pb.Errno(err) != syscall.EKEYEXPIRED {
		t.Fatalf("late store under a revoked delegation: %v", err)
	}
	for m := range c.msgs {
		if rv := m.GetRevoke(); rv != nil {
			if len(rv.States) != 1 || rv.States[0] != wc.State {
				t.Fatalf("revocation: %v", rv)
			}
			return
		}
	}
	t.Fatal("the silent holder was never told of the revocation")
}

// A holder that ignores recalls while it goes on talking: its first
// unanswered recall is revoked after the lease, and then it gets no new
// delegation for a while (ten leases), so another client's requests wait
// out the lease once, not round after round.
func TestIgnoredRecallsBackOff(t *testing.T) {
	const lease = 2 * time.Second
	srv := startServer(t, t.TempDir(), "--lease", lease.String())
	a, b := dialRaw(t, srv.addr), dialRaw(t, srv.addr)
	fid := a.create(t, "f")
	for round := range 3 {
		wa, err := a.rpc.Open(a.ctx, &pb.OpenRequest{Fid: fid, Write: true})
		if err != nil {
			t.Fatal(err)
		}
		if want := round == 0; (wa.Kind == pb.DelegKind_DELEG_WRITE) != want {
			t.Fatalf("round %d: the holder's open got %v", round, wa.Kind)
		}
		// a keeps its lease (and its session) alive, and answers nothing.
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(lease / 4):
					a.rpc.Renew(a.ctx, &pb.RenewRequest{})
				}
			}
		}()
		start := time.Now()
		_, err = b.rpc.GetStatus(b.ctx, &pb.GetStatusRequest{Fids: []*pb.FID{fid}})
		took := time.Since(start)
		close(stop)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: another client's status took %v", round, took)
		if round > 0 && took > lease/2 {
			t.Fatalf("round %d: another client waited %v for a holder that ignored a recall before", round, took)
		}
		if wa.Recorded {
			a.rpc.Close(a.ctx, &pb.CloseRequest{Fid: fid, Write: true})
		}
	}
}

// A holder that says nothing after a recall (a stopped process, its
// connection still up) is revoked after the break timeout: another
// client's request waits about that long, not the 30 s lease. A real
// client answers a recall at once, and keeps its lease to store in
// (TestDelegationRecallStoresFirst and the consistency checks).
func TestSilentHolderRevokedAfterBreakTimeout(t *testing.T) {
	srv := startServer(t, t.TempDir()) // lease 30 s, break timeout 2 s
	a, b := dialRaw(t, srv.addr), dialRaw(t, srv.addr)
	fid := a.create(t, "f")
	if wa, err := a.rpc.Open(a.ctx, &pb.OpenRequest{Fid: fid, Write: true}); err != nil || wa.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("open: %v, %v; want a write delegation", wa, err)
	}
	start := time.Now()
	if _, err := b.rpc.GetStatus(b.ctx, &pb.GetStatusRequest{Fids: []*pb.FID{fid}}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("another client's status took %v", took)
	if took > 10*time.Second {
		t.Fatalf("another client waited %v for a silent holder", took)
	}
}
