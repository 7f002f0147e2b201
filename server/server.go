// Package server is the hoard file server: the gRPC face of a Backend (a
// vnode store, or a proxy's cache of a distant server), with the callback
// state machine deciding which clients must hear of each change before it
// is acknowledged.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/connlimit"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/latency"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/principal"
	"github.com/hoardfs/hoard/server/datachan"
	"github.com/hoardfs/hoard/server/session"
	"github.com/hoardfs/hoard/server/stage"
	"github.com/hoardfs/hoard/vnode"
)

// Config tunes the server's callback behaviour.
type Config struct {
	// PromiseTTL is how long a callback promise lasts.
	PromiseTTL time.Duration
	// BreakTimeout bounds how long a change waits for a holder to
	// acknowledge a break; a silent holder is then given up on.
	BreakTimeout time.Duration
	// Ping is how often the back channel carries a keepalive.
	Ping time.Duration
	// MaxPromises bounds promises held across all clients (0: no bound).
	MaxPromises int
	// Grace holds back changes after a start: clients that held promises
	// from the previous server life reconnect within it and drop them, so
	// no change is acknowledged while one of them could still trust a
	// promise this server no longer knows (NFSv4 has a grace period too).
	Grace time.Duration
	// Lease is how long a delegation outlives its holder's last request,
	// and how long a recall may go unanswered; 0: no delegations.
	Lease time.Duration
	// DirDelegations says which directories a client may be delegated,
	// to make files in on its own (dirdeleg.go): DirPrivate (the
	// default), DirAny or DirNone.
	DirDelegations string
	// DataStreams is how many bulk-data connections clients are asked to
	// use (0: their own choice).
	DataStreams int
	// MaxSessions and MaxSessionsPerPeer bound the clients connected at
	// once, in all and from one IP address (0: no bound): each holds a
	// back channel's queue and its state in the callback machine.
	MaxSessions, MaxSessionsPerPeer int
	// MaxDataConns and MaxDataConnsPerPeer bound the bulk-data channel's
	// connections open at once, in all and from one IP address (0: no
	// bound); a client refused one moves its data over gRPC instead.
	MaxDataConns, MaxDataConnsPerPeer int
	// MaxReserved bounds the FIDs reserved for directory delegations and
	// not yet used, across all sessions of this server life, ended ones
	// too (0: no bound): a client that reserved its most, reconnected and
	// reserved again would otherwise grow the store without end.
	MaxReserved int
	// DataRequestTimeout is how long a data connection has to send a whole
	// request once it begins one, and its first once it opens;
	// DataIdleTimeout how long it may wait between requests.
	DataRequestTimeout, DataIdleTimeout time.Duration
	// Key makes session tokens (package session): LoadKey's, kept across
	// restarts; if nil, a new one for this process alone, and clients of
	// an earlier life cannot prove their reclaims.
	Key []byte
	// Users says whom a request's token makes its caller (auth.go);
	// with none the server is insecure: every request acts as an admin.
	// Principals is the cell's registry of users and groups, which ACL
	// entries name by number, and of revoked tokens (nil: a proxy's,
	// which passes names on to its origin).
	Users      Users
	Principals *principal.Registry
	// TLS, if set, secures the bulk-data channel as the caller secures
	// the gRPC one (cell.Identity.ServerTLS).
	TLS *tls.Config
	// Cell, if set, is the cell this file server is one of: where its
	// volumes are placed, and who answers location lookups.
	Cell *Cell
	// AnonymousListing lets callers without a token learn the cell's
	// volumes and servers (Locate, ListLocations, ListServers); without
	// it they may locate only a volume of this server whose root
	// system:anyuser may look in.
	AnonymousListing bool
	// MoveHold bounds how long a volume moving away stays frozen and
	// quiet for a mover that went silent (move.go).
	MoveHold time.Duration
	Logger   *slog.Logger
}

// Directory delegation policies (callback.DirPolicy).
const (
	DirPrivate = string(callback.DirPrivate)
	DirAny     = string(callback.DirAny)
	DirNone    = string(callback.DirNone)
)

// DefaultConfig is what `hoard server` uses unless told otherwise.
func DefaultConfig() Config {
	return Config{PromiseTTL: 10 * time.Minute, BreakTimeout: 2 * time.Second, Ping: 5 * time.Second, MaxPromises: 1 << 20, Grace: 3 * time.Second, MoveHold: 30 * time.Second, Lease: 30 * time.Second, DirDelegations: DirPrivate,
		MaxSessions: 16384, MaxSessionsPerPeer: 1024,
		MaxDataConns: 4096, MaxDataConnsPerPeer: 256, MaxReserved: 1 << 22, DataRequestTimeout: 10 * time.Second, DataIdleTimeout: 5 * time.Minute}
}

// Server implements hoardpb.FileServerServer.
type Server struct {
	pb.UnimplementedFileServerServer
	// store is what requests are served from: local, guarded in a cell
	// (move.go). local is the Backend as New was given it.
	store Backend
	local Backend
	cfg   Config
	log   *slog.Logger
	key   session.Key

	mu    sync.Mutex
	cb    *callback.Server
	conns map[callback.ClientID]*conn
	sent  Load // the counts of messages sent (under mu)
	// data counts the bulk-data channel's connections and bytes.
	data datachan.Counts
	// waited records how long requests waited for other clients to
	// acknowledge breaks and return recalled delegations.
	waited latency.Recorder
	peers  map[string]int // sessions by client IP address
	owners map[string]int // sessions by sessionOwner
	// reserved counts the FIDs each session reserved and has not used;
	// reservedAll those of every session of this server life, gone ones
	// too: their reservations stay in the store until pruned at the
	// second start after.
	reserved    map[callback.ClientID]int
	reservedAll int
	// reservedBy counts them by user, as reservedAll does.
	reservedBy map[string]int
	// stages are the staged stores kept across requests.
	stages    *stage.Table[Update]
	waiters   map[callback.Round]chan struct{}
	wake      chan struct{}
	stop      chan struct{}
	closeOnce sync.Once
	stopped   sync.WaitGroup
	grace     callback.Grace
	dataAddr  atomic.Pointer[string] // the bulk-data channel, once it listens
	// users remembers verified tokens; nil on an insecure server.
	users *users
	// moves are the moves of this server's volumes under way (move.go).
	moves moves
}

type conn struct {
	out    chan *pb.ServerMsg
	cancel context.CancelFunc
	// from is where the back channel came from, where the session's
	// requests must come from too.
	from net.Addr
	// restarted: the client proved a session of an earlier server life,
	// so it may reclaim in the grace period.
	restarted bool
	// owner is whose sessions it counts among (sessionOwner).
	owner string
}

// sessionOwner is whom a session counts against: its user at its
// address (one machine's clients of many users share an address, and
// many machines may use one service's token).
func sessionOwner(who access.Identity, from string) string {
	return who.String() + "@" + from
}

// New serves store; Shutdown stops its timer.
func New(store Backend, cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MoveHold <= 0 {
		cfg.MoveHold = DefaultConfig().MoveHold
	}
	s := &Server{
		store:      store,
		local:      store,
		cfg:        cfg,
		log:        cfg.Logger,
		key:        cfg.Key,
		cb:         callback.NewServer(store.Epoch(), callback.Config{PromiseTTL: cfg.PromiseTTL, BreakTimeout: cfg.BreakTimeout, MaxPromises: cfg.MaxPromises, Lease: cfg.Lease, Dirs: callback.DirPolicy(cfg.DirDelegations)}),
		conns:      map[callback.ClientID]*conn{},
		peers:      map[string]int{},
		owners:     map[string]int{},
		reserved:   map[callback.ClientID]int{},
		reservedBy: map[string]int{},
		waiters:    map[callback.Round]chan struct{}{},
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		grace:      callback.NewGrace(store.Epoch(), time.Now(), cfg.Grace, cfg.Lease),
	}
	if cfg.Users != nil {
		s.users = newUsers(cfg.Users)
	}
	s.stages = stage.New[Update](s.users != nil, time.Now, s.log)
	if cfg.Principals != nil {
		// Called under the location database's lock (its watch applies
		// the change): forgetting the tokens' identities takes a leaf
		// lock, so it is done at once, before a request could use one;
		// telling the clients takes s.mu, so it is done beside.
		cfg.Principals.OnChange(func(narrowed bool) {
			s.users.forget()
			if narrowed {
				go s.tellRightsChanged()
			}
		})
	}
	s.moves.init()
	if cfg.Cell != nil {
		s.store = guarded{store, s}
	}
	if s.key == nil {
		s.key = make(session.Key, session.KeySize)
		rand.Read(s.key)
	}
	s.stopped.Add(1)
	go s.timer()
	return s
}

// Shutdown stops the callback timer and drops every back channel; it may be
// called more than once.
func (s *Server) Shutdown() {
	s.closeOnce.Do(func() { close(s.stop) })
	s.stopped.Wait()
	s.mu.Lock()
	for _, c := range s.conns {
		c.cancel()
	}
	s.mu.Unlock()
	s.stages.Drop(0)
}

// timer feeds the callback state machine the passage of time: expiries and
// break timeouts.
func (s *Server) timer() {
	defer s.stopped.Done()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.wake:
		}
		s.mu.Lock()
		s.sendLocked(s.cb.Tick(time.Now()))
		next := s.cb.NextDeadline()
		s.mu.Unlock()
		d := time.Second
		if !next.IsZero() {
			d = min(d, max(time.Until(next), time.Millisecond))
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(d)
	}
}

func (s *Server) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// sendLocked queues messages on their clients' back channels. A client whose
// queue is full is not keeping up: it is disconnected, which drops its
// promises, rather than let a break be lost silently.
func (s *Server) sendLocked(msgs []callback.Msg) {
	for _, m := range msgs {
		c := s.conns[m.Client]
		if c == nil {
			continue
		}
		var out *pb.ServerMsg
		switch m.Kind {
		case callback.MsgBreak:
			fids := make([]*pb.FID, len(m.FIDs))
			for i, f := range m.FIDs {
				fids[i] = pb.FromFID(f)
			}
			out = &pb.ServerMsg{Msg: &pb.ServerMsg_Break{Break: &pb.Break{Seq: m.Seq, Fids: fids}}}
		case callback.MsgReset:
			out = &pb.ServerMsg{Msg: &pb.ServerMsg_Reset_{Reset_: &pb.Reset{}}}
		case callback.MsgRecall:
			fids := make([]*pb.FID, len(m.FIDs))
			for i, f := range m.FIDs {
				fids[i] = pb.FromFID(f)
			}
			out = &pb.ServerMsg{Msg: &pb.ServerMsg_Recall{Recall: &pb.Recall{Fids: fids, States: m.States}}}
		case callback.MsgRevoke:
			fids := make([]*pb.FID, len(m.FIDs))
			for i, f := range m.FIDs {
				fids[i] = pb.FromFID(f)
			}
			out = &pb.ServerMsg{Msg: &pb.ServerMsg_Revoke{Revoke: &pb.Revoke{Fids: fids, States: m.States}}}
		default:
			continue
		}
		switch m.Kind {
		case callback.MsgBreak:
			s.sent.Broken += int64(len(m.FIDs))
		case callback.MsgReset:
			s.sent.Resets++
		case callback.MsgRecall:
			s.sent.Recalled += int64(len(m.FIDs))
		case callback.MsgRevoke:
			s.sent.Revoked += int64(len(m.FIDs))
		}
		select {
		case c.out <- out:
		default:
			s.log.Warn("client not reading its back channel; disconnecting it", "client", m.Client)
			c.cancel()
			delete(s.conns, m.Client)
			s.cb.Disconnect(m.Client, time.Now())
		}
	}
	for r, ch := range s.waiters {
		if s.cb.Done(r) {
			close(ch)
			delete(s.waiters, r)
		}
	}
}

// MaxClientName bounds the name a client gives in its Hello (a host name
// and a little more; NFSv4 bounds its client owner at 1 KiB too).
const MaxClientName = 1024

// peerHost is the address a request came from, as connections are
// counted by it ("" when unknown).
func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	return connlimit.Peer(p.Addr)
}

// Bound bounds the control connections l accepts, in all and from one
// address, at twice the sessions: a connection that never says Hello
// costs a descriptor and gRPC's buffers too. (A client past the bound on
// sessions is told so by Connect; one past this one only sees its
// connection closed.)
func (s *Server) Bound(l net.Listener) net.Listener {
	return connlimit.New(l, 2*s.cfg.MaxSessions, 2*s.cfg.MaxSessionsPerPeer, func(_ net.Conn, why error) {
		s.log.Warn("control connection refused", "why", why)
	})
}

// RightsChanged forgets the identities of the tokens it checked and
// tells every client to forget the users' rights it learnt: someone may
// have lost some (a token revoked, a member removed from a group, a
// group deleted), as an ACL change breaks the promises of the files it
// governs. A client whose queue is full is behind on everything, and is
// cut off: it starts again, with nothing cached trusted.
func (s *Server) RightsChanged() {
	s.users.forget()
	s.tellRightsChanged()
}

// tellRightsChanged is RightsChanged's message to every client.
func (s *Server) tellRightsChanged() {
	msg := &pb.ServerMsg{Msg: &pb.ServerMsg_RightsChanged{RightsChanged: &pb.RightsChanged{}}}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		select {
		case c.out <- msg:
		default:
			c.cancel()
		}
	}
}

// admitLocked refuses a session past the bounds on sessions (mu held):
// in all, from one address, and of one user at that address (a quarter
// of the address's, so that one user's leave room for the others there).
func (s *Server) admitLocked(from, owner string) error {
	if n := s.cfg.MaxSessionsPerPeer / 4; n > 0 && s.owners[owner] >= n && s.users != nil { // insecure: everyone is one user
		return status.Errorf(codes.ResourceExhausted, "connect: %d clients connected as %s, the most this server takes of one user at one address (a quarter of --max-sessions-per-peer)", s.owners[owner], owner)
	}
	if n := s.cfg.MaxSessions; n > 0 && len(s.conns) >= n {
		return status.Errorf(codes.ResourceExhausted, "connect: %d clients connected, the most this server takes (--max-sessions)", len(s.conns))
	}
	if n := s.cfg.MaxSessionsPerPeer; n > 0 && s.peers[from] >= n {
		return status.Errorf(codes.ResourceExhausted, "connect: %d clients connected from %s, the most this server takes from one address (--max-sessions-per-peer)", s.peers[from], from)
	}
	return nil
}

// ended forgets session id, whose back channel c (from from) ended.
func (s *Server) ended(id callback.ClientID, c *conn, from string) {
	s.mu.Lock()
	if s.peers[from]--; s.peers[from] <= 0 {
		delete(s.peers, from)
	}
	if c != nil {
		if s.owners[c.owner]--; s.owners[c.owner] <= 0 {
			delete(s.owners, c.owner)
		}
	}
	delete(s.reserved, id)
	ours := s.conns[id] == c
	if ours {
		delete(s.conns, id)
		s.cb.Disconnect(id, time.Now())
		s.sendLocked(nil)
	}
	s.mu.Unlock()
	if ours {
		s.stages.Drop(id)
	}
	s.log.Debug("client disconnected", "client", id)
}

// Connect is a client's back channel: Welcome, then breaks, resets and
// pings from the server, acknowledgements from the client.
func (s *Server) Connect(stream pb.FileServer_ConnectServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "connect: the first message must be Hello")
	}
	if hello.Version != pb.Version {
		return status.Errorf(codes.FailedPrecondition, "connect: protocol version %d, server speaks %d", hello.Version, pb.Version)
	}
	if len(hello.Name) > MaxClientName {
		return status.Errorf(codes.InvalidArgument, "connect: a client name of %d bytes, more than %d", len(hello.Name), MaxClientName)
	}
	// A session is the machine's, and anonymous may hold one; a token
	// that does not check out is refused here, at once, not at the
	// first request.
	who, err := s.identify(stream.Context())
	if err != nil {
		return err
	}
	from := peerHost(stream.Context())
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	c := &conn{out: make(chan *pb.ServerMsg, 4096), cancel: cancel, owner: sessionOwner(who, from)}
	if p, ok := peer.FromContext(stream.Context()); ok {
		c.from = p.Addr
	}
	line, restarted := s.previous(hello.Previous)
	c.restarted = restarted
	s.mu.Lock()
	if err := s.admitLocked(from, c.owner); err != nil {
		s.mu.Unlock()
		s.log.Warn("client refused", "from", from, "err", err)
		return err
	}
	s.peers[from]++
	s.owners[c.owner]++
	id := s.cb.Connect(hello.Name, line, time.Now())
	s.conns[id] = c
	token := s.key.Make(session.Token{Epoch: s.store.Epoch(), ID: id, Line: s.cb.Line(id)})
	statesFrom := s.cb.NextState()
	s.mu.Unlock()
	s.log.Debug("client connected", "client", id, "name", hello.Name)
	defer s.ended(id, c, from)
	var dataAddr string
	if a := s.dataAddr.Load(); a != nil {
		dataAddr = *a
	}
	err = stream.Send(&pb.ServerMsg{Msg: &pb.ServerMsg_Welcome{Welcome: &pb.Welcome{
		ClientId: uint64(id), Epoch: s.store.Epoch(), Version: pb.Version, PingMs: uint32(s.cfg.Ping / time.Millisecond), DataAddr: dataAddr,
		LeaseMs: uint32(s.cfg.Lease / time.Millisecond), DataStreams: uint32(s.cfg.DataStreams), Session: token, StatesFrom: statesFrom,
		MaxFileSize: s.store.MaxFileSize()}}})
	if err != nil {
		return err
	}
	go func() {
		defer cancel()
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			// Anything the client says renews its lease; an Ack with seq 0
			// is how an idle holder of delegations keeps them.
			s.mu.Lock()
			s.cb.Renew(id, time.Now())
			if a := m.GetAck(); a != nil {
				s.cb.Ack(id, a.Seq, time.Now())
				s.sendLocked(nil)
			}
			s.mu.Unlock()
		}
	}()
	go func() {
		defer cancel()
		ping := time.NewTicker(s.cfg.Ping)
		defer ping.Stop()
		for {
			var m *pb.ServerMsg
			select {
			case <-ctx.Done():
				return
			case m = <-c.out:
			case <-ping.C:
				m = &pb.ServerMsg{Msg: &pb.ServerMsg_Ping{Ping: &pb.Ping{}}}
			}
			if err := stream.Send(m); err != nil {
				return
			}
		}
	}()
	// Returning ends the stream, which unblocks a Send stuck on a client
	// that stopped reading.
	<-ctx.Done()
	return nil
}

// opOf is the name the client gave a request that changes the namespace
// (empty if none).
func opOf(ctx context.Context) (node.Op, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(pb.OpMetadata)
	if len(vals) == 0 {
		return "", nil
	}
	op := node.Op(vals[0])
	return op, vnode.CheckOp(op)
}

// op is one RPC's view of the callback machinery: the break sequence taken
// before it read anything, so that a promise is granted only if nothing
// broke that FID since (a grant must never cover data older than a break
// its holder missed).
type op struct {
	s     *Server
	id    callback.ClientID
	since uint64
	// once names a namespace change for its retries (beginChange).
	once node.Op
	// user names the client in a proxy's requests to its origin.
	user string
	// who is whom the request acts for (auth.go); dirRights the ACL
	// rights it has on the directories this request looked at.
	who       access.Identity
	dirRights map[node.FID]access.Rights
	// held are the FIDs its change keeps busy until made (op.hold).
	held []node.FID
}

// beginChange is begin for an operation that changes something: it waits
// as long as the grace period after a restart holds back a request doing
// a (Changing; Reclaiming for one under a delegation), and takes the op
// id a namespace change carries (refusing a malformed one before anything
// happens).
func (s *Server) beginChange(ctx context.Context, a callback.Access) (*op, error) {
	once, err := opOf(ctx)
	if err != nil {
		return nil, pb.Err(err)
	}
	if err := s.waitGrace(ctx, a); err != nil {
		return nil, err
	}
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	o.once = once
	return o, nil
}

// waitGrace waits as long as the grace period after a restart holds back
// a request doing a (callback.Grace).
func (s *Server) waitGrace(ctx context.Context, a callback.Access) error {
	if wait := s.grace.Wait(a, time.Now()); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// beginOn is begin for a request on the file pf names, checked first (a
// bad one fails the request as method).
func (s *Server) beginOn(ctx context.Context, method string, pf *pb.FID) (*op, node.FID, error) {
	f, err := checkFID(strings.ToLower(method), pf)
	if err != nil {
		return nil, f, s.fail(method, err)
	}
	o, err := s.begin(ctx)
	return o, f, err
}

// beginRead is beginOn for a read of the file's status or data, which
// the caller must have need on: other clients' write delegations on it
// are recalled first.
func (s *Server) beginRead(ctx context.Context, method string, pf *pb.FID, need access.Rights) (*op, node.FID, error) {
	o, f, err := s.beginOn(ctx, method, pf)
	if err == nil {
		err = o.may(f, need, strings.ToLower(method))
	}
	if err == nil {
		_, err = s.recallFor(ctx, o, false, f)
	}
	return o, f, err
}

func (s *Server) begin(ctx context.Context) (*op, error) {
	id, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	who, err := s.identify(ctx)
	if err != nil {
		return nil, err
	}
	o := s.opFor(id)
	o.who = who
	return o, nil
}

// opFor starts an operation of client id; every request renews the
// client's delegation lease.
func (s *Server) opFor(id callback.ClientID) *op {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cb.Renew(id, time.Now())
	return &op{s: s, id: id, since: s.cb.Seq(), user: s.cb.Name(id)}
}

// status converts st for the reply, granting the caller a promise on it,
// with the caller's rights on it.
func (o *op) status(st node.Status) *pb.Status {
	if r, err := o.rightsOf(st); err == nil {
		st.Rights = uint8(r) | node.RightsKnown
	}
	if o.id == 0 {
		return pb.FromStatus(st, 0)
	}
	limit := o.s.store.PromiseLimit(st.FID)
	if limit <= 0 {
		return pb.FromStatus(st, 0)
	}
	o.s.mu.Lock()
	ttl, msgs, ok := o.s.cb.Grant(o.id, o.s.promiseOn(st.FID), o.since, time.Now())
	o.s.sendLocked(msgs)
	o.s.mu.Unlock()
	if len(msgs) > 0 {
		o.s.poke()
	}
	if !ok {
		ttl = 0
	}
	return pb.FromStatus(st, min(ttl, limit))
}

// changed breaks every other holder's promise on fids and waits until they
// acknowledged or were given up on: only then may the change be acknowledged.
// Delegations other clients were granted while the change was being made
// (after its own recall, before it was applied) came with what it replaced:
// they are recalled too.
func (o *op) changed(ctx context.Context, fids ...node.FID) {
	s := o.s
	now := time.Now()
	s.mu.Lock()
	recalled := s.waitLocked(s.cb.Recall(o.id, fids, now))
	broken := s.waitLocked(s.cb.Break(o.id, fids, now))
	s.mu.Unlock()
	s.await(ctx, recalled)
	s.await(ctx, broken)
}

// Invalidate breaks every client's promise on fids, and recalls their
// delegations, and waits until they acknowledged or were given up on: a
// proxy calls it when the server behind it broke a promise of its own,
// before it acknowledges that break.
func (s *Server) Invalidate(fids []node.FID) {
	(&op{s: s}).changed(context.Background(), fids...)
}

// checkFID refuses a FID that cannot name anything.
func checkFID(what string, f *pb.FID) (node.FID, error) {
	if f == nil || f.Volume == 0 || f.Vnode == 0 {
		return node.FID{}, fmt.Errorf("%s: missing or zero fid: %w", what, syscall.EINVAL)
	}
	return f.ToFID(), nil
}

// checkFIDs is checkFID for each of pfs.
func checkFIDs(what string, pfs ...*pb.FID) ([]node.FID, error) {
	fids := make([]node.FID, len(pfs))
	for i, pf := range pfs {
		var err error
		if fids[i], err = checkFID(what, pf); err != nil {
			return nil, err
		}
	}
	return fids, nil
}

// fail logs unexpected errors and converts any error for the wire. An
// errno error from the server behind a proxy counts as an errno.
func (s *Server) fail(method string, err error) error {
	// A refusal (the volume is at another server) is no fault.
	if errno := pb.Errno(err); (errno == syscall.EIO || errno == syscall.ENOSPC) && status.Code(err) != codes.FailedPrecondition {
		s.log.Warn(method+" failed", "err", err)
	}
	return s.wire(err)
}

// wire is err as a reply carries it. A request about a volume this server
// does not hold, which the cell places at another (it moved), is answered
// with where it is (notHere).
func (s *Server) wire(err error) error {
	var nv *vnode.NoVolumeError
	if c := s.cfg.Cell; c != nil && errors.As(err, &nv) {
		if v, ok := c.DB.Volume(nv.ID); ok && v.RW != c.Name {
			return notHere(s.location(v))
		}
		if v, ok := c.DB.ByROID(nv.ID); ok && len(v.RO) > 0 {
			return notHere(s.roLocation(v))
		}
	}
	return pb.Err(err)
}

// Trace logs every request at debug level, with its outcome: the record
// to read when a client and the server disagree about what happened.
func (s *Server) Trace(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.log.Enabled(ctx, slog.LevelDebug) {
		return handler(ctx, req)
	}
	start := time.Now()
	reply, err := handler(ctx, req)
	id, _ := s.caller(ctx)
	s.log.Debug("request", "method", path.Base(info.FullMethod), "client", id, "req", req, "took", time.Since(start), "err", err)
	return reply, err
}

// TraceStream is Trace for the streaming RPCs (Fetch, Store, Connect): it
// logs the first request message, which names the file.
func (s *Server) TraceStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !s.log.Enabled(ss.Context(), slog.LevelDebug) || info.FullMethod == pb.FileServer_Connect_FullMethodName {
		return handler(srv, ss)
	}
	start := time.Now()
	rs := &recordingStream{ServerStream: ss}
	err := handler(srv, rs)
	id, _ := s.caller(ss.Context())
	s.log.Debug("request", "method", path.Base(info.FullMethod), "client", id, "req", rs.first, "took", time.Since(start), "err", err)
	return err
}

// recordingStream keeps the first message a stream received.
type recordingStream struct {
	grpc.ServerStream
	first any
}

func (r *recordingStream) RecvMsg(m any) error {
	err := r.ServerStream.RecvMsg(m)
	if err == nil && r.first == nil {
		if sr, ok := m.(*pb.StoreRequest); ok {
			// The header, without its data.
			m = &pb.StoreRequest{Fid: sr.Fid, BaseVersion: sr.BaseVersion, HasTruncate: sr.HasTruncate, Truncate: sr.Truncate,
				HasSize: sr.HasSize, Size: sr.Size, Sync: sr.Sync, DelegState: sr.DelegState, Op: sr.Op}
		}
		r.first = m
	}
	return err
}
