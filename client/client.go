// Package client is hoard's cache manager as a Go library: a POSIX-like
// file API (the cacheDAFS thesis's API, in Go) over a persistent chunk cache
// kept coherent by callback promises. The FUSE mount is a thin adapter on
// top of it.
//
// Consistency: close-to-open. What one client wrote is seen by every client
// that opens the file after the writer's Close or Sync returned, and a cached
// read never returns data older than the last break the client received.
// While a promise is valid, reads touch neither the network nor a lock.
package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Options configure a client.
type Options struct {
	// Server is the file server's address, host:port.
	Server string
	// CacheDir holds the persistent cache; empty keeps the cache in memory.
	CacheDir string
	// CacheSize is the cache's hard limit in bytes (default 1 GiB).
	CacheSize int64
	// ChunkSize is used when a cache is created (default 256 KiB).
	ChunkSize int64
	// DialTimeout bounds how long Dial waits for the server (default 5 s).
	DialTimeout time.Duration
	// RPCTimeout bounds each control RPC (default 30 s).
	RPCTimeout time.Duration
	// BypassThreshold: files at least this large bypass the cache (0: no
	// threshold, auto decides). AutoMin: auto considers bypassing only
	// files at least this large (default 32 MiB).
	BypassThreshold int64
	AutoMin         int64
	// DataStreams is how many bulk-data connections to use (default 4, or
	// as many as the server asks for if it asks for more); NoDataChannel
	// keeps file contents on the gRPC connection.
	DataStreams   int
	NoDataChannel bool
	// NoDelegations takes none: every open and close asks the server, and
	// Close stores the file's writes (the behaviour before delegations).
	NoDelegations bool
	// NoDirDelegations takes no delegations on directories: every create
	// asks the server (dirdeleg.go). DirBackoff is how long the client
	// does not ask again for one recalled from it or refused (default
	// 5 s): another client works there too, and each would recall it from
	// the other at every create.
	NoDirDelegations bool
	DirBackoff       time.Duration
	// FlushAge bounds how long writes under a write delegation stay
	// unstored (default 30 s): what a client crash can lose.
	FlushAge time.Duration
	// KeepSession keeps the session token in CacheDir, so that the next
	// process with this cache continues this one's line of sessions and
	// takes over its delegations (a proxy restarted: its own clients'
	// reclaims come through it). Not for a client whose cache may hold a
	// killed process's half-done writes: those go to lost/.
	KeepSession bool
	// Name identifies this client in the server's logs.
	Name   string
	Logger *slog.Logger
	// OnInvalidate, when set, hears of every FID whose promise a break or
	// reset voided, before the break is acknowledged to the server: a
	// kernel adapter drops its cached copies there. It must not block for
	// long (the server waits), and must not call back into the client.
	OnInvalidate func(fids []node.FID)
	// OnRecall, when set, hears of every delegation this client is about
	// to give back or has lost (recall, revocation, lapsed lease, a new
	// session), before its dirty data is stored and it is returned: a
	// proxy recalls its own clients' delegations on the file there, and
	// waits for them.
	OnRecall func(fid node.FID)
}

func (o *Options) defaults() {
	if o.CacheSize == 0 {
		o.CacheSize = 1 << 30
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.RPCTimeout == 0 {
		o.RPCTimeout = 30 * time.Second
	}
	if o.AutoMin <= 0 {
		o.AutoMin = 32 << 20
	}
	if o.DataStreams <= 0 {
		o.DataStreams = 4
	}
	if o.FlushAge <= 0 {
		o.FlushAge = defaultFlushAge
	}
	if o.DirBackoff <= 0 {
		o.DirBackoff = 5 * time.Second
	}
	if o.Name == "" {
		host, _ := os.Hostname()
		o.Name = host + "/" + strconv.Itoa(os.Getpid())
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Client is a connected cache manager. Its methods are safe for concurrent use.
type Client struct {
	opts  Options
	log   *slog.Logger
	conn  *grpc.ClientConn
	rpc   pb.FileServerClient
	grpc  datapath.GRPC
	data  atomic.Pointer[dataPath] // the path file contents take now
	cache *cache.Cache

	// session is the current back-channel identity, the token the
	// server's Welcome gave; empty while disconnected. last is the last
	// one (backChannel's), which a new session's Hello names so the
	// server lets it reclaim that session's delegations; kept in the
	// cache directory (KeepSession), it lets the next process do so.
	session  atomic.Pointer[string]
	last     string
	sessionC chan struct{} // closed and replaced whenever session changes

	// unpublished are the bypassed opens with writes not yet published.
	unpublished stageIndex

	cbMu sync.Mutex
	cb   *callback.Client
	// lease is the delegation lease the server announced (0: it grants
	// none); renewing is set while a Renew is in flight.
	lease    atomic.Int64
	renewing atomic.Bool
	flusher  *flusher
	flushAge time.Duration
	// rate is the flusher's progress at the last setGauges (expirer only).
	rate struct {
		at      time.Time
		flushed int64
	}

	nodesMu sync.Mutex
	nodes   map[node.FID]*Node
	// forgotten holds the Nodes the kernel released (Release).
	forgotten map[*Node]struct{}

	volMu sync.Mutex
	vols  map[string]*pb.Volume
	root  *Node

	// resMu guards fids: FIDs reserved for files made here, by volume,
	// in server life fidsLife.
	resMu    sync.Mutex
	fids     map[uint64][]node.FID
	fidsLife uint64

	fetchSem chan struct{}
	ghosts   *ghosts
	counters counters

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// giveUp, once set (Unix ns), is when requests stop waiting for an
	// unreachable server: closeWait after Close began.
	giveUp atomic.Int64
	// bg counts the protocol work started in the background (spawn):
	// gives back, reclaims, settles; Close waits for it. closing (under
	// bgMu) refuses more.
	bgMu    sync.Mutex
	bg      sync.WaitGroup
	closing bool
}

// counters are protocol counters beyond what the cache keeps.
type counters struct {
	rpcs, breaks, resets, revalidations, dropped atomic.Int64
	// Delegations: opens and closes served locally, recalls received,
	// delegations revoked and reclaimed, bytes the flusher stored.
	localOpens, localCloses, recalls, revoked, reclaims, flushed atomic.Int64
	stores                                                       atomic.Int64
	// Directory delegations: files made here, removed before the server
	// knew them, and created there later; files removed here, and there
	// later.
	madeHere, madeDropped, settled, removedHere atomic.Int64
}

// Dial connects to opts.Server and opens the cache. It fails within
// DialTimeout, naming the address, when the server cannot be reached.
func Dial(opts Options) (*Client, error) {
	opts.defaults()
	if opts.Server == "" {
		return nil, errors.New("no server address given")
	}
	ch, err := cache.Open(cache.Options{Dir: opts.CacheDir, Size: opts.CacheSize, ChunkSize: opts.ChunkSize})
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(opts.Server,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(16<<20)),
		grpc.WithInitialWindowSize(8<<20), grpc.WithInitialConnWindowSize(64<<20),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		// Reconnect within half a second of a restarted server coming
		// back (gRPC's default backoff grows to minutes): the client must
		// be back inside the server's grace period to reclaim its write
		// delegations.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond}, MinConnectTimeout: 5 * time.Second}),
	)
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("server %s: %w", opts.Server, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		opts:      opts,
		log:       opts.Logger,
		conn:      conn,
		rpc:       pb.NewFileServerClient(conn),
		cache:     ch,
		sessionC:  make(chan struct{}),
		cb:        callback.NewClient(),
		nodes:     map[node.FID]*Node{},
		forgotten: map[*Node]struct{}{},
		vols:      map[string]*pb.Volume{},
		fids:      map[uint64][]node.FID{},
		fetchSem:  make(chan struct{}, 16),
		ghosts:    newGhosts(4096, 10*time.Minute),
		flushAge:  opts.FlushAge,
		ctx:       ctx,
		cancel:    cancel,
	}
	c.flusher = newFlusher(c)
	c.grpc = datapath.GRPC{Client: c.rpc}
	c.data.Store(&dataPath{Path: c.grpc})
	c.session.Store(new(string))
	c.last = c.loadSession()
	first := make(chan error, 1)
	c.wg.Add(3)
	go c.backChannel(first)
	go c.expirer()
	go c.flusher.run()
	select {
	case err = <-first:
	case <-time.After(opts.DialTimeout):
		err = fmt.Errorf("no answer within %v", opts.DialTimeout)
	}
	if err == nil {
		err = c.recoverDirty()
	}
	if err == nil {
		c.root, err = c.volumeRoot("root")
	}
	if err != nil {
		c.Close()
		switch status.Code(err) {
		case codes.ResourceExhausted, codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied:
			return nil, fmt.Errorf("server %s refused this client: %s", opts.Server, status.Convert(err).Message())
		}
		return nil, fmt.Errorf("server %s unreachable: %w", opts.Server, err)
	}
	return c, nil
}

// Close stores what the flusher still holds, gives delegations back, stops
// the back channel and closes the cache cleanly. Writes it could not store
// are kept in lost/, and the error says so. An unreachable server is
// waited for until closeWait after Close began, not an RPC timeout per
// request: a client whose server is gone stops in seconds.
func (c *Client) Close() error {
	c.giveUp.Store(time.Now().Add(closeWait).UnixNano())
	lost := c.flushAll()
	c.returnAll()
	c.cancel()
	c.wg.Wait()
	c.bgMu.Lock()
	c.closing = true
	c.bgMu.Unlock()
	c.bg.Wait()
	c.setGauges()
	c.conn.Close()
	return errors.Join(lost, c.cache.Close())
}

// closeWait is how long Close waits for an unreachable server.
const closeWait = 2 * time.Second

// spawn runs fn in the background, for Close to wait for; once Close has
// stopped the back channel, not at all (the server revokes what a give
// back would have returned).
func (c *Client) spawn(fn func()) {
	c.bgMu.Lock()
	if c.closing {
		c.bgMu.Unlock()
		return
	}
	c.bg.Add(1)
	c.bgMu.Unlock()
	go func() {
		defer c.bg.Done()
		fn()
	}()
}

// backChannel keeps a Connect stream open, reconnecting with backoff. While
// the server is unreachable, promises are kept until they expire, so cached
// data stays readable (as AFS does); each new stream is a new session, and
// promises from the old one may have missed breaks, so they are all dropped
// before the new session is used.
func (c *Client) backChannel(first chan<- error) {
	defer c.wg.Done()
	backoff := 100 * time.Millisecond
	for c.ctx.Err() == nil {
		err := c.runSession(first)
		if first != nil {
			first <- err
			first = nil
		}
		if *c.session.Load() != "" {
			backoff = 50 * time.Millisecond // a session was lost: try again at once
		}
		c.setSession("")
		if c.ctx.Err() != nil {
			return
		}
		if err != nil {
			c.log.Debug("back channel lost", "server", c.opts.Server, "err", err)
		}
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(backoff):
		}
		// Capped well below the server's grace period, so a restarted
		// server hears from every client before it acknowledges changes.
		backoff = min(backoff*2, 500*time.Millisecond)
	}
}

// runSession runs one Connect stream until it fails. The first call reports
// the handshake's outcome on first.
func (c *Client) runSession(first chan<- error) error {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	stream, err := c.rpc.Connect(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.ClientMsg{Msg: &pb.ClientMsg_Hello{Hello: &pb.Hello{Version: pb.Version, Name: c.opts.Name, Previous: c.last}}}); err != nil {
		return err
	}
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	w := m.GetWelcome()
	if w == nil || w.Session == "" {
		return errors.New("protocol: server did not welcome")
	}
	c.cbMu.Lock()
	changed, _ := c.cb.SetEpoch(w.Epoch)
	c.cb.SetLease(time.Duration(w.LeaseMs) * time.Millisecond)
	c.cbMu.Unlock()
	c.lease.Store(int64(time.Duration(w.LeaseMs) * time.Millisecond))
	if changed {
		c.log.Info("server restarted; cached files will be revalidated", "server", c.opts.Server, "epoch", w.Epoch)
	}
	c.newLife(w.Epoch)
	c.useDataChannel(w.DataAddr, max(c.opts.DataStreams, int(w.DataStreams)))
	c.last = w.Session
	c.saveSession(w.Session)
	c.setSession(w.Session)
	if first == nil {
		// The old session's promises may have missed breaks. Its
		// delegations are held for us until their lease runs out (after a
		// restart, for the grace period): reclaim those with dirty data,
		// after the reset, which voids the tickets of replies already
		// under way.
		c.resetPromises()
		c.dropDelegations(true)
	}
	if first != nil {
		first <- nil
		first = nil
	}
	// A server that says nothing for several ping intervals is gone, even
	// if TCP has not noticed yet: promises are then void.
	silence := 3 * time.Duration(max(w.PingMs, 100)) * time.Millisecond
	heard := make(chan struct{}, 1)
	go func() {
		t := time.NewTimer(silence)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-heard:
				t.Reset(silence)
			case <-t.C:
				c.log.Warn("server silent on the back channel; reconnecting", "server", c.opts.Server)
				cancel()
				return
			}
		}
	}()
	// A break's promises are dropped here, in the order the server sent
	// it; what may wait (OnInvalidate: a kernel, a proxy's own clients)
	// runs on its own goroutine, so this loop still notices a server that
	// went away, and waits run side by side. An ack goes out once its own
	// wait and every earlier one ended (acks are cumulative), so none
	// waits for more than one such wait however many breaks queue up: the
	// server's break timeout counts from sending.
	acks := make(chan ackAfter, 64)
	defer close(acks)
	go func() {
		for a := range acks {
			<-a.done
			if stream.Send(&pb.ClientMsg{Msg: &pb.ClientMsg_Ack{Ack: &pb.Ack{Seq: a.seq}}}) != nil {
				cancel()
			}
		}
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		select {
		case heard <- struct{}{}:
		default:
		}
		switch m := m.Msg.(type) {
		case *pb.ServerMsg_Break:
			a := ackAfter{seq: m.Break.Seq, done: c.breakPromises(m.Break.Fids)}
			select {
			case acks <- a:
			case <-ctx.Done():
				return ctx.Err()
			}
		case *pb.ServerMsg_Reset_:
			c.counters.resets.Add(1)
			c.resetPromises()
			c.dropDelegations(false)
		case *pb.ServerMsg_Recall:
			c.onRecall(m.Recall, w.StatesFrom)
		case *pb.ServerMsg_Revoke:
			c.onRevoke(m.Revoke)
		}
	}
}

// dataPath is the data path in use, with the channel address it uses.
type dataPath struct {
	datapath.Path
	addr    string
	streams int
}

// useDataChannel switches file contents to the server's bulk-data channel
// at addr, over up to streams connections, or back to the gRPC streams
// when it has none (version negotiation: an older server, or one run with
// --data-listen none).
func (c *Client) useDataChannel(addr string, streams int) {
	if c.opts.NoDataChannel {
		addr = ""
	}
	addr = reachable(c.opts.Server, addr)
	if addr == "" {
		streams = 0
	}
	old := c.data.Load()
	if old.addr == addr && old.streams == streams {
		return
	}
	next := &dataPath{Path: c.grpc, addr: addr, streams: streams}
	if addr != "" {
		next.Path = datapath.NewSplit(addr, streams, c.grpc, func() string { return *c.session.Load() })
	}
	c.data.Store(next)
	if sp, ok := old.Path.(*datapath.Split); ok {
		sp.Close()
	}
}

// reachable makes an advertised data address one this client can dial: a
// server listening on every interface (0.0.0.0 or ::) advertises just that,
// and is reached at the host the control connection used.
func reachable(control, data string) string {
	host, port, err := net.SplitHostPort(data)
	if err != nil {
		return data
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		return data
	}
	chost, _, err := net.SplitHostPort(control)
	if err != nil {
		return data
	}
	return net.JoinHostPort(chost, port)
}

// sessionFile keeps the last session token of a client with a cache on
// disk and KeepSession: a restarted proxy continues its line of sessions,
// so its clients' reclaims find its delegations without waiting out their
// lease.
const sessionFile = "session"

func (c *Client) loadSession() string {
	if c.opts.CacheDir == "" || !c.opts.KeepSession {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(c.opts.CacheDir, sessionFile))
	if err != nil || len(b) > 256 {
		return ""
	}
	return string(b)
}

// saveSession replaces the file whole; not synced: after a crash an older
// token of the same line does as well.
func (c *Client) saveSession(tok string) {
	if c.opts.CacheDir == "" || !c.opts.KeepSession {
		return
	}
	path := filepath.Join(c.opts.CacheDir, sessionFile)
	err := os.WriteFile(path+".new", []byte(tok), 0o600)
	if err == nil {
		err = os.Rename(path+".new", path)
	}
	if err != nil {
		c.log.Warn("session token not kept: a restart will not reclaim this session's delegations", "err", err)
	}
}

func (c *Client) setSession(s string) {
	c.session.Store(&s)
	c.cbMu.Lock()
	old := c.sessionC
	c.sessionC = make(chan struct{})
	c.cbMu.Unlock()
	close(old)
}

// expirer examines the promise list once a second (Faster AFS §3.1.1) so
// that the read path only ever checks a flag.
func (c *Client) expirer() {
	defer c.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case now := <-t.C:
			c.cbMu.Lock()
			expired := c.cb.Tick(now)
			c.cbMu.Unlock()
			c.invalidate(expired)
			c.keepLease(now)
			c.dropForgotten(now)
			c.setGauges()
		}
	}
}

func (c *Client) promiseCount() int {
	c.cbMu.Lock()
	defer c.cbMu.Unlock()
	return c.cb.Len()
}

// ackAfter is a break to acknowledge once done is closed.
type ackAfter struct {
	seq  uint64
	done <-chan struct{}
}

// breakPromises drops the promises on fids and returns a channel closed
// once OnInvalidate heard of them.
func (c *Client) breakPromises(pfids []*pb.FID) <-chan struct{} {
	fids := make([]node.FID, len(pfids))
	for i, f := range pfids {
		fids[i] = f.ToFID()
	}
	c.log.Debug("break", "fids", fids)
	c.counters.breaks.Add(int64(len(fids)))
	c.cbMu.Lock()
	for _, f := range fids {
		c.cb.Break(f)
	}
	c.cbMu.Unlock()
	c.invalidate(fids)
	done := make(chan struct{})
	if c.opts.OnInvalidate == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		c.opts.OnInvalidate(fids)
	}()
	return done
}

func (c *Client) resetPromises() {
	c.cbMu.Lock()
	fids := c.cb.Reset()
	c.cbMu.Unlock()
	c.invalidate(fids)
	// Nodes without a recorded promise may still carry a stale flag from a
	// grant racing this reset; clear them all.
	c.nodesMu.Lock()
	all := make([]node.FID, 0, len(c.nodes))
	for f, n := range c.nodes {
		n.valid.Store(false)
		all = append(all, f)
	}
	c.nodesMu.Unlock()
	if c.opts.OnInvalidate != nil {
		// Not waited for: after a restart nobody else changes anything
		// before the grace period ends, and the back channel must run.
		go c.opts.OnInvalidate(all)
	}
}

// invalidate clears the valid flag of fids. Cached data and listings stay:
// the next use revalidates them by DataVersion and keeps them if unchanged.
func (c *Client) invalidate(fids []node.FID) {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	for _, f := range fids {
		if n := c.nodes[f]; n != nil {
			n.valid.Store(false)
		}
	}
}

// call runs a control RPC with the session identity and a deadline. A
// session the server no longer knows (it restarted, or dropped us) is
// re-established once and the call retried.
func (c *Client) call(fn func(ctx context.Context) error) error {
	return c.callTimeout(c.opts.RPCTimeout, fn)
}

// callData is call for bulk transfers, whose time grows with their size;
// a dead server is still noticed by the connection's keepalive.
func (c *Client) callData(fn func(ctx context.Context) error) error {
	return c.callTimeout(time.Hour, fn)
}

// callOnce is call for a request that changes the namespace: every
// attempt carries the same op id, so that an attempt whose reply was lost
// but which the server carried out is not carried out again (node.Op).
// op is the id, or "" for a new one.
func (c *Client) callOnce(op string, fn func(ctx context.Context) error) error {
	if op == "" {
		op = newOp()
	}
	return c.call(func(ctx context.Context) error {
		return fn(metadata.AppendToOutgoingContext(ctx, pb.OpMetadata, op))
	})
}

// newOp is a new op id.
func newOp() string {
	var id [16]byte
	rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

func (c *Client) callTimeout(timeout time.Duration, fn func(ctx context.Context) error) error {
	// A server that is down for a moment (a restart) is waited for, up to
	// the RPC timeout, rather than failing the call at once. Unavailable
	// may come after the request reached the server (the connection broke
	// before the reply): requests that would do harm twice go by callOnce.
	give := time.Now().Add(c.opts.RPCTimeout)
	if g := c.giveUp.Load(); g != 0 && g < give.UnixNano() {
		give = time.Unix(0, g)
	}
	reauth := false
	for {
		if err := c.awaitReady(give); err != nil {
			return err
		}
		session := *c.session.Load()
		if session == "" {
			// Between sessions: a request without one would reach a
			// restarted server as nobody's, before this client's reclaims.
			if session = c.awaitNewSession("", give); session == "" {
				return status.Errorf(codes.Unavailable, "server %s: no session for %v", c.opts.Server, c.opts.RPCTimeout)
			}
		}
		ctx, cancel := c.rpcContext(timeout)
		sent := time.Now()
		err := fn(ctx)
		cancel()
		c.counters.rpcs.Add(1)
		st, fromServer := status.FromError(err)
		code := st.Code()
		if fromServer && code != codes.Unavailable && code != codes.DeadlineExceeded && code != codes.Canceled && code != codes.Unauthenticated {
			c.answered(sent)
		}
		switch code {
		case codes.Unauthenticated:
			if !reauth {
				reauth = true
				c.awaitNewSession(session, time.Now().Add(c.opts.RPCTimeout))
				continue
			}
		case codes.Unavailable:
			if time.Now().Before(give) {
				select {
				case <-time.After(50 * time.Millisecond):
				case <-c.ctx.Done():
					return err
				}
				continue
			}
		}
		return err
	}
}

func (c *Client) rpcContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	if s := *c.session.Load(); s != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, pb.ClientMetadata, s)
	}
	return ctx, cancel
}

// awaitReady waits, until deadline, for the connection to the server to
// be up.
func (c *Client) awaitReady(deadline time.Time) error {
	if c.conn.GetState() == connectivity.Ready {
		return nil
	}
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	defer cancel()
	for {
		st := c.conn.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			c.conn.Connect()
		}
		if !c.conn.WaitForStateChange(ctx, st) {
			return status.Errorf(codes.Unavailable, "server %s unreachable for %v", c.opts.Server, c.opts.RPCTimeout)
		}
	}
}

// awaitNewSession waits, until deadline, for the back channel to establish
// a session other than stale, and returns it ("" if none came).
func (c *Client) awaitNewSession(stale string, deadline time.Time) string {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for {
		c.cbMu.Lock()
		ch := c.sessionC
		c.cbMu.Unlock()
		if s := *c.session.Load(); s != "" && s != stale {
			return s
		}
		select {
		case <-ch:
		case <-timeout.C:
			return ""
		case <-c.ctx.Done():
			return ""
		}
	}
}

// errOf turns an RPC error into an errno-carrying error for the caller.
func errOf(op, path string, err error) error {
	if err == nil {
		return nil
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = pb.Errno(err)
	}
	if errno == syscall.EIO || errno == syscall.ETIMEDOUT {
		return &os.PathError{Op: op, Path: path, Err: &rpcError{errno, err}}
	}
	return &os.PathError{Op: op, Path: path, Err: errno}
}

// rpcError keeps the transport's explanation next to the errno.
type rpcError struct {
	errno syscall.Errno
	err   error
}

func (e *rpcError) Error() string { return e.errno.Error() + ": " + status.Convert(e.err).Message() }
func (e *rpcError) Unwrap() error { return e.errno }
