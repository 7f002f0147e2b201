package client_test

// The test fixture: a real hoard server (a vnode store, the gRPC service
// and the bulk-data channel) running inside the test process on loopback
// sockets, and clients dialled to it through the path API (package pathfs).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/principal"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/server/session"
	"github.com/hoardfs/hoard/vnode"
)

// testLogger discards logs unless HOARD_TEST_LOG is set (then: debug to
// stderr).
func testLogger() *slog.Logger {
	if os.Getenv("HOARD_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testServer is a hoard server in this process. It can be stopped and
// started again on the same data directory and the same addresses, as a
// restarted server process would be.
type testServer struct {
	t        testing.TB
	dir      string
	addr     string // the control (gRPC) address, fixed across restarts
	dataAddr string // the data channel's, fixed across restarts; "" without one
	cfg      server.Config
	noData   bool
	// tokens, when set, has the server check users' tokens (secure).
	tokens server.Tokens
	// principals is the cell's registry of users and groups.
	principals *principal.Registry

	mu      sync.Mutex
	running bool
	store   *vnode.Store
	srv     *server.Server
	g       *grpc.Server
	lis     net.Listener
	dataLis *trackedListener // nil without a data channel
	done    chan struct{}    // closed when g.Serve returned
}

// serverOpt changes a test server's configuration.
type serverOpt func(*testServer)

// withConfig lets a test change the server's Config.
func withConfig(f func(*server.Config)) serverOpt {
	return func(s *testServer) { f(&s.cfg) }
}

// secure has the server check the users' tokens with tokens, and their
// rights (over plain TCP: the tokens are what the tests are about).
func secure(tokens server.Tokens) serverOpt { return func(s *testServer) { s.tokens = tokens } }

// withoutDataChannel runs the server without a bulk-data channel: file
// contents go over gRPC.
func withoutDataChannel() serverOpt { return func(s *testServer) { s.noData = true } }

// testConfig is the server configuration tests use unless they say
// otherwise: short timeouts, a short grace period.
func testConfig() server.Config {
	cfg := server.DefaultConfig()
	cfg.Grace = 300 * time.Millisecond
	cfg.BreakTimeout = time.Second
	cfg.Ping = time.Second
	cfg.Lease = 10 * time.Second
	cfg.Logger = testLogger()
	return cfg
}

// startServer starts a server on a fresh data directory and free loopback
// ports; it is stopped when the test ends.
func startServer(t testing.TB, opts ...serverOpt) *testServer {
	t.Helper()
	s := &testServer{t: t, dir: t.TempDir(), cfg: testConfig()}
	for _, o := range opts {
		o(s)
	}
	s.start()
	t.Cleanup(s.stop)
	return s
}

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

func (s *testServer) start() {
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
	s.store, s.srv, s.g, s.lis, s.dataLis, s.done, s.running = store, srv, g, lis, dataLis, done, true
	s.mu.Unlock()
}

// stop stops the server as a crash would, as far as clients can tell:
// every connection drops at once. What it acknowledged is in the store.
func (s *testServer) stop() {
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

// restart stops the server and starts it again on the same data and
// addresses: a new epoch, with a grace period for reclaims.
func (s *testServer) restart() {
	s.t.Helper()
	s.stop()
	s.start()
}

// clientOpt changes a test client's options.
type clientOpt func(*client.Options)

// memCache keeps the client's cache in memory.
func memCache() clientOpt { return func(o *client.Options) { o.CacheDir = "" } }

// inDir puts the client's cache in dir (to reuse a cache across clients).
func inDir(dir string) clientOpt { return func(o *client.Options) { o.CacheDir = dir } }

func with(f func(*client.Options)) clientOpt { return f }

// options are the options dial uses, before opts.
func (s *testServer) options(t testing.TB, opts ...clientOpt) client.Options {
	o := client.Options{
		Server:      s.addr,
		CacheDir:    t.TempDir(),
		CacheSize:   64 << 20,
		DialTimeout: 5 * time.Second,
		RPCTimeout:  10 * time.Second,
		Name:        t.Name(),
		Logger:      testLogger(),
	}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// dial connects a client, closed when the test ends (unless closed first).
func (s *testServer) dial(t testing.TB, opts ...clientOpt) *pathfs.FS {
	t.Helper()
	c, err := pathfs.Dial(s.options(t, opts...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// seed writes data to name through a new client with a memory cache, for
// the test's other clients to find at the server, and returns that
// client.
func (s *testServer) seed(t testing.TB, name string, data []byte) *pathfs.FS {
	t.Helper()
	w := s.dial(t, memCache())
	testkit.WriteFile(t, w, name, data)
	return w
}

// openFile opens name through c with flag, failing the test on error. The
// file is closed when the test ends (unless closed first).
func openFile(t testing.TB, c *pathfs.FS, name string, flag int) *client.File {
	t.Helper()
	f, err := c.Open(name, flag, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// wantFile fails unless name reads as want through c.
func wantFile(t testing.TB, c *pathfs.FS, name string, want []byte) {
	t.Helper()
	got := testkit.ReadFile(t, c, name)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: read %d bytes %s, want %d bytes %s", name, len(got), short(got), len(want), short(want))
	}
}

func short(b []byte) string {
	if len(b) > 32 {
		return fmt.Sprintf("%q...", b[:32])
	}
	return fmt.Sprintf("%q", b)
}

// waitFor waits until cond holds (poll.Until), failing the test with
// what() once within has passed: what says the state it ended in.
func waitFor(t testing.TB, within time.Duration, cond func() bool, what func() string) {
	t.Helper()
	if !poll.Until(within, cond) {
		t.Fatalf("after %v: %s", within, what())
	}
}

// wantErrno fails unless err carries errno.
func wantErrno(t testing.TB, what string, err error, errno syscall.Errno) {
	t.Helper()
	if !errors.Is(err, errno) {
		t.Fatalf("%s: %v, want %v", what, err, errno)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestMain(m *testing.M) {
	// The cache logs through the default logger.
	slog.SetDefault(testLogger())
	os.Exit(m.Run())
}

// errnoOf is the errno err carries (0 if none): what errors.Is compares
// with.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

// root is k's root directory, failing the test on error.
func root(t testing.TB, k *client.Nodes) *client.Node {
	t.Helper()
	n, err := k.Root()
	must(t, err)
	return n
}
