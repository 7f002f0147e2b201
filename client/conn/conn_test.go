package conn

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
)

// server is a fake file server: it welcomes each back channel with a new
// session token and lets the test speak on the newest one.
type server struct {
	pb.UnimplementedFileServerServer
	ping uint32

	mu       sync.Mutex
	sessions int
	hellos   []*pb.Hello
	streams  chan pb.FileServer_ConnectServer
	acks     chan uint64
	ends     map[pb.FileServer_ConnectServer]chan struct{}
	// refuse answers GetStatus UNAUTHENTICATED for this session.
	refuse string
	seen   []string // sessions GetStatus was called with
}

func (s *server) Connect(st pb.FileServer_ConnectServer) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.sessions++
	tok := fmt.Sprintf("tok%d", s.sessions)
	s.hellos = append(s.hellos, m.GetHello())
	end := make(chan struct{})
	s.ends[st] = end
	s.mu.Unlock()
	if err := st.Send(&pb.ServerMsg{Msg: &pb.ServerMsg_Welcome{Welcome: &pb.Welcome{Epoch: 1, Session: tok, PingMs: s.ping, StatesFrom: 7}}}); err != nil {
		return err
	}
	s.streams <- st
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			if a := m.GetAck(); a != nil {
				s.acks <- a.Seq
			}
		}
	}()
	select {
	case <-end:
		return status.Error(codes.Unavailable, "ended by the test")
	case <-st.Context().Done():
		return nil
	}
}

func (s *server) GetStatus(ctx context.Context, _ *pb.GetStatusRequest) (*pb.GetStatusReply, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	sess := ""
	if v := md.Get(pb.ClientMetadata); len(v) > 0 {
		sess = v[0]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, sess)
	if sess == s.refuse {
		return nil, status.Error(codes.Unauthenticated, "unknown session")
	}
	return &pb.GetStatusReply{}, nil
}

// end closes the back channel st with an error, as a server restart does.
func (s *server) end(st pb.FileServer_ConnectServer) {
	s.mu.Lock()
	close(s.ends[st])
	s.mu.Unlock()
}

// handler records what the connection hears.
type handler struct {
	mu        sync.Mutex
	welcomes  []*pb.Welcome
	resumed   int
	breaks    chan chan struct{} // the test closes each to acknowledge
	recalls   []uint64
	answered  int
	resets    int
	revokes   int
	sessionAt []string // the session Resumed saw
	c         *Conn
}

func (h *handler) Welcome(w *pb.Welcome) {
	h.mu.Lock()
	h.welcomes = append(h.welcomes, w)
	h.mu.Unlock()
}

func (h *handler) Resumed() {
	h.mu.Lock()
	h.resumed++
	h.sessionAt = append(h.sessionAt, h.c.Session())
	h.mu.Unlock()
}

func (h *handler) Break([]*pb.FID) <-chan struct{} {
	done := make(chan struct{})
	h.breaks <- done
	return done
}

func (h *handler) Reset() { h.mu.Lock(); h.resets++; h.mu.Unlock() }

func (h *handler) RightsChanged() {}

func (h *handler) Recall(_ *pb.Recall, statesFrom uint64) {
	h.mu.Lock()
	h.recalls = append(h.recalls, statesFrom)
	h.mu.Unlock()
}

func (h *handler) Revoke(*pb.Revoke)  { h.mu.Lock(); h.revokes++; h.mu.Unlock() }
func (h *handler) Answered(time.Time) { h.mu.Lock(); h.answered++; h.mu.Unlock() }

func start(t *testing.T, ping uint32, cfg Config) (*server, *handler, *Conn) {
	t.Helper()
	s, h, c := prepare(t, ping, cfg)
	if err := <-c.Start(); err != nil {
		t.Fatal(err)
	}
	return s, h, c
}

// prepare is start without Start.
func prepare(t *testing.T, ping uint32, cfg Config) (*server, *handler, *Conn) {
	t.Helper()
	s := &server{ping: ping, streams: make(chan pb.FileServer_ConnectServer, 16), acks: make(chan uint64, 16), ends: map[pb.FileServer_ConnectServer]chan struct{}{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterFileServerServer(g, s)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	cfg.Server, cfg.NoDataChannel = l.Addr().String(), true
	if cfg.RPCTimeout == 0 {
		cfg.RPCTimeout = 5 * time.Second
	}
	cfg.Log = slog.New(slog.DiscardHandler)
	h := &handler{breaks: make(chan chan struct{}, 16)}
	c, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	h.c = c
	t.Cleanup(c.Close)
	return s, h, c
}

func stream(t *testing.T, s *server) pb.FileServer_ConnectServer {
	t.Helper()
	select {
	case st := <-s.streams:
		return st
	case <-time.After(10 * time.Second):
		t.Fatal("no back channel")
		return nil
	}
}

func TestHandshake(t *testing.T) {
	s, h, c := start(t, 0, Config{Name: "tester"})
	stream(t, s)
	if c.Session() != "tok1" {
		t.Fatalf("session %q after the welcome", c.Session())
	}
	if len(h.welcomes) != 1 || h.resumed != 0 {
		t.Fatalf("%d welcomes, %d resumed", len(h.welcomes), h.resumed)
	}
	if hl := s.hellos[0]; hl.Name != "tester" || hl.Previous != "" || hl.Version != pb.Version {
		t.Fatalf("hello %+v", hl)
	}
}

// Breaks are acknowledged in order, each once its handler says so: a
// later break's ack waits for an earlier one's (acks are cumulative).
func TestBreaksAcknowledgedInOrder(t *testing.T) {
	s, h, _ := start(t, 0, Config{})
	st := stream(t, s)
	for seq := uint64(1); seq <= 2; seq++ {
		st.Send(&pb.ServerMsg{Msg: &pb.ServerMsg_Break{Break: &pb.Break{Seq: seq}}})
	}
	first, second := <-h.breaks, <-h.breaks
	close(second)
	select {
	case seq := <-s.acks:
		t.Fatalf("ack %d before the first break's handler was done", seq)
	case <-time.After(100 * time.Millisecond):
	}
	close(first)
	if a, b := <-s.acks, <-s.acks; a != 1 || b != 2 {
		t.Fatalf("acks %d, %d", a, b)
	}
}

// A lost back channel is followed by a new session that names the last
// one (for its reclaims); Resumed runs once requests carry the new one.
func TestReconnectNamesLastSession(t *testing.T) {
	s, h, c := start(t, 0, Config{})
	st := stream(t, s)
	st.Send(&pb.ServerMsg{Msg: &pb.ServerMsg_Recall{Recall: &pb.Recall{}}})
	s.end(st)
	stream(t, s)
	poll.Wait(t, 10*time.Second, "resumed", func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.resumed == 1 })
	if s.hellos[1].Previous != "tok1" {
		t.Fatalf("second hello names %q, want tok1", s.hellos[1].Previous)
	}
	if h.sessionAt[0] != "tok2" || c.Session() != "tok2" {
		t.Fatalf("Resumed saw session %q", h.sessionAt[0])
	}
	if len(h.recalls) != 1 || h.recalls[0] != 7 {
		t.Fatalf("recalls %v, want one with the session's first state 7", h.recalls)
	}
}

// A server silent for three ping intervals is taken for gone.
func TestSilentServerLeft(t *testing.T) {
	s, _, _ := start(t, 100, Config{})
	stream(t, s)
	stream(t, s) // a new session, without the server ending the first
}

// A call the server refuses as of an unknown session waits for a new
// session and is tried once more with it.
func TestCallRetriedInNewSession(t *testing.T) {
	s, h, c := start(t, 0, Config{})
	st := stream(t, s)
	s.mu.Lock()
	s.refuse = "tok1"
	s.mu.Unlock()
	go func() {
		// The server restarts once it refused the call.
		poll.Wait(t, 10*time.Second, "call", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.seen) > 0 })
		s.end(st)
	}()
	err := c.Call(func(ctx context.Context) error {
		_, err := c.RPC().GetStatus(ctx, &pb.GetStatusRequest{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) != 2 || s.seen[0] != "tok1" || s.seen[1] != "tok2" {
		t.Fatalf("calls carried sessions %v", s.seen)
	}
	if h.answered != 1 {
		t.Fatalf("%d answers heard, want the one the server gave", h.answered)
	}
	if c.RPCs() != 2 {
		t.Fatalf("%d RPCs counted", c.RPCs())
	}
}

// With a session file, the next connection continues the line.
func TestSessionFileKept(t *testing.T) {
	file := filepath.Join(t.TempDir(), "session")
	s, _, c := start(t, 0, Config{SessionFile: file})
	stream(t, s)
	c.Close()
	s2, _, _ := start(t, 0, Config{SessionFile: file})
	stream(t, s2)
	if s2.hellos[0].Previous != "tok1" {
		t.Fatalf("a new process names %q, want the last session tok1", s2.hellos[0].Previous)
	}
}

// A caller that gave up waiting for the handshake (Dial's timeout) does
// not read its outcome: the back channel must not wait for it to, or
// Close would never return.
func TestCloseWithHandshakeUnread(t *testing.T) {
	s, _, c := prepare(t, 0, Config{})
	c.Start() // not read
	s.end(stream(t, s))
	stream(t, s) // the first session ended: its outcome was offered again
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung on an unread handshake")
	}
}
