// Package conn is a client's connection to its file server: the gRPC
// connection with its retry rules, the back channel that keeps a session
// and hears breaks and recalls, and the path file contents take (the
// server's bulk-data channel, or gRPC). It knows nothing of files: what
// the back channel hears goes to a Handler.
package conn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Config describes the connection.
type Config struct {
	// Server is the file server's address, host:port; Name identifies
	// the client in the server's logs.
	Server, Name string
	// RPCTimeout bounds each control RPC, and how long a call waits for
	// an unreachable server.
	RPCTimeout time.Duration
	// Patience, if set, is how long a call waits for an unreachable
	// server instead (a read-only copy's site: another site serves).
	Patience time.Duration
	// DataStreams is how many bulk-data connections to use (the server
	// may ask for more); NoDataChannel keeps file contents on gRPC.
	DataStreams   int
	NoDataChannel bool
	// SessionFile, if set, keeps the last session token, so that the
	// next process continues this one's line of sessions (a restarted
	// proxy: its clients' reclaims find its delegations).
	SessionFile string
	// TLS secures both channels with the cell's CA (cell.UserTLS); nil
	// talks plain TCP, to an insecure server only.
	TLS *tls.Config
	// Token is the user's token, sent with every request; empty: the
	// client is anonymous.
	Token string
	// OnRefused, if set, hears every error the server answered a call
	// with (not those it will send again): a client learns there that a
	// volume moved.
	OnRefused func(error)
	Log       *slog.Logger
}

// Handler hears what the back channel says. Its methods run on the back
// channel's goroutine, in the order the server sent, and must not wait
// for the server.
type Handler interface {
	// Welcome hears of each new session before it carries any request.
	Welcome(w *pb.Welcome)
	// Resumed follows the Welcome of every session after the first, once
	// requests carry it: the old session's promises may have missed
	// breaks, and its delegations are to be reclaimed.
	Resumed()
	// Break drops promises; the break is acknowledged when the channel it
	// returns is closed (acknowledgements are cumulative, in order).
	Break(fids []*pb.FID) <-chan struct{}
	// Reset drops every promise and delegation.
	Reset()
	// Recall asks for delegations back; statesFrom is the session's first
	// state id. Revoke says the server took delegations back.
	Recall(r *pb.Recall, statesFrom uint64)
	Revoke(r *pb.Revoke)
	// Answered hears of each call the server answered, and when it was
	// sent: the delegation lease counts from there.
	Answered(sent time.Time)
	// RightsChanged says someone may have lost rights in the cell: every
	// user's rights learnt are to be forgotten.
	RightsChanged()
}

// Conn is a connection to one server.
type Conn struct {
	cfg  Config
	log  *slog.Logger
	h    Handler
	cc   *grpc.ClientConn
	rpc  pb.FileServerClient
	grpc datapath.GRPC
	data atomic.Pointer[dataPath] // the path file contents take now

	// session is the current back-channel identity, the token the
	// server's Welcome gave; empty while disconnected. last is the last
	// one (backChannel's), which a new session's Hello names so the
	// server lets it reclaim that session's delegations.
	session  atomic.Pointer[string]
	last     string
	mu       sync.Mutex
	sessionC chan struct{} // closed and replaced whenever session changes (mu)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// giveUp, once set (Unix ns), is when requests stop waiting for an
	// unreachable server.
	giveUp atomic.Int64
	rpcs   atomic.Int64
}

// New prepares a connection to cfg.Server; Start begins its sessions.
func New(cfg Config, h Handler) (*Conn, error) {
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	cc, err := grpc.NewClient(cfg.Server,
		grpc.WithTransportCredentials(creds),
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
		return nil, fmt.Errorf("server %s: %w", cfg.Server, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Conn{cfg: cfg, log: cfg.Log, h: h, cc: cc, rpc: pb.NewFileServerClient(cc), sessionC: make(chan struct{}), ctx: ctx, cancel: cancel}
	c.grpc = datapath.GRPC{Client: c.rpc}
	c.data.Store(&dataPath{Path: c.grpc})
	c.session.Store(new(string))
	c.last = c.loadSession()
	return c, nil
}

// Start runs the back channel until Close. The first session's handshake
// is reported on the channel it returns: nil once it began, or why not.
func (c *Conn) Start() <-chan error {
	first := make(chan error, 1)
	c.wg.Add(1)
	go c.backChannel(first)
	return first
}

// Close stops the back channel and closes the connection.
func (c *Conn) Close() {
	c.cancel()
	c.wg.Wait()
	c.cc.Close()
	if sp, ok := c.data.Load().Path.(*datapath.Split); ok {
		sp.Close()
	}
}

// GiveUp makes requests stop waiting for an unreachable server at t (a
// client closing). GiveUpAt says when (zero: not set).
func (c *Conn) GiveUp(t time.Time) { c.giveUp.Store(t.UnixNano()) }

func (c *Conn) GiveUpAt() time.Time {
	if g := c.giveUp.Load(); g != 0 {
		return time.Unix(0, g)
	}
	return time.Time{}
}

// RPC is the server's control API; calls go through Call.
func (c *Conn) RPC() pb.FileServerClient { return c.rpc }

// Data is the path file contents take now.
func (c *Conn) Data() datapath.Path { return c.data.Load().Path }

// Session is the current session's token, "" between sessions.
func (c *Conn) Session() string { return *c.session.Load() }

// Ready reports whether the connection is up now.
func (c *Conn) Ready() bool { return c.cc.GetState() == connectivity.Ready }

// RPCs counts the control calls made.
func (c *Conn) RPCs() int64 { return c.rpcs.Load() }

// backChannel keeps a Connect stream open, reconnecting with backoff. While
// the server is unreachable, promises are kept until they expire, so cached
// data stays readable (as AFS does); each new stream is a new session, and
// promises from the old one may have missed breaks, so they are all dropped
// before the new session is used.
func (c *Conn) backChannel(first chan<- error) {
	defer c.wg.Done()
	backoff := 100 * time.Millisecond
	for c.ctx.Err() == nil {
		err := c.runSession(first)
		if first != nil {
			// The handshake's failure; after a handshake runSession
			// reported, nobody may read this (Start's caller gave up).
			select {
			case first <- err:
			default:
			}
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
			c.log.Debug("back channel lost", "server", c.cfg.Server, "err", err)
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
func (c *Conn) runSession(first chan<- error) error {
	ctx, cancel := context.WithCancel(user(c.ctx, c.cfg.Token))
	defer cancel()
	stream, err := c.rpc.Connect(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.ClientMsg{Msg: &pb.ClientMsg_Hello{Hello: &pb.Hello{Version: pb.Version, Name: c.cfg.Name, Previous: c.last}}}); err != nil {
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
	c.h.Welcome(w)
	c.useDataChannel(w.DataAddr, max(c.cfg.DataStreams, int(w.DataStreams)))
	c.last = w.Session
	c.saveSession(w.Session)
	c.setSession(w.Session)
	if first == nil {
		c.h.Resumed()
	} else {
		first <- nil
	}
	// A server that says nothing for several ping intervals is gone, even
	// if TCP has not noticed yet: the stream is dropped for a new session
	// (promises hold until they expire, as while the server is away).
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
				c.log.Warn("server silent on the back channel; reconnecting", "server", c.cfg.Server)
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
			a := ackAfter{seq: m.Break.Seq, done: c.h.Break(m.Break.Fids)}
			select {
			case acks <- a:
			case <-ctx.Done():
				return ctx.Err()
			}
		case *pb.ServerMsg_Reset_:
			c.h.Reset()
		case *pb.ServerMsg_Recall:
			c.h.Recall(m.Recall, w.StatesFrom)
		case *pb.ServerMsg_Revoke:
			c.h.Revoke(m.Revoke)
		case *pb.ServerMsg_RightsChanged:
			c.h.RightsChanged()
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
func (c *Conn) useDataChannel(addr string, streams int) {
	if c.cfg.NoDataChannel {
		addr = ""
	}
	addr = reachable(c.cfg.Server, addr)
	if addr == "" {
		streams = 0
	}
	old := c.data.Load()
	if old.addr == addr && old.streams == streams {
		return
	}
	next := &dataPath{Path: c.grpc, addr: addr, streams: streams}
	if addr != "" {
		next.Path = datapath.NewSplit(addr, streams, c.grpc, func() string { return *c.session.Load() }, c.cfg.TLS)
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

// loadSession reads the last session token kept (Config.SessionFile).
func (c *Conn) loadSession() string {
	if c.cfg.SessionFile == "" {
		return ""
	}
	b, err := os.ReadFile(c.cfg.SessionFile)
	if err != nil || len(b) > 256 {
		return ""
	}
	return string(b)
}

// saveSession replaces the file whole; not synced: after a crash an older
// token of the same line does as well.
func (c *Conn) saveSession(tok string) {
	path := c.cfg.SessionFile
	if path == "" {
		return
	}
	err := os.WriteFile(path+".new", []byte(tok), 0o600)
	if err == nil {
		err = os.Rename(path+".new", path)
	}
	if err != nil {
		c.log.Warn("session token not kept: a restart will not reclaim this session's delegations", "err", err)
	}
}

func (c *Conn) setSession(s string) {
	c.session.Store(&s)
	c.mu.Lock()
	old := c.sessionC
	c.sessionC = make(chan struct{})
	c.mu.Unlock()
	close(old)
}

// Call runs a control RPC with the session identity and a deadline, as
// the connection's own user (Config.Token): what belongs to the session
// (returns, renewals) and what the client asks for itself. A session the
// server no longer knows (it restarted, or dropped us) is re-established
// once and the call retried.
func (c *Conn) Call(fn func(ctx context.Context) error) error { return c.As(c.cfg.Token).Call(fn) }

// Caller makes calls on the connection for one user: the session is the
// machine's, the user each request's (the server checks the user's
// rights on every request that touches a file).
type Caller struct {
	c     *Conn
	token string
}

// As is the connection's Caller for the user of token ("": anonymous): a
// mount serves each local user with their own token, and a proxy asks
// its origin who its own clients are.
func (c *Conn) As(token string) Caller { return Caller{c, token} }

// Call runs a control RPC as the Caller's user (see Conn.Call).
func (a Caller) Call(fn func(ctx context.Context) error) error {
	return a.c.callTimeout(a.c.cfg.RPCTimeout, a.c.patience(), a.token, fn)
}

// CallData is Call for bulk transfers, whose time grows with their size;
// a dead server is still noticed by the connection's keepalive. The data
// channel takes the user's token from the call's context.
func (a Caller) CallData(fn func(ctx context.Context) error) error {
	return a.c.callTimeout(time.Hour, a.c.patience(), a.token, fn)
}

// CallPatient is CallData waiting at most patience for an unreachable
// server (not the RPC timeout): a step of a larger task that is better
// failed, and run again, than waited for.
func (a Caller) CallPatient(patience time.Duration, fn func(ctx context.Context) error) error {
	return a.c.callTimeout(time.Hour, patience, a.token, fn)
}

// CallOnce is Call for a request that changes the namespace: every
// attempt carries the same op id, so that an attempt whose reply was lost
// but which the server carried out is not carried out again (node.Op).
// op is the id, or "" for a new one.
func (a Caller) CallOnce(op string, fn func(ctx context.Context) error) error {
	if op == "" {
		op = string(node.NewOp())
	}
	return a.Call(func(ctx context.Context) error {
		return fn(metadata.AppendToOutgoingContext(ctx, pb.OpMetadata, op))
	})
}

// patience is how long a call waits for an unreachable server.
func (c *Conn) patience() time.Duration {
	if c.cfg.Patience > 0 {
		return c.cfg.Patience
	}
	return c.cfg.RPCTimeout
}

func (c *Conn) callTimeout(timeout, patience time.Duration, token string, fn func(ctx context.Context) error) error {
	// A server that is down for a moment (a restart) is waited for, up to
	// patience, rather than failing the call at once. Unavailable may
	// come after the request reached the server (the connection broke
	// before the reply): requests that would do harm twice go by callOnce.
	give := time.Now().Add(patience)
	if g := c.giveUp.Load(); g != 0 && g < give.UnixNano() {
		give = time.Unix(0, g)
	}
	reauth := false
	for {
		if err := c.AwaitReady(give); err != nil {
			return err
		}
		session := *c.session.Load()
		if session == "" {
			// Between sessions: a request without one would reach a
			// restarted server as nobody's, before this client's reclaims.
			if session = c.AwaitSession("", give); session == "" {
				return status.Errorf(codes.Unavailable, "server %s: no session for %v", c.cfg.Server, c.cfg.RPCTimeout)
			}
		}
		ctx, cancel := c.rpcContext(timeout, token)
		sent := time.Now()
		err := fn(ctx)
		cancel()
		c.rpcs.Add(1)
		st, fromServer := status.FromError(err)
		code := st.Code()
		if fromServer && code != codes.Unavailable && code != codes.DeadlineExceeded && code != codes.Canceled && code != codes.Unauthenticated {
			c.h.Answered(sent)
		}
		switch code {
		case codes.Unauthenticated:
			if !reauth {
				reauth = true
				c.AwaitSession(session, time.Now().Add(c.cfg.RPCTimeout))
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
		if fromServer && err != nil && c.cfg.OnRefused != nil {
			c.cfg.OnRefused(err)
		}
		return err
	}
}

// user has ctx's requests made for the user of token (none: anonymous).
func user(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, pb.UserMetadata, "Bearer "+token)
}

func (c *Conn) rpcContext(timeout time.Duration, token string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(user(c.ctx, token), timeout)
	if s := *c.session.Load(); s != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, pb.ClientMetadata, s)
	}
	return ctx, cancel
}

// AwaitReady waits, until deadline, for the connection to the server to
// be up.
func (c *Conn) AwaitReady(deadline time.Time) error {
	if c.cc.GetState() == connectivity.Ready {
		return nil
	}
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	defer cancel()
	start := time.Now()
	for {
		st := c.cc.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			c.cc.Connect()
		}
		if !c.cc.WaitForStateChange(ctx, st) {
			return status.Errorf(codes.Unavailable, "server %s unreachable for %v", c.cfg.Server, time.Since(start).Round(time.Second))
		}
	}
}

// AwaitSession waits, until deadline, for the back channel to establish
// a session other than stale, and returns it ("" if none came).
func (c *Conn) AwaitSession(stale string, deadline time.Time) string {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for {
		c.mu.Lock()
		ch := c.sessionC
		c.mu.Unlock()
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

// ackAfter is a break to acknowledge once done is closed.
type ackAfter struct {
	seq  uint64
	done <-chan struct{}
}
