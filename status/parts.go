package status

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/proxystore"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/vldb"
)

// Largest is how many of the files holding the most cache space a mount's
// sample lists.
const Largest = 10

// MountPart is a mount's part: stats is its client's Stats, largest its
// LargestCached, pathOf names a FID where the mount shows it, under a
// path in the cell (one a cache entry keeps, cache.Usage.Path) where the
// mount shows that, breaks records its invalidations (nil: none listed).
// A file the kernel has no inode of keeps the path it was last listed
// under, else is named by the path its entry keeps (a warmup's, an
// earlier mount's).
func MountPart(stats func() client.Stats, largest func(n int) []cache.Usage, pathOf func(node.FID) (string, bool), under func(string) string, breaks *Breaks) Part {
	var mu sync.Mutex
	// named are the paths of the files listed last time.
	named := map[node.FID]string{}
	return func(st *Status) {
		s := stats()
		c := &Client{CacheBytes: s.BytesCached, CacheLimit: s.Limit, CacheFiles: s.Files,
			Hits: s.Hits, Misses: s.Misses, FetchedBytes: s.BytesFetched, Evictions: s.Evictions,
			DirtyBytes: s.DirtyBytes, FlushedBytes: s.Flushed, RPCs: s.RPCs, Promises: s.Promises,
			ReadDelegations: s.ReadDelegations, WriteDelegations: s.WriteDelegations,
			Breaks: s.Breaks, Resets: s.Resets, Recalls: s.Recalls}
		st.Client = c
		if st.Brief {
			return // the largest files visit the whole cache
		}
		c.Largest, c.Broken = []File{}, []Break{}
		mu.Lock()
		defer mu.Unlock()
		now := map[node.FID]string{}
		name := func(f node.FID, known string) string {
			p, ok := pathOf(f)
			switch {
			case ok:
			case known != "":
				p = known
			default:
				p = named[f]
			}
			if p != "" {
				now[f] = p
			}
			return p
		}
		// Breaks first: their paths were taken as they came, and may name
		// a file the kernel has since forgotten.
		broken := breaks.recent()
		for _, b := range broken {
			c.Broken = append(c.Broken, Break{Time: b.at.UnixMilli(), Path: name(b.fid, b.path), FID: b.fid.String()})
		}
		for _, u := range largest(Largest) {
			kept := named[u.FID] // the kernel's last name, newer than the entry's
			if kept == "" && u.Path != "" {
				kept = under(u.Path)
			}
			c.Largest = append(c.Largest, File{Path: name(u.FID, kept), FID: u.FID.String(), Bytes: u.Bytes, Dirty: u.Dirty})
		}
		named = now
	}
}

// serverOf is st's server section, made if it has none: a server's
// parts fill it in any order.
func serverOf(st *Status) *Server {
	if st.Server == nil {
		st.Server = &Server{}
	}
	return st.Server
}

// ServerPart is a server's or a proxy's part: load is its Load, handled
// gathers the requests it handled (HandledRPCs).
func ServerPart(load func() server.Load, handled func() int64) Part {
	return func(st *Status) {
		l := load()
		s := serverOf(st)
		s.Sessions, s.Promises, s.Delegations = l.Sessions, l.Promises, l.Delegations
		s.Breaks, s.Recalls, s.Revokes, s.Resets = l.Broken, l.Recalled, l.Revoked, l.Resets
		if handled != nil {
			s.RPCs = handled()
		}
	}
}

// CellPart is a server's standing in its cell: its name, holding its
// lease (Holding), and disk its data directory's size and free space.
func CellPart(name string, holding func() bool, disk func() (size, free uint64)) Part {
	return func(st *Status) {
		if st.Brief {
			return
		}
		size, free := disk()
		serverOf(st).Cell = &Cell{Name: name, Lease: holding(), DiskSize: size, DiskFree: free}
	}
}

// Locations is a cell's location database (a vldb.DB).
type Locations interface {
	Volume(id uint64) (vldb.Volume, bool)
	ByROID(id uint64) (vldb.Volume, bool)
}

// VolumesPart is a server's volumes: list is its store's Volumes; db
// (nil outside a cell) says where each is read-write and read-only, as
// the server self.
func VolumesPart(list func() ([]node.Volume, error), db Locations, self string) Part {
	return func(st *Status) {
		if st.Brief {
			return
		}
		vs, err := list()
		if err != nil {
			return
		}
		out := make([]Volume, len(vs))
		for i, v := range vs {
			out[i] = Volume{ID: v.ID, Name: v.Name, Used: v.Used, Quota: v.Quota, Files: v.Files}
			if db == nil {
				continue
			}
			loc, ok := db.Volume(v.ID)
			if rw, isCopy := db.ByROID(v.ID); isCopy {
				loc, ok = rw, true
				out[i].ReadOnly = true
				// A site holds the release the database records, a
				// pending one none yet (until the release's commit,
				// just after its last pass).
				if slices.Contains(rw.RO, self) {
					out[i].Release = rw.Released
				}
			}
			if ok {
				out[i].RW, out[i].Sites, out[i].Pending, out[i].Released = loc.RW, loc.RO, loc.Pending, loc.Released
			}
		}
		serverOf(st).Volumes = out
	}
}

// MovesPart is a server's moves and releases under way: underway is its
// Underway.
func MovesPart(underway func() []server.Underway) Part {
	return func(st *Status) {
		if st.Brief {
			return
		}
		out := []Move{}
		for _, u := range underway() {
			m := Move{Volume: u.Name, ID: u.Volume, Kind: u.Kind, Phase: u.Phase, Peers: u.Peers}
			if !u.Since.IsZero() {
				m.Since = u.Since.UnixMilli()
			}
			out = append(out, m)
		}
		serverOf(st).Moves = out
	}
}

// ProxyPart is a proxy's part: store is its store's Stats, origin its
// client's of the origin.
func ProxyPart(originAddr string, store func() proxystore.Stats, origin func() client.Stats) Part {
	return func(st *Status) {
		s, o := store(), origin()
		st.Proxy = &Proxy{Origin: originAddr, Hits: s.Hits, Misses: s.Misses, ServedBytes: s.BytesServed,
			FetchedBytes: s.BytesFetched, StoreBytes: s.BytesUsed, StoreLimit: s.Limit, StoreFiles: s.Files,
			Evictions: s.Evictions, OriginRPCs: o.RPCs,
			OriginReadDelegations: o.ReadDelegations, OriginWriteDelegations: o.WriteDelegations}
	}
}

// HandledRPCs counts the requests a server handled, by the standard
// grpc_server_handled_total metric in g (package metrics' GRPC). It
// gathers all of g: for a page's poll and the history's sample every two
// seconds, not a hot path.
func HandledRPCs(g prometheus.Gatherer) func() int64 {
	return func() int64 {
		mfs, _ := g.Gather()
		var n float64
		for _, mf := range mfs {
			if mf.GetName() != "grpc_server_handled_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
		return int64(n)
	}
}

// keptBreaks is how many invalidated files Breaks keeps.
const keptBreaks = 10

// Breaks records the files a client's promises were last broken on, for
// the page. Its zero value is ready; a nil Breaks records nothing.
type Breaks struct {
	mu   sync.Mutex
	ring [keptBreaks]broken
	next int // ring[next-1] is the latest
	n    int
}

type broken struct {
	at   time.Time
	fid  node.FID
	path string
}

// Wrap returns on (a client's Options.OnInvalidate) recording, first,
// the files it hears of, by their paths now (pathOf; on may make the
// kernel forget them). A reset's (all files) costs no more than a
// break's: only the last few are kept.
func (b *Breaks) Wrap(on func([]node.FID), pathOf func(node.FID) (string, bool)) func([]node.FID) {
	if b == nil {
		return on
	}
	return func(fids []node.FID) {
		now := time.Now()
		last := fids[max(0, len(fids)-keptBreaks):]
		paths := make([]string, len(last))
		for i, f := range last {
			if p, ok := pathOf(f); ok {
				paths[i] = p
			}
		}
		b.mu.Lock()
		for i, f := range last {
			b.ring[b.next] = broken{now, f, paths[i]}
			b.next = (b.next + 1) % keptBreaks
			b.n = min(b.n+1, keptBreaks)
		}
		b.mu.Unlock()
		if on != nil {
			on(fids)
		}
	}
}

// recent is what was recorded, latest first.
func (b *Breaks) recent() []broken {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]broken, 0, b.n)
	for i := 1; i <= b.n; i++ {
		out = append(out, b.ring[(b.next-i+keptBreaks)%keptBreaks])
	}
	return out
}
