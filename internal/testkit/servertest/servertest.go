// Package servertest runs a real hoard server (a vnode store, the gRPC
// service and the bulk-data channel) inside a test's process on loopback
// sockets, and dials clients to it through the path API. It is a package
// of its own so that the tests of client and of client/pathfs share one
// fixture; only tests import it.
package servertest

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/principal"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/server/session"
	"github.com/hoardfs/hoard/vnode"
)

// Logger discards logs unless HOARD_TEST_LOG is set (then: debug to
// stderr).
func Logger() *slog.Logger {
	if os.Getenv("HOARD_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Main runs a package's tests (a TestMain's work) with the default
// logger as Logger: the client's cache logs through it.
func Main(m *testing.M) {
	slog.SetDefault(Logger())
	os.Exit(m.Run())
}

// Server is a hoard server in this process. It can be stopped and
// started again on the same data directory and the same addresses, as a
// restarted server process would be.
type Server struct {
	t        testing.TB
	dir      string
	addr     string // the control (gRPC) address, fixed across restarts
	dataAddr string // the data channel's, fixed across restarts; "" without one
	cfg      server.Config
	noData   bool
	// tokens, when set, has the server check users' tokens (Secure).
	tokens server.Tokens
	// principals is the cell's registry of users and groups.
	principals *principal.Registry

	mu      sync.Mutex
	running bool
	store   *vnode.Store
	srv     *server.Server
	g       *grpc.Server
	dataLis *trackedListener // nil without a data channel
	done    chan struct{}    // closed when g.Serve returned
}

// Option changes a test server's configuration.
type Option func(*Server)

// WithConfig lets a test change the server's Config.
func WithConfig(f func(*server.Config)) Option {
	return func(s *Server) { f(&s.cfg) }
}

// Secure has the server check the users' tokens with tokens, and their
// rights (over plain TCP: the tokens are what the tests are about).
func Secure(tokens server.Tokens) Option { return func(s *Server) { s.tokens = tokens } }

// WithoutDataChannel runs the server without a bulk-data channel: file
// contents go over gRPC.
func WithoutDataChannel() Option { return func(s *Server) { s.noData = true } }

// config is the server configuration tests use unless they say
// otherwise: short timeouts, a short grace period.
func config() server.Config {
	cfg := server.DefaultConfig()
	cfg.Grace = 300 * time.Millisecond
	cfg.BreakTimeout = time.Second
	cfg.Ping = time.Second
	cfg.Lease = 10 * time.Second
	cfg.Logger = Logger()
	return cfg
}

// Start starts a server on a fresh data directory and free loopback
// ports; it is stopped when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir(), cfg: config()}
	for _, o := range opts {
		o(s)
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Addr is the server's control (gRPC) address, the same across restarts.
func (s *Server) Addr() string { return s.addr }

// Dir is the server's data directory.
func (s *Server) Dir() string { return s.dir }

// listen listens on addr, retrying for a while: a restarted server takes
// its old port back, which the kernel may hold for a moment.
func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("listen %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// trackedListener records the connections it accepted, so that a stop
// can close them (a data channel's connections outlive its listener).
type trackedListener struct {
	net.Listener
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	if l.conns == nil {
		l.conns = map[net.Conn]struct{}{}
	}
	l.conns[c] = struct{}{}
	return c, nil
}

// closeAll closes the listener and every connection it accepted.
func (l *trackedListener) closeAll() {
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	l.Listener.Close()
	for c := range conns {
		c.Close()
	}
}

// Start starts the server again after Stop, on the same data and
// addresses: a new epoch, with a grace period for reclaims.
func (s *Server) Start() {
	s.t.Helper()
	store, err := vnode.Open(s.dir)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg := s.cfg
	if s.principals == nil {
		s.principals = principal.New() // the cell's: it outlives a restart
	}
	cfg.Principals = s.principals
	if cfg.Key, err = session.LoadKey(filepath.Join(store.Dir(), "session.key")); err != nil {
		store.Close()
		s.t.Fatal(err)
	}
	if s.tokens != nil {
		cfg.Users = server.CellUsers(s.tokens, s.principals)
	}
	srv := server.New(server.Local(store), cfg)
	addr := s.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis := listen(s.t, addr)
	s.addr = lis.Addr().String()
	var dataLis *trackedListener
	if !s.noData {
		daddr := s.dataAddr
		if daddr == "" {
			daddr = "127.0.0.1:0"
		}
		dataLis = &trackedListener{Listener: listen(s.t, daddr)}
		s.dataAddr = dataLis.Addr().String()
		srv.ServeData(dataLis, "")
	}
	g := grpc.NewServer(
		grpc.UnaryInterceptor(srv.Trace), grpc.StreamInterceptor(srv.TraceStream),
		grpc.MaxRecvMsgSize(16<<20),
		grpc.InitialWindowSize(8<<20), grpc.InitialConnWindowSize(64<<20),
	)
	pb.RegisterFileServerServer(g, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Serve(srv.Bound(lis))
	}()
	s.mu.Lock()
	s.store, s.srv, s.g, s.dataLis, s.done, s.running = store, srv, g, dataLis, done, true
	s.mu.Unlock()
}

// Stop stops the server as a crash would, as far as clients can tell:
// every connection drops at once. What it acknowledged is in the store.
func (s *Server) Stop() {
	s.mu.Lock()
	if !s.running {
		s.mu.Unlock()
		return
	}
	s.running = false
	srv, g, dataLis, store, done := s.srv, s.g, s.dataLis, s.store, s.done
	s.mu.Unlock()
	if dataLis != nil {
		dataLis.closeAll()
	}
	srv.Shutdown()
	g.Stop()
	<-done
	store.Close()
}

// Restart stops the server and starts it again (Stop, Start).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// ClientOpt changes a test client's options; any func(*client.Options)
// is one.
type ClientOpt func(*client.Options)

// MemCache keeps the client's cache in memory.
func MemCache() ClientOpt { return func(o *client.Options) { o.CacheDir = "" } }

// InDir puts the client's cache in dir (to reuse a cache across clients).
func InDir(dir string) ClientOpt { return func(o *client.Options) { o.CacheDir = dir } }

// Options are the options Dial uses, before opts: a cache of its own in
// a temporary directory, short timeouts, the test's name.
func (s *Server) Options(t testing.TB, opts ...ClientOpt) client.Options {
	o := client.Options{
		Server:      s.addr,
		CacheDir:    t.TempDir(),
		CacheSize:   64 << 20,
		DialTimeout: 5 * time.Second,
		RPCTimeout:  10 * time.Second,
		Name:        t.Name(),
		Logger:      Logger(),
	}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Dial connects a client, closed when the test ends (unless closed first).
func (s *Server) Dial(t testing.TB, opts ...ClientOpt) *pathfs.FS {
	t.Helper()
	c, err := pathfs.Dial(s.Options(t, opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Seed writes data to name through a new client with a memory cache, for
// the test's other clients to find at the server, and returns that
// client.
func (s *Server) Seed(t testing.TB, name string, data []byte) *pathfs.FS {
	t.Helper()
	w := s.Dial(t, MemCache())
	testkit.WriteFile(t, w, name, data)
	return w
}
