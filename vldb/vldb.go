// Package vldb is the cell's volume location database: which file servers
// the cell has, whether each is alive, and where each volume lives. It is
// kept in etcd, as OpenAFS keeps it in Ubik: a few hundred bytes per
// volume, changed when a volume is made, moved, released or removed,
// never on the per-file path.
//
// Every server holds a copy of the whole database (DB), loaded at start
// and kept current by an etcd watch, and answers its clients' location
// lookups from it: clients and proxies never talk to etcd. Changes are
// etcd transactions that compare what they read, so two servers placing
// the same name, or moving the same volume, cannot both succeed.
package vldb

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The keys, under one prefix so that a cell may share an etcd cluster
// with other users of it.
const (
	prefix      = "/hoard/"
	serverKeys  = prefix + "server/" // name → Server (JSON)
	aliveKeys   = prefix + "alive/"  // name → "", bound to the server's lease
	volumeKeys  = prefix + "volume/" // id (16 hex digits) → Volume (JSON)
	nameKeys    = prefix + "name/"   // name → id (decimal)
	nextIDKey   = prefix + "next-id" // the lowest id never given (decimal)
	maxEndpoint = 16
)

// Server is one file server of the cell.
type Server struct {
	Name string `json:"name"`
	// Addr is where its gRPC service listens (host:port).
	Addr     string    `json:"addr"`
	Capacity uint64    `json:"capacity"`
	Free     uint64    `json:"free"`
	Started  time.Time `json:"started"`
	// Alive: the server holds its lease now (not stored: the lease's key).
	Alive bool `json:"-"`
}

// Volume is where one volume lives.
type Volume struct {
	ID   uint64 `json:"id"`
	Name string `json:"name"`
	// RW is the server holding the read-write volume.
	RW string `json:"rw"`
	// RO are the servers holding the last release's read-only copy;
	// Pending, those added since, which the next release reaches.
	RO      []string `json:"ro,omitempty"`
	Pending []string `json:"pending,omitempty"`
	// Released counts the releases to the read-only sites.
	Released uint64    `json:"released,omitempty"`
	Created  time.Time `json:"created"`
	// Moving names the server an unfinished move is taking it to.
	Moving string `json:"moving,omitempty"`
	// ROID is the id of the read-only copy the RO sites hold (0: none
	// yet), given when the first site is added; ReleasedAt is when the
	// last release was published.
	ROID       uint64    `json:"roid,omitempty"`
	ReleasedAt time.Time `json:"released_at,omitempty"`
}

// Errors a change may meet.
var (
	ErrExists   = errors.New("already exists")
	ErrNotFound = errors.New("no such volume in the cell")
	// ErrNoLease: this server has lost its lease; it keeps serving what
	// it holds but changes no location until the lease is back.
	ErrNoLease = errors.New("this server has lost its lease in the location database; location changes wait until it is back")
)

// Config says how to reach etcd.
type Config struct {
	Endpoints []string
	// TLS, if set, is how to reach a cell's etcd (the cell's CA and this
	// server's certificate); nil: plain TCP.
	TLS *tls.Config
	// DialTimeout bounds the first contact (default 5 s).
	DialTimeout time.Duration
	Log         *slog.Logger
	// Mirrors keep copies of other parts of the cell's shared state (the
	// principal registry), loaded and watched with the locations.
	Mirrors []Mirror
}

// Mirror keeps a copy of the keys under its prefix, as DB keeps the
// locations'. Its methods are called under DB's lock, in revision order.
type Mirror interface {
	Prefix() string
	Reset()
	Apply(key string, value []byte, deleted bool)
}

// DB is one server's copy of the location database and its way to change
// it. Reads are from memory; changes go to etcd and return once the copy
// has seen them.
type DB struct {
	cli     *clientv3.Client
	log     *slog.Logger
	mirrors []Mirror

	mu      sync.RWMutex
	changed *sync.Cond // rev moved on (under mu)
	rev     int64      // the etcd revision the copy reflects
	servers map[string]Server
	alive   map[string]bool
	vols    map[uint64]Volume
	names   map[string]uint64
	ros     map[uint64]uint64 // read-only copy's id → the volume's
	nextID  uint64

	// holding: the lease of Register is alive (or Register was not
	// called: a DB that registers nothing changes freely).
	holding atomic.Bool
	// lease is the one Register keeps alive (0: none).
	lease atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Open connects to etcd, loads the database and keeps the copy current.
// An etcd that does not answer within the dial timeout is a one-line error
// naming the endpoints.
func Open(cfg Config) (*DB, error) {
	if len(cfg.Endpoints) == 0 || len(cfg.Endpoints) > maxEndpoint {
		return nil, fmt.Errorf("etcd: give between 1 and %d endpoints", maxEndpoint)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		TLS:         cfg.TLS,
		DialTimeout: cfg.DialTimeout,
		Logger:      zap.NewNop(),
		// A dead member is noticed and left for another.
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %v", strings.Join(cfg.Endpoints, ","), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &DB{cli: cli, log: cfg.Log, mirrors: cfg.Mirrors, ctx: ctx, cancel: cancel}
	d.changed = sync.NewCond(&d.mu)
	d.holding.Store(true)
	lctx, lcancel := context.WithTimeout(ctx, cfg.DialTimeout)
	err = d.load(lctx)
	lcancel()
	if err != nil {
		cancel()
		cli.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %v", cfg.DialTimeout)
		}
		return nil, fmt.Errorf("etcd %s does not answer: %v", strings.Join(cfg.Endpoints, ","), unwrap(err))
	}
	d.wg.Add(1)
	go d.watch()
	return d, nil
}

// unwrap drops gRPC's wrapping from an etcd error for a one-line message.
func unwrap(err error) error {
	msg := err.Error()
	if i := strings.LastIndex(msg, "desc = "); i >= 0 {
		msg = msg[i+len("desc = "):]
	}
	return errors.New(msg)
}

// Close stops the watch and gives the lease back, so that the cell sees
// the server stopped at once rather than when the lease would expire.
func (d *DB) Close() error {
	if l := d.lease.Load(); l != 0 {
		ctx, cancel := context.WithTimeout(d.ctx, time.Second)
		d.cli.Revoke(ctx, clientv3.LeaseID(l))
		cancel()
	}
	d.cancel()
	d.wg.Wait()
	return d.cli.Close()
}

// load replaces the copy with the database as it is now.
func (d *DB) load(ctx context.Context) error {
	resp, err := d.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.servers, d.alive = map[string]Server{}, map[string]bool{}
	d.vols, d.names, d.ros, d.nextID = map[uint64]Volume{}, map[string]uint64{}, map[uint64]uint64{}, 0
	for _, m := range d.mirrors {
		m.Reset()
	}
	for _, kv := range resp.Kvs {
		d.apply(string(kv.Key), kv.Value, false)
	}
	d.rev = resp.Header.Revision
	d.changed.Broadcast()
	return nil
}

// apply makes the copy hold key's new value (deleted: its removal);
// under mu.
func (d *DB) apply(key string, value []byte, deleted bool) {
	for _, m := range d.mirrors {
		if strings.HasPrefix(key, m.Prefix()) {
			m.Apply(key, value, deleted)
			return
		}
	}
	switch {
	case strings.HasPrefix(key, serverKeys):
		name := key[len(serverKeys):]
		var s Server
		if deleted || json.Unmarshal(value, &s) != nil {
			delete(d.servers, name)
			return
		}
		d.servers[name] = s
	case strings.HasPrefix(key, aliveKeys):
		name := key[len(aliveKeys):]
		if deleted {
			delete(d.alive, name)
		} else {
			d.alive[name] = true
		}
	case strings.HasPrefix(key, volumeKeys):
		id, err := strconv.ParseUint(key[len(volumeKeys):], 16, 64)
		if err != nil {
			return
		}
		if old, ok := d.vols[id]; ok {
			if d.names[old.Name] == id {
				delete(d.names, old.Name)
			}
			delete(d.ros, old.ROID)
		}
		var v Volume
		if deleted || json.Unmarshal(value, &v) != nil {
			delete(d.vols, id)
			return
		}
		d.vols[id] = v
		d.names[v.Name] = id
		if v.ROID != 0 {
			d.ros[v.ROID] = id
		}
	case key == nextIDKey:
		d.nextID, _ = strconv.ParseUint(string(value), 10, 64)
	}
}

// watch keeps the copy current from the revision it was loaded at; when
// etcd has compacted past it (a long partition), it loads it again.
func (d *DB) watch() {
	defer d.wg.Done()
	for d.ctx.Err() == nil {
		d.mu.RLock()
		from := d.rev + 1
		d.mu.RUnlock()
		wc := d.cli.Watch(clientv3.WithRequireLeader(d.ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
		for resp := range wc {
			if err := resp.Err(); err != nil {
				d.log.Warn("location database watch broken; loading it again", "err", unwrap(err))
				break
			}
			d.mu.Lock()
			for _, ev := range resp.Events {
				d.apply(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
			}
			if resp.Header.Revision > d.rev {
				d.rev = resp.Header.Revision
			}
			d.changed.Broadcast()
			d.mu.Unlock()
		}
		if d.ctx.Err() != nil {
			return
		}
		// Load again: events may have been compacted away meanwhile.
		for d.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
			err := d.load(ctx)
			cancel()
			if err == nil {
				break
			}
			select {
			case <-d.ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// CatchUp waits until the copy reflects every change etcd has committed
// (a linearizable read gives the revision): a name another server just
// made, missing from the copy, is there after it, if it exists.
func (d *DB) CatchUp(ctx context.Context) error {
	resp, err := d.cli.Get(ctx, nextIDKey)
	if err != nil {
		return dbErr(err)
	}
	return d.seen(ctx, resp.Header.Revision)
}

// seen waits until the copy reflects revision rev (a change this DB
// made), so that a lookup after a change finds it.
func (d *DB) seen(ctx context.Context, rev int64) error {
	stop := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		d.changed.Broadcast()
		d.mu.Unlock()
	})
	defer stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for d.rev < rev {
		if err := ctx.Err(); err != nil {
			return err
		}
		d.changed.Wait()
	}
	return nil
}

// Volume is the volume id names, from the copy.
func (d *DB) Volume(id uint64) (Volume, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	v, ok := d.vols[id]
	return v.clone(), ok
}

// ByROID is the volume whose read-only copy has id, from the copy.
func (d *DB) ByROID(id uint64) (Volume, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	rw, ok := d.ros[id]
	if !ok {
		return Volume{}, false
	}
	return d.vols[rw].clone(), true
}

// ByName is the volume named name, from the copy.
func (d *DB) ByName(name string) (Volume, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	id, ok := d.names[name]
	if !ok {
		return Volume{}, false
	}
	return d.vols[id].clone(), true
}

func (v Volume) clone() Volume {
	v.RO, v.Pending = slices.Clone(v.RO), slices.Clone(v.Pending)
	return v
}

// Volumes lists every volume, by id.
func (d *DB) Volumes() []Volume {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]Volume, 0, len(d.vols))
	for _, v := range d.vols {
		out = append(out, v.clone())
	}
	slices.SortFunc(out, func(a, b Volume) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Server is the server named name, from the copy.
func (d *DB) Server(name string) (Server, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	s, ok := d.servers[name]
	s.Alive = d.alive[name]
	return s, ok
}

// Servers lists the cell's servers by name, with their liveness.
func (d *DB) Servers() []Server {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]Server, 0, len(d.servers))
	for name, s := range d.servers {
		s.Alive = d.alive[name]
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Server) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Place picks the server a new volume goes to: the alive one with the
// most free space.
func (d *DB) Place() (Server, bool) {
	var best Server
	found := false
	for _, s := range d.Servers() {
		if s.Alive && (!found || s.Free > best.Free) {
			best, found = s, true
		}
	}
	return best, found
}
