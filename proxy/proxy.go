// Package proxy is hoard's caching proxy (after the Hades thesis): it sits near
// many clients and far from a file server, the origin, and speaks hoard's
// protocol both ways. Towards its clients it is a server.Backend, served by
// the ordinary server code (sessions, promises, the wire); towards the
// origin it is one client, whose cache holds the origin's files for all of
// them. File bytes are kept apart, in the proxy's disk store (proxystore),
// fetched one chunk at a time and once however many clients ask at once.
//
// Coherence is chained. A promise is granted to a proxy client only while
// the proxy holds the origin's promise on the same file, and for no longer;
// a break from the origin is passed on to the proxy's clients, and
// acknowledged to the origin only when they acknowledged it (or were given
// up on). A change is made at the origin first and acknowledged to the
// proxy client only after the origin acknowledged it; then the proxy
// breaks its other clients' promises, as a server would.
//
// Unless Options.NoDelegations is set (hoard proxy --no-delegations),
// delegations chain the same way
// (Nache, FAST'07): the proxy delegates to
// its clients only what it holds from the origin, asking for it when a
// client's open would be given one, and keeps it for all of them, so
// clients that conflict only with each other are sorted out here, without
// a round trip to the origin. When the origin recalls the proxy's
// delegation, the proxy recalls its clients' first; their dirty data is
// stored through to the origin under the proxy's delegation, which the
// origin still honours, and only then does the proxy give it back.
package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/client/admin"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/proxystore"
	"github.com/hoardfs/hoard/server"
	"golang.org/x/sync/singleflight"
)

// Options configure a proxy.
type Options struct {
	// Origin is the file server's address, host:port.
	Origin string
	// Dir holds the proxy's cache of the origin's files and its own state.
	Dir string
	// CacheSize bounds the disk store of file bytes.
	CacheSize int64
	// Layout is the disk store's layout: proxystore.Pooled (default) or
	// proxystore.PerChunk.
	Layout string
	// FastFetch: runs fetched quicker than this are evicted first.
	FastFetch time.Duration
	// Timeout bounds each request to the origin: with the origin away,
	// what the proxy has no promise for fails after it.
	Timeout time.Duration
	// NoDelegations: the proxy takes none from the origin, so it gives
	// its clients none either (hoard proxy --no-delegations).
	NoDelegations bool
	// TLS secures the connection to the origin, with the proxy's cell
	// certificate (cell.Identity.ClientTLS); nil: plain TCP, to an
	// insecure origin.
	TLS    *tls.Config
	Logger *slog.Logger
}

// Proxy is the server.Backend of a caching proxy.
type Proxy struct {
	// c is the proxy's client of the origin; fids is its FID-level API,
	// through which the proxy serves its own clients.
	c      *client.Client
	fids   *client.FIDs
	log    *slog.Logger
	store  *proxystore.Store
	origin string
	epoch  uint64
	// noDeleg: the proxy takes no delegations, and gives none.
	noDeleg bool
	dir     string
	srv     atomic.Pointer[server.Server]

	// fetches shares one origin fetch of a chunk among the reads that
	// want it.
	fetches singleflight.Group

	mu sync.Mutex
	// upstream is the origin's write delegation on each file the proxy
	// delegated to a client of its own: that client's stores go to the
	// origin under it.
	upstream map[node.FID]uint64
	// asking: files the proxy is asking the origin for a read
	// delegation on, off the path of the open that wanted one.
	asking map[node.FID]bool
	// recalls counts the origin's recalls. A delegation got from the
	// origin is passed on only if none came since it was asked for
	// (Delegation's still, checked where the server grants): a recall
	// handled before the grant would not find the grant to recall.
	recalls uint64
	askers  sync.WaitGroup
	// acls are the origin's ACLs governing files, kept under promises
	// (acl.go); aclGen counts the breaks that dropped some.
	acls   map[node.FID]aclCopy
	aclGen uint64
}

// metaCacheSize bounds the client cache the proxy keeps the origin's
// statuses in; file bytes are in the store.
const metaCacheSize = 64 << 20

// metaCacheFor is metaCacheSize, or a quarter of the free space under dir
// on a disk too small for it (at least 1 MiB): the store is the proxy's
// cache, and the disk is its to fill.
func metaCacheFor(dir string) int64 {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return metaCacheSize
	}
	return max(1<<20, min(metaCacheSize, int64(st.Bavail)*st.Bsize/4))
}

// OriginStreams is how many bulk-data connections the proxy uses to the
// origin, each carrying one chunk fetch at a time: a proxy fetches for
// many clients at once. Its clients are asked to use as many to it, as
// each of their requests on a cold chunk waits for one such fetch.
const OriginStreams = 16

// Open starts a proxy: a new epoch in o.Dir, and a session with the origin.
// A directory it made is removed again if that fails.
func Open(o Options) (p *Proxy, err error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if _, serr := os.Stat(o.Dir); errors.Is(serr, os.ErrNotExist) {
		defer func() {
			if err != nil {
				os.RemoveAll(o.Dir)
			}
		}()
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, "staging"), 0o700); err != nil {
		return nil, err
	}
	epoch, err := nextEpoch(filepath.Join(o.Dir, "epoch"))
	if err != nil {
		return nil, err
	}
	p = &Proxy{epoch: epoch, dir: o.Dir, origin: o.Origin, log: o.Logger, upstream: map[node.FID]uint64{}, asking: map[node.FID]bool{}, noDeleg: o.NoDelegations, acls: map[node.FID]aclCopy{}}
	host, _ := os.Hostname()
	p.c, err = client.Dial(client.Options{
		Server: o.Origin, CacheDir: filepath.Join(o.Dir, "cache"), CacheSize: metaCacheFor(o.Dir),
		RPCTimeout: o.Timeout, DialTimeout: o.Timeout, TLS: o.TLS,
		DataStreams:   OriginStreams,
		NoDelegations: o.NoDelegations,
		// Its clients' creates go to the origin as they come.
		NoDirDelegations: true,
		// Restarted, it continues its session at the origin, which then
		// hands it what its clients' reclaims ask for.
		KeepSession:     true,
		Name:            fmt.Sprintf("proxy %s pid %d", host, os.Getpid()),
		Logger:          o.Logger,
		OnInvalidate:    p.invalidate,
		OnRecall:        p.recall,
		OnRightsChanged: p.rightsChanged,
	})
	if err != nil {
		return nil, err
	}
	p.fids = p.c.FIDs()
	p.store, err = proxystore.Open(proxystore.Options{Dir: filepath.Join(o.Dir, "store"), Size: o.CacheSize,
		ChunkSize: p.fids.ChunkSize(), Layout: o.Layout, FastFetch: o.FastFetch})
	if err != nil {
		p.c.Close()
		return nil, err
	}
	return p, nil
}

// Serve ties the proxy to the server that serves it, which must hear of
// every break from the origin; call it before the server takes requests.
func (p *Proxy) Serve(s *server.Server) { p.srv.Store(s) }

// Close ends the session with the origin and closes the caches. The
// server must be shut down first: its clients hear nothing more.
func (p *Proxy) Close() error {
	p.srv.Store(nil)
	err := p.c.Close()
	p.askers.Wait()
	if serr := p.store.Close(); err == nil {
		err = serr
	}
	return err
}

// Origin is the origin's address.
func (p *Proxy) Origin() string { return p.origin }

// Stats are the disk store's counters.
func (p *Proxy) Stats() proxystore.Stats { return p.store.Stats() }

// OriginStats are the counters of the proxy's session with the origin.
func (p *Proxy) OriginStats() client.Stats { return p.c.Stats() }

// invalidate passes a break from the origin on to the proxy's clients; the
// origin hears the acknowledgement once this returns.
func (p *Proxy) invalidate(fids []node.FID) {
	p.forgetACLs(fids)
	if s := p.srv.Load(); s != nil {
		s.Invalidate(fids)
	}
}

// recall passes a recall from the origin on to the proxy's clients (or the
// end of a delegation the proxy lost): the origin hears the return once
// they returned theirs, their dirty data stored through.
func (p *Proxy) recall(f node.FID) {
	p.mu.Lock()
	p.recalls++
	old, had := p.upstream[f]
	p.mu.Unlock()
	if s := p.srv.Load(); s != nil {
		s.RecallAll([]node.FID{f})
	}
	p.mu.Lock()
	if had && p.upstream[f] == old {
		delete(p.upstream, f) // unless a new one was got meanwhile
	}
	p.mu.Unlock()
}

// Lease is the delegation lease the proxy gives its clients: half the
// origin's, so that a recall of the proxy's clients ends (returned or
// revoked) well before the origin would revoke the proxy's own. Zero when
// the origin grants none, or the proxy takes none.
func (p *Proxy) Lease() time.Duration {
	if p.noDeleg {
		return 0
	}
	return p.fids.Lease() / 2
}

// Delegation gets the origin's delegation on f, for the proxy's clients.
// Directories are not delegated through a proxy: it would have to hold
// the origin's and pass its clients' files on (CreateReserved).
//
// A read open does not wait for the origin: it gets what the proxy holds,
// and the proxy asks for a read delegation meanwhile, for the opens that
// follow. On a cold proxy a round trip to the origin per file opened
// costs more than the local opens it could save. A write open waits: its
// delegation spares its close the write through to the origin.
func (p *Proxy) Delegation(f node.FID, write bool) (callback.DelegKind, func() bool) {
	n := p.fids.Node(f)
	if n.Status().Type == node.TypeDir {
		return callback.DelegNone, nil
	}
	p.mu.Lock()
	gen := p.recalls
	p.mu.Unlock()
	still := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.recalls == gen
	}
	if !write {
		if h, ok := p.fids.Held(n); ok {
			return h.Kind, still
		}
		p.askLater(n)
		return callback.DelegNone, nil
	}
	h, ok := p.fids.Delegate(n, write)
	if !ok {
		return callback.DelegNone, nil
	}
	if h.Kind == callback.DelegWrite {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.recalls != gen {
			return callback.DelegNone, nil // recalled already, maybe this one
		}
		p.upstream[f] = h.State
	}
	return h.Kind, still
}

// askLater asks the origin for a read delegation on n in the background,
// once at a time per file.
func (p *Proxy) askLater(n *client.Node) {
	f := n.FID()
	p.mu.Lock()
	if p.asking[f] {
		p.mu.Unlock()
		return
	}
	p.asking[f] = true
	p.askers.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.askers.Done()
		p.fids.Delegate(n, false)
		p.mu.Lock()
		delete(p.asking, f)
		p.mu.Unlock()
	}()
}

// nextEpoch counts the proxy's starts in the file at path, durably, so a
// restarted proxy's clients see a new epoch and revalidate.
func nextEpoch(path string) (uint64, error) {
	var e uint64
	switch b, err := os.ReadFile(path); {
	case err == nil:
		if e, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return 0, fmt.Errorf("%s: not an epoch: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return 0, err
	}
	e++
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return 0, err
	}
	_, err = fmt.Fprintf(f, "%d\n", e)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return 0, err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return 0, err
	}
	defer d.Close()
	return e, d.Sync()
}

func (p *Proxy) Epoch() uint64 { return p.epoch }

// MaxFileSize is the origin's.
func (p *Proxy) MaxFileSize() uint64 { return p.fids.MaxFileSize() }

func fromVolume(v admin.Volume) node.Volume {
	return node.Volume{ID: v.ID, Name: v.Name, Root: v.Root, Created: v.Created, Quota: v.Quota, Used: v.Used, Files: v.Files}
}

func (p *Proxy) CreateVolume(name string) (node.Volume, error) {
	v, err := p.c.Admin().CreateVolume(name)
	return fromVolume(v), unwrap(err)
}

// SetQuota sets the quota at the origin, which enforces it.
func (p *Proxy) SetQuota(name string, quota uint64) (node.Volume, error) {
	v, err := p.c.Admin().SetQuota(name, quota)
	return fromVolume(v), unwrap(err)
}

func (p *Proxy) VolumeByName(name string) (node.Volume, error) {
	v, err := p.fids.Volume(name, 0)
	return fromVolume(v), err
}

func (p *Proxy) VolumeByID(id uint64) (node.Volume, error) {
	v, err := p.fids.Volume("", id)
	return fromVolume(v), err
}

func (p *Proxy) Volumes() ([]node.Volume, error) {
	vs, err := p.c.Admin().Volumes()
	if err != nil {
		return nil, unwrap(err)
	}
	out := make([]node.Volume, len(vs))
	for i, v := range vs {
		out[i] = fromVolume(v)
	}
	return out, nil
}

// unwrap drops the path the client's path-level calls add to an error: the
// proxy's clients add their own.
func unwrap(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func (p *Proxy) GetStatus(f node.FID) (node.Status, error) { return p.status(p.fids.Node(f)) }

// status is n's status; the chunks of a file gone at the origin are
// dropped from the store.
func (p *Proxy) status(n *client.Node) (node.Status, error) {
	st, err := p.fids.Status(n)
	if e := pb.Errno(err); err != nil && (e == syscall.ESTALE || e == syscall.ENOENT) {
		p.store.Drop(n.FID())
	}
	return st, err
}

// Lookup answers with the directory's status at the version the answer
// belongs to: a client caches the name under that version. A name the
// origin does not have makes the proxy list the directory, so that the
// next missing names (a compiler's search path) are answered here, under
// the proxy's promise, rather than a round trip away.
func (p *Proxy) Lookup(dir node.FID, name string) (child, d node.Status, err error) {
	dn := p.fids.Node(dir)
	n, d, err := p.fids.Lookup(dn, name)
	if pb.Errno(err) == syscall.ENOENT {
		p.fids.List(dn)
	}
	if err != nil {
		return child, d, err
	}
	child, err = p.fids.Status(n)
	return child, d, err
}

// ReadDir serves pages of the cached listing; a cookie is a position in
// it. A client that pages through a directory which changes meanwhile
// sees the new version in the next page's status and starts over.
func (p *Proxy) ReadDir(dir node.FID, cookie uint64, limit int) ([]node.DirEntry, bool, node.Status, error) {
	ents, d, err := p.fids.List(p.fids.Node(dir))
	if err != nil {
		return nil, false, d, err
	}
	if limit <= 0 {
		limit = 4096
	}
	start := min(cookie, uint64(len(ents)))
	end := min(start+uint64(limit), uint64(len(ents)))
	out := make([]node.DirEntry, 0, end-start)
	for i := start; i < end; i++ {
		e := ents[i]
		out = append(out, node.DirEntry{Name: e.Name, FID: e.FID, Type: e.Type, Cookie: i + 1})
	}
	return out, end == uint64(len(ents)), d, nil
}

func (p *Proxy) Create(dir node.FID, name string, t node.Type, a node.Attr, target string, excl bool, op node.Op) (st, d node.Status, created bool, err error) {
	return p.fids.Create(client.Make{Dir: p.fids.Node(dir), Name: name, Type: t, Mode: a.Mode, Who: client.Creator{UID: a.UID, GID: a.GID},
		Target: target, Rdev: a.Rdev, Excl: excl, Op: string(op)})
}

// Reserve is refused: the proxy delegates no directories (Delegation).
func (p *Proxy) Reserve(uint64, int) ([]node.FID, error) {
	return nil, fmt.Errorf("reserve: not through a proxy: %w", syscall.EOPNOTSUPP)
}

// CreateReserved is refused, as Reserve is.
func (p *Proxy) CreateReserved(node.FID, []node.Reserved, []node.Removed, node.Op) (made, removed []node.Status, d node.Status, err error) {
	return nil, nil, d, fmt.Errorf("create reserved: not through a proxy: %w", syscall.EOPNOTSUPP)
}

func (p *Proxy) Link(dir node.FID, name string, target node.FID, op node.Op) (st, d node.Status, err error) {
	return p.fids.Link(p.fids.Node(dir), name, p.fids.Node(target), string(op))
}

func (p *Proxy) Remove(dir node.FID, name string, dirOnly bool, op node.Op) (d, st node.Status, err error) {
	return p.fids.Remove(p.fids.Node(dir), name, dirOnly, string(op))
}

func (p *Proxy) Rename(src node.FID, sname string, dst node.FID, dname, keep string, op node.Op) (node.RenameResult, error) {
	s, d, moved, replaced, err := p.fids.Rename(p.fids.Node(src), sname, p.fids.Node(dst), dname, keep, string(op))
	return node.RenameResult{SrcDir: s, DstDir: d, Moved: moved, Replaced: replaced}, err
}

func (p *Proxy) SetAttr(f node.FID, c node.Change) (node.Status, error) {
	return p.fids.SetAttr(p.fids.Node(f), c)
}

func (p *Proxy) StatFS(volume uint64) (node.FSStat, error) { return p.fids.StatFS(volume) }

// GetXattr, ListXattr, SetXattr and RemoveXattr ask the origin: the
// proxy keeps no extended attributes.
func (p *Proxy) GetXattr(f node.FID, name string) ([]byte, error) {
	return p.fids.GetXattr(p.fids.Node(f), name)
}
func (p *Proxy) ListXattr(f node.FID) ([]string, error) { return p.fids.ListXattr(p.fids.Node(f)) }
func (p *Proxy) SetXattr(f node.FID, name string, val []byte, flags uint32) (node.Status, error) {
	return p.fids.SetXattr(p.fids.Node(f), name, val, flags)
}
func (p *Proxy) RemoveXattr(f node.FID, name string) (node.Status, error) {
	return p.fids.RemoveXattr(p.fids.Node(f), name)
}

// ReadAt serves f's bytes at off from the store, fetching the chunks it
// lacks from the origin, and returns the status of the version they are
// of (as a vnode store answers: io.EOF only with nothing read).
func (p *Proxy) ReadAt(f node.FID, b []byte, off int64, user string) (int, node.Status, error) {
	began := time.Now()
	n := p.fids.Node(f)
	cs := p.store.ChunkSize()
	for attempt := 0; ; attempt++ {
		st, err := p.status(n)
		if err != nil {
			return 0, st, err
		}
		size := int64(st.Size)
		if off >= size {
			return 0, st, io.EOF
		}
		want := min(int64(len(b)), size-off)
		var done int64
		for done < want {
			at := off + done
			idx, in := at/cs, at%cs
			span := min(want-done, cs-in)
			k, ok := p.store.ReadAt(proxystore.Key{FID: f, Idx: idx}, st.DataVersion, b[done:done+span], in)
			if !ok {
				var data []byte
				if data, err = p.fetch(n, idx, st, user); err != nil {
					break
				}
				k = copy(b[done:done+span], data[min(in, int64(len(data))):])
			}
			if k == 0 {
				err = errStale // shorter than its status says
				break
			}
			done += int64(k)
		}
		if err == errStale && attempt < 3 {
			continue // the file changed under the read: revalidate
		}
		p.store.CountServed(done, time.Since(began))
		if err == errStale {
			err = fmt.Errorf("read %v: the file kept changing: %w", f, syscall.EAGAIN)
		}
		return int(done), st, err
	}
}

var errStale = errors.New("proxy: data version changed")

// fetch brings chunk idx of n, of the version of st, from the origin into
// the store and returns it. Only the first of concurrent callers fetches;
// the others wait for its answer.
func (p *Proxy) fetch(n *client.Node, idx int64, st node.Status, user string) ([]byte, error) {
	key := fmt.Sprintf("%v/%d/%d", st.FID, idx, st.DataVersion)
	data, err, _ := p.fetches.Do(key, func() (any, error) { return p.fetchOne(n, idx, st, user) })
	b, _ := data.([]byte)
	return b, err
}

// fetchOne is one fetch of a chunk from the origin.
func (p *Proxy) fetchOne(n *client.Node, idx int64, st node.Status, user string) ([]byte, error) {
	k := proxystore.Key{FID: st.FID, Idx: idx}
	// A fetch of the same chunk may have ended between the caller's miss
	// and this one's start: its chunk is in the store now.
	buf := make([]byte, p.store.ChunkSize())
	if n, ok := p.store.Cached(k, st.DataVersion, buf, 0); ok && n > 0 {
		return buf[:n], nil
	}
	start := time.Now()
	data, dv, err := p.fids.FetchChunk(n, idx)
	took := time.Since(start)
	switch {
	case err != nil:
		return nil, err
	case dv != st.DataVersion || len(data) == 0:
		return nil, errStale
	}
	p.store.CountFetched(int64(len(data)))
	if err := p.store.Put(k, dv, int64(st.Size), data, user, took); err != nil {
		// Served all the same, from memory.
		p.log.Debug("chunk not stored", "fid", st.FID, "chunk", idx, "err", err)
	}
	return data, nil
}

// PromiseLimit is what is left of the origin's promise on f: a proxy
// client's promise must end before the proxy could miss a change.
func (p *Proxy) PromiseLimit(f node.FID) time.Duration {
	return p.fids.PromiseLeft(p.fids.Node(f))
}

// BeginUpdate stages a proxy client's store in a file of the proxy's own;
// Commit sends it to the origin. A store made under the proxy's
// delegation goes under the origin's delegation the proxy holds, so the
// origin refuses it if it revoked that one meanwhile (the proxy was away
// for longer than a lease), as it would refuse a client of its own.
func (p *Proxy) BeginUpdate(f node.FID, base uint64, delegated bool) (server.Update, error) {
	args := datapath.StoreArgs{FID: f, BaseVersion: base}
	if delegated {
		p.mu.Lock()
		args.DelegState = p.upstream[f]
		p.mu.Unlock()
	}
	tmp, err := os.CreateTemp(filepath.Join(p.dir, "staging"), "s-*")
	if err != nil {
		return nil, err
	}
	return &update{p: p, args: args, staging: tmp}, nil
}

type update struct {
	p       *Proxy
	args    datapath.StoreArgs
	staging *os.File
	done    bool
}

func (u *update) WriteAt(b []byte, off int64) error {
	if len(b) == 0 {
		return nil
	}
	if _, err := u.staging.WriteAt(b, off); err != nil {
		return err
	}
	u.args.Ranges = append(u.args.Ranges, datapath.Range{Off: off, Len: int64(len(b))})
	return nil
}

func (u *update) Truncate(n uint64) {
	if !u.args.HasTruncate || n < u.args.Truncate {
		u.args.HasTruncate, u.args.Truncate = true, n
	}
}

func (u *update) SetSize(n uint64) { u.args.HasSize, u.args.Size = true, n }

// Commit stores the change at the origin; it is acknowledged to the proxy
// client only once the origin acknowledged it.
func (u *update) Commit(sync bool, mtime time.Time, op node.Op) (node.Status, error) {
	if u.done {
		return node.Status{}, errors.New("update already finished")
	}
	defer u.Abort()
	u.args.Sync, u.args.Mtime, u.args.Op = sync, mtime, string(op)
	u.args.Read = func(b []byte, off int64) error {
		_, err := u.staging.ReadAt(b, off)
		if err == io.EOF {
			err = nil
		}
		return err
	}
	return u.p.fids.StoreThrough(u.args)
}

func (u *update) Abort() {
	if u.done {
		return
	}
	u.done = true
	u.staging.Close()
	os.Remove(u.staging.Name())
}
