// Package client is hoard's cache manager as a Go library: a persistent
// chunk cache kept coherent by callback promises, and views of it for
// the layers above: Nodes for the FUSE mount, FIDs for the proxy.
// Package pathfs is the file API by path over it.
//
// Consistency: close-to-open. What one client wrote is seen by every client
// that opens the file after the writer's Close or Sync returned, and a cached
// read never returns data older than the last break the client received.
// While a promise is valid, reads touch neither the network nor a lock.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/client/admin"
	"github.com/hoardfs/hoard/client/site"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client/conn"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/client/user"
	"github.com/hoardfs/hoard/client/writeback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/latency"
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
	// CacheKey, if set (cache.KeySize bytes), encrypts the cache files on
	// disk (cache.Options.Key): the cache starts empty.
	CacheKey []byte
	// ChunkSize is used when a cache is created (default 256 KiB).
	ChunkSize int64
	// DialTimeout bounds how long Dial waits for the server (default 5 s).
	DialTimeout time.Duration
	// RPCTimeout bounds each control RPC (default 30 s).
	RPCTimeout time.Duration
	// Patience is how long a request waits for a server it cannot reach
	// (default RPCTimeout).
	Patience time.Duration
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
	// LazyRoot resolves the root volume at its first use, not at Dial:
	// a client for the cell's administration then works while the root
	// volume's server is down.
	LazyRoot bool
	// FlushAge bounds how long writes under a write delegation stay
	// unstored (default 30 s): what a client crash can lose.
	FlushAge time.Duration
	// KeepSession keeps the session token in CacheDir, so that the next
	// process with this cache continues this one's line of sessions and
	// takes over its delegations (a proxy restarted: its own clients'
	// reclaims come through it). Not for a client whose cache may hold a
	// killed process's half-done writes: those go to lost/.
	KeepSession bool
	// TLS secures the connection with the cell's CA (cell.UserTLS); nil
	// talks plain TCP, to a server run insecure.
	TLS *tls.Config
	// Token is the user's, sent with every request; empty: anonymous.
	Token string
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
	// OnRightsChanged, when set, hears that the cell's principal registry
	// changed so that someone may have lost rights: a proxy forgets the
	// identities it was told and tells its own clients.
	OnRightsChanged func()
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

// Client is a connected cache manager: the user's handle on the cell. It
// keeps one cache and one table of nodes for all the cell's servers (FIDs
// are unique in a cell), and sends each node's requests to the site of
// the server holding its volume (package site). Its methods are safe
// for concurrent use.
type Client struct {
	opts Options
	// self is the client's own user (Options.Token): FIDs act as it,
	// and Nodes until told otherwise (Nodes.As).
	self  user.User
	log   *slog.Logger
	cache *cache.Cache
	// sites are the cell's servers this client reaches: the one it was
	// dialled to first.
	sites *site.Sites

	// unpublished are the bypassed opens with writes not yet published.
	unpublished stageIndex

	flusher *writeback.Flusher[dirtyNode]
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
	// room is each volume's free space as last asked, less what closes
	// accepted under write-back since (quota.go).
	roomMu sync.Mutex
	room   map[uint64]*volRoom
	// expiredLogged holds the tokens whose expiry was logged (checkToken).
	expiredLogged sync.Map
	// root is the root volume's root directory, once resolved
	// (rootDir); rootMu orders its resolution. Release reads it
	// unlocked: a mount resolves it at Dial.
	rootMu sync.Mutex
	root   *Node

	fetchSem chan struct{}
	ghosts   *policy.Ghosts
	counters counters

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// bg counts the protocol work started in the background (spawn):
	// gives back, reclaims, settles; Close waits for it. closing (under
	// bgMu) refuses more.
	bgMu    sync.Mutex
	bg      sync.WaitGroup
	closing bool
}

// counters are protocol counters beyond what the cache keeps.
type counters struct {
	breaks, resets, revalidations, dropped atomic.Int64
	// Delegations: opens and closes served locally, recalls received,
	// delegations revoked and reclaimed, bytes the flusher stored.
	localOpens, localCloses, recalls, revoked, reclaims, flushed atomic.Int64
	stores                                                       atomic.Int64
	// Directory delegations: files made here, removed before the server
	// knew them, and created there later; files removed here, and there
	// later.
	madeHere, madeDropped, settled, removedHere atomic.Int64
	// Files whose writes were kept in lost/, undeliverable.
	lost atomic.Int64
	// Opens that bypassed the cache, by the kind of rule that chose it
	// (policy.Rules).
	bypassOpens [len(policy.Rules)]atomic.Int64
	// How long chunk fetches and stores of file data took.
	fetchTime, storeTime latency.Recorder
}

// Dial connects to opts.Server and opens the cache. It fails within
// DialTimeout, naming the address, when the server cannot be reached.
func Dial(opts Options) (*Client, error) {
	opts.defaults()
	if opts.Server == "" {
		return nil, errors.New("no server address given")
	}
	ch, err := cache.Open(cache.Options{Dir: opts.CacheDir, Size: opts.CacheSize, ChunkSize: opts.ChunkSize, Key: opts.CacheKey})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		opts:      opts,
		self:      user.New(opts.Token),
		log:       opts.Logger,
		cache:     ch,
		nodes:     map[node.FID]*Node{},
		forgotten: map[*Node]struct{}{},
		vols:      map[string]*pb.Volume{},
		fetchSem:  make(chan struct{}, 16),
		ghosts:    policy.NewGhosts(4096, 10*time.Minute),
		ctx:       ctx,
		cancel:    cancel,
	}
	c.flusher = newFlusher(c)
	first, err := c.start(opts.Server, c.sessionFile("session"), opts.Patience)
	if err != nil {
		cancel()
		ch.Close()
		return nil, err
	}
	c.sites = site.NewSites(cellOf{c}, first)
	c.wg.Add(2)
	go c.expirer()
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		c.flusher.Run(c.ctx, t.C)
	}()
	if err = c.recoverDirty(); err == nil && !opts.LazyRoot {
		var away *site.DialError
		if _, err = c.rootDir(); errors.As(err, &away) {
			err = fmt.Errorf("%w: it holds the root volume, which a client needs unless the volume has read-only copies (hoard vol addsite root SERVER, then hoard vol release root)", err)
		}
	}
	if err != nil {
		c.Close()
		return nil, site.DialFailed(opts.Server, opts.Token == "", opts.TLS != nil, err)
	}
	return c, nil
}

// rootDir is the root volume's root directory, resolved at Dial or, with
// LazyRoot, at the first call.
func (c *Client) rootDir() (*Node, error) {
	c.rootMu.Lock()
	defer c.rootMu.Unlock()
	if c.root == nil {
		n, err := c.volumeRoot(node.RootVolume, c.self)
		if err != nil {
			return nil, err
		}
		c.root = n
	}
	return c.root, nil
}

// sessionFile is where the session named name is kept (KeepSession),
// or "" for none.
func (c *Client) sessionFile(name string) string {
	if !c.opts.KeepSession || c.opts.CacheDir == "" {
		return ""
	}
	return filepath.Join(c.opts.CacheDir, name)
}

// start opens a session with the server at addr, waiting patience for it
// when unreachable (0: the RPC timeout), and waits for its welcome:
// Dial's first server, or another of the cell's (site.Sites).
func (c *Client) start(addr, sessionFile string, patience time.Duration) (*site.Site, error) {
	opts := c.opts
	s := site.New(addr, opts.Token, nil, nil, opts.NoDelegations, c.log)
	cfg := conn.Config{Server: addr, Name: opts.Name, RPCTimeout: opts.RPCTimeout, Patience: patience, SessionFile: sessionFile,
		DataStreams: opts.DataStreams, NoDataChannel: opts.NoDataChannel, TLS: opts.TLS, Token: opts.Token, Log: opts.Logger,
		OnRefused: func(err error) {
			if l := site.WhereIs(err); l != nil && l.Id != 0 {
				c.sites.Moved(l)
			}
		}}
	cn, err := conn.New(cfg, handler{c, s})
	if err != nil {
		return nil, err
	}
	s.Conn, s.RPC = site.ConnLink{Conn: cn}, cn.RPC()
	select {
	case err = <-cn.Start():
	case <-time.After(opts.DialTimeout):
		err = fmt.Errorf("no answer within %v", opts.DialTimeout)
	}
	if err != nil {
		s.Conn.Close()
		return nil, site.DialFailed(addr, opts.Token == "", opts.TLS != nil, err)
	}
	return s, nil
}

// Close stores what the flusher still holds, gives delegations back, stops
// the back channels and closes the cache cleanly. Writes it could not store
// are kept in lost/, and the error says so. An unreachable server is
// waited for until closeWait after Close began, not an RPC timeout per
// request: a client whose server is gone stops in seconds.
func (c *Client) Close() error {
	all := c.sites.Close()
	giveUp := time.Now().Add(closeWait)
	for _, s := range all {
		s.Conn.GiveUp(giveUp)
	}
	lost := c.flushAll()
	for _, s := range all {
		c.returnAll(s)
	}
	c.cancel()
	for _, s := range all {
		s.Conn.Close()
	}
	c.wg.Wait()
	c.bgMu.Lock()
	c.closing = true
	c.bgMu.Unlock()
	c.bg.Wait()
	c.setGauges()
	return errors.Join(lost, c.cache.Close())
}

// closeWait is how long Close waits for an unreachable server.
const closeWait = 2 * time.Second

// spawn runs fn in the background, for Close to wait for; once Close has
// stopped the back channels, not at all (the server revokes what a give
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

// handler is what the client does with what a site's back channel hears
// (conn.Handler).
type handler struct {
	c *Client
	s *site.Site
}

func (h handler) Welcome(w *pb.Welcome) {
	if h.s.Welcome(w) {
		h.c.log.Info("server restarted; cached files will be revalidated", "server", h.s.Addr, "epoch", w.Epoch)
	}
}

// Resumed: the old session's promises may have missed breaks. Its
// delegations are held for us until their lease runs out (after a
// restart, for the grace period): reclaim those with dirty data, after
// the reset, which voids the tickets of replies already under way.
func (h handler) Resumed() {
	h.c.resetPromises(h.s)
	h.c.dropDelegations(h.s, true)
}

func (h handler) Break(fids []*pb.FID) <-chan struct{} { return h.c.breakPromises(h.s, fids) }

func (h handler) Reset() {
	h.c.counters.resets.Add(1)
	h.c.resetPromises(h.s)
	h.c.dropDelegations(h.s, false)
}

func (h handler) Recall(r *pb.Recall, statesFrom uint64) { h.c.onRecall(h.s, r, statesFrom) }
func (h handler) Revoke(r *pb.Revoke)                    { h.c.onRevoke(h.s, r) }
func (h handler) Answered(sent time.Time)                { h.c.giveBackAll(h.s, h.s.Answered(sent)) }
func (h handler) RightsChanged()                         { h.c.forgetRights() }

// expirer examines the promise lists once a second (Faster AFS §3.1.1) so
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
			c.sites.Each(func(s *site.Site) {
				c.invalidate(s.Tick(now))
				c.giveBackAll(s, s.KeepLease(now))
			})
			c.dropForgotten(now)
			c.setGauges()
		}
	}
}

// breakPromises drops site s's promises on fids and returns a channel
// closed once OnInvalidate heard of them.
func (c *Client) breakPromises(s *site.Site, pfids []*pb.FID) <-chan struct{} {
	fids := make([]node.FID, len(pfids))
	for i, f := range pfids {
		fids[i] = f.ToFID()
	}
	fids = c.wholeVolumes(fids)
	c.log.Debug("break", "fids", fids)
	c.counters.breaks.Add(int64(len(fids)))
	s.Break(fids...)
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

// resetPromises drops every promise of site s: a new session, whose
// server may have missed telling the old one of changes.
func (c *Client) resetPromises(s *site.Site) {
	c.invalidate(s.Reset())
	// Nodes without a recorded promise may still carry a stale flag from a
	// grant racing this reset; clear all of the site's.
	c.nodesMu.Lock()
	var all []node.FID
	for f, n := range c.nodes {
		if n.at() == s {
			n.valid.Store(false)
			n.dropRights()
			all = append(all, f)
		}
	}
	c.nodesMu.Unlock()
	if c.opts.OnInvalidate != nil {
		// Not waited for: after a restart nobody else changes anything
		// before the grace period ends, and the back channel must run.
		go c.opts.OnInvalidate(all)
	}
}

// forgetRights drops every user's rights learnt on every node: the cell's
// registry changed, and someone may have lost some. Promises and cached
// bytes stay; each user's next use asks the server as that user.
func (c *Client) forgetRights() {
	c.nodesMu.Lock()
	for _, n := range c.nodes {
		n.dropRights()
	}
	c.nodesMu.Unlock()
	if c.opts.OnRightsChanged != nil {
		c.opts.OnRightsChanged()
	}
}

// invalidate clears the valid flag of fids, and the users' rights and
// the extended attributes learnt under their promises. Cached data and
// listings stay: the next use revalidates them by DataVersion and keeps
// them if unchanged.
func (c *Client) invalidate(fids []node.FID) {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	for _, f := range fids {
		if n := c.nodes[f]; n != nil {
			n.valid.Store(false)
			n.dropRights()
		}
	}
}

// Admin is c's view of the cell's administration.
func (c *Client) Admin() admin.Admin { return admin.New(c.sites, c.opts.Token) }
