// Package proxystore is the caching proxy's disk store of the origin's file
// data (the Hades thesis, chapter 5): chunks of remote files, each of one
// data version, kept in a fixed amount of local disk.
//
// Two layouts share the index and the replacement policy:
//
//   - pooled (the default): a few large cache files, preallocated at
//     start, in 4 KiB blocks tracked by a bitmap. The chunks of one remote
//     file are placed next to each other (a file's first chunk reserves
//     room for the rest), and the files one user reads are placed one after
//     the other, so a later read of the same set is a sequential read of
//     the disk.
//   - per-chunk: one cache file per chunk, as OpenAFS's cache manager does;
//     kept to measure the pooled layout against.
//
// The index maps a file to its runs: consecutive chunks stored
// contiguously. Finding a chunk is one map lookup and a binary search, and
// a chunk that continues a run extends it in place, so the cold path does
// not pay a hash insertion per chunk or block. Replacement is by run:
// among the least recently used runs, one that was quick to fetch is
// evicted first, since fetching it again is cheap; otherwise the least
// recently used run goes.
//
// The index is persisted (chunkindex) in the background and at Close, so
// a restart does not read the data. Every chunk carries a CRC32C; after an
// unclean stop each chunk is checked against it the first time it is
// read, so a chunk torn by a crash, or one whose blocks were reused before
// the index caught up, is never served.
package proxystore

import (
	"container/list"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/chunkindex"
	"github.com/hoardfs/hoard/node"
)

// Layout names.
const (
	Pooled   = "pooled"
	PerChunk = "per-chunk"
)

// ErrNoSpace: no room can be made for a chunk (the store is too small for
// it, or every run is being written).
var ErrNoSpace = errors.New("proxystore: no space for the chunk")

const blockSize = 4096

// Options configure Open.
type Options struct {
	// Dir holds the store; it is created if missing.
	Dir string
	// Size bounds the bytes stored (rounded down to 4 KiB blocks). The
	// pooled layout preallocates all of it at creation.
	Size int64
	// ChunkSize is the unit of fetching: a power of two from 4 KiB up.
	ChunkSize int64
	// Layout is Pooled (default) or PerChunk. A store made with another
	// layout, size, chunk size or number of pools is emptied and made
	// anew: it is a cache.
	Layout string
	// Pools is how many cache files the pooled layout uses (default 4).
	Pools int
	// FastFetch: a run whose chunks were fetched quicker than this is
	// cheap to fetch again, and is evicted before older, slower ones
	// (default 10 ms).
	FastFetch time.Duration
}

// Key names a chunk: a file and the chunk's index in it.
type Key struct {
	FID node.FID
	Idx int64
}

// Store is an open proxy store. Its methods are safe for concurrent use.
type Store struct {
	dir    string
	cs     int64
	cb     int64 // blocks per chunk
	limit  int64 // blocks
	layout layout
	name   string
	fast   time.Duration
	idx    *chunkindex.Index

	mu      sync.Mutex
	files   map[node.FID]*file
	lru     *list.List // of *run, most recent at the front
	used    int64      // blocks
	nruns   int64
	nchunks int64
	pending map[node.FID]bool // records to write

	hits, misses, served, fetched, evictions, torn atomic.Int64
	// Time spent, summed over concurrent callers: finding and placing
	// chunks (map), reading them from the store's files (read), and
	// serving client reads in all (serve; what neither of the others
	// took is the fetch from the origin and the rest). The Hades thesis's
	// figure 6.2 breaks a block's read down the same way.
	mapNanos, readNanos, serveNanos atomic.Int64
}

// file is what the store holds of one remote file: one data version.
type file struct {
	fid  node.FID
	dv   uint64
	size int64
	runs []*run // sorted by first, not overlapping
	// zones are the room reserved for the file's next chunks (pooled).
	zones []zone
}

// run is consecutive chunks of one file stored contiguously.
type run struct {
	f     *file
	first int64
	at    loc
	crcs  []uint32 // one per chunk
	last  int64    // bytes in the last chunk
	took  time.Duration
	// unverified has a bit set per chunk not yet checked against its CRC
	// (after an unclean stop); nil when all are.
	unverified []uint64
	elem       *list.Element
	dead       bool
}

func (r *run) n() int64 { return int64(len(r.crcs)) }

// chunkLen is chunk i's length (i counted from r.first).
func (r *run) chunkLen(i, cs int64) int64 {
	if i == r.n()-1 {
		return r.last
	}
	return cs
}

func blocks(n int64) int64 { return (n + blockSize - 1) / blockSize }

// Open opens the store in o.Dir, making it if needed.
func Open(o Options) (*Store, error) {
	if o.Layout == "" {
		o.Layout = Pooled
	}
	if o.Layout != Pooled && o.Layout != PerChunk {
		return nil, fmt.Errorf("layout %q: want %s or %s", o.Layout, Pooled, PerChunk)
	}
	if o.ChunkSize < blockSize || o.ChunkSize&(o.ChunkSize-1) != 0 {
		return nil, fmt.Errorf("chunk size %d: want a power of two of at least 4 KiB", o.ChunkSize)
	}
	if o.Pools <= 0 {
		o.Pools = 4
	}
	if o.FastFetch <= 0 {
		o.FastFetch = 10 * time.Millisecond
	}
	limit := o.Size / blockSize
	if limit < o.ChunkSize/blockSize*int64(o.Pools) {
		return nil, fmt.Errorf("store size %d: too small for %d pools of one %d-byte chunk", o.Size, o.Pools, o.ChunkSize)
	}
	s := &Store{dir: o.Dir, cs: o.ChunkSize, cb: o.ChunkSize / blockSize, limit: limit, name: o.Layout, fast: o.FastFetch,
		files: map[node.FID]*file{}, lru: list.New(), pending: map[node.FID]bool{}}
	if err := s.open(o); err != nil {
		if s.idx != nil {
			s.idx.Abandon()
		}
		if s.layout != nil {
			s.layout.close()
		}
		return nil, err
	}
	return s, nil
}

func (s *Store) open(o Options) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	var err error
	if s.idx, err = chunkindex.Open(s.dir); err != nil {
		return fmt.Errorf("proxy store: %w", err)
	}
	format := formatOf(o.Layout, s.limit, s.cs, o.Pools)
	err = s.openIndex(format)
	if errors.Is(err, errFormat) {
		slog.Warn("proxy store made differently; emptying it", "dir", s.dir, "err", err, "now", format)
		if err := s.idx.Reset(); err != nil {
			return err
		}
		for _, p := range []string{"chunks", "pool-"} {
			paths, _ := filepath.Glob(filepath.Join(s.dir, p+"*"))
			for _, p := range paths {
				if err := os.RemoveAll(p); err != nil {
					return err
				}
			}
		}
		err = s.openIndex(format)
	}
	if err != nil {
		return err
	}
	// Assigned only when opened: a typed nil would not be a nil layout.
	if o.Layout == Pooled {
		ps, err := openPools(s.dir, o.Pools, s.limit/int64(o.Pools), s.cb)
		if err != nil {
			return err
		}
		s.layout = ps
	} else {
		cf, err := openChunkFiles(s.dir)
		if err != nil {
			return err
		}
		s.layout = cf
	}
	clean := s.idx.Clean()
	if err := s.load(clean); err != nil {
		return fmt.Errorf("index %s: %w", filepath.Join(s.dir, "index.db"), err)
	}
	if !clean {
		held := map[loc]bool{}
		for _, f := range s.files {
			for _, r := range f.runs {
				held[r.at] = true
			}
		}
		if err := s.layout.forget(held); err != nil {
			return err
		}
	}
	return s.idx.Start(chunkindex.Source{Changes: s.changes, Stats: func() any { return s.Stats() }}, commitInterval)
}

var errFormat = errors.New("store made with other parameters")

// openIndex checks that the index was made for format and reads its
// counters.
func (s *Store) openIndex(format string) error {
	have, err := s.idx.Setting("format", []byte(format))
	if err != nil {
		return fmt.Errorf("index %s: %w", filepath.Join(s.dir, "index.db"), err)
	}
	if string(have) != format {
		return fmt.Errorf("%w: %s", errFormat, have)
	}
	var st Stats
	if s.idx.LoadStats(&st) {
		s.hits.Store(st.Hits)
		s.misses.Store(st.Misses)
		s.served.Store(st.BytesServed)
		s.fetched.Store(st.BytesFetched)
		s.evictions.Store(st.Evictions)
		s.torn.Store(st.Torn)
		s.mapNanos.Store(st.MapNanos)
		s.readNanos.Store(st.ReadNanos)
		s.serveNanos.Store(st.ServeNanos)
	}
	return nil
}

func formatOf(layout string, limit, cs int64, pools int) string {
	if layout == PerChunk {
		pools = 0
	}
	return fmt.Sprintf("%s size=%d chunk=%d pools=%d", layout, limit*blockSize, cs, pools)
}

// ChunkSize is the store's chunk size.
func (s *Store) ChunkSize() int64 { return s.cs }

// ReadAt reads chunk k of version dv from off within the chunk into p.
// It reports false when the store does not hold it; a chunk of an older
// version is dropped then. It counts a hit or a miss.
func (s *Store) ReadAt(k Key, dv uint64, p []byte, off int64) (int, bool) {
	n, ok := s.Cached(k, dv, p, off)
	if ok {
		s.hits.Add(1)
	} else {
		s.misses.Add(1)
	}
	return n, ok
}

// Cached is ReadAt without counting: a fetch's last look, before it goes
// to the origin, for a chunk another fetch stored meanwhile.
func (s *Store) Cached(k Key, dv uint64, p []byte, off int64) (int, bool) {
	// Runs split, join and go while the lock is not held: a chunk is
	// named by its key and its place, looked up again after the read.
	for range 3 {
		t := time.Now()
		s.mu.Lock()
		r, i := s.findLocked(k, dv)
		if r == nil {
			s.mu.Unlock()
			spent(&s.mapNanos, t)
			break
		}
		s.lru.MoveToFront(r.elem)
		n := r.chunkLen(i, s.cs)
		at := s.layout.at(r.at, i)
		check := r.unverified != nil && r.unverified[i/64]&(1<<(i%64)) != 0
		crc := r.crcs[i]
		s.mu.Unlock()
		spent(&s.mapNanos, t)
		if off >= n {
			return 0, true
		}
		if check && !s.verify(k, dv, at, n, crc) {
			continue
		}
		t = time.Now()
		got, err := s.layout.readAt(at, p[:min(int64(len(p)), n-off)], off)
		spent(&s.readNanos, t)
		// A chunk dropped during the read may have had its blocks reused.
		if err != nil || !s.still(k, dv, at) {
			continue
		}
		return got, true
	}
	return 0, false
}

// spent adds the time since t to c.
func spent(c *atomic.Int64, t time.Time) { c.Add(int64(time.Since(t))) }

// still reports whether chunk k of dv is stored at at.
func (s *Store) still(k Key, dv uint64, at loc) bool {
	defer spent(&s.mapNanos, time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	r, i := s.findLocked(k, dv)
	return r != nil && s.layout.at(r.at, i) == at
}

// verify checks chunk k of dv, stored at at, against its CRC, dropping it
// if it is torn; false if it is not (or no longer) there.
func (s *Store) verify(k Key, dv uint64, at loc, n int64, crc uint32) bool {
	buf := make([]byte, n)
	t := time.Now()
	_, err := s.layout.readAt(at, buf, 0)
	spent(&s.readNanos, t)
	s.mu.Lock()
	defer s.mu.Unlock()
	r, i := s.findLocked(k, dv)
	if r == nil || s.layout.at(r.at, i) != at {
		return false
	}
	if r.unverified == nil || r.unverified[i/64]&(1<<(i%64)) == 0 {
		return true // verified meanwhile
	}
	if err != nil || chunkindex.Checksum(buf) != crc {
		s.torn.Add(1)
		s.dropChunkLocked(r, i)
		return false
	}
	r.unverified[i/64] &^= 1 << (i % 64)
	for _, w := range r.unverified {
		if w != 0 {
			return true
		}
	}
	r.unverified = nil
	return true
}

// findLocked returns the run holding chunk k of version dv and the chunk's
// position in it.
func (s *Store) findLocked(k Key, dv uint64) (*run, int64) {
	f := s.files[k.FID]
	if f == nil {
		return nil, 0
	}
	if f.dv != dv {
		if dv > f.dv {
			s.dropFileLocked(f) // versions only grow: this one is gone
		}
		return nil, 0
	}
	j := sort.Search(len(f.runs), func(j int) bool { return f.runs[j].first+f.runs[j].n() > k.Idx })
	if j == len(f.runs) || f.runs[j].first > k.Idx {
		return nil, 0
	}
	return f.runs[j], k.Idx - f.runs[j].first
}

// Put stores chunk k of version dv of a file of size bytes, fetched in
// took for user; the chunks one user fetches are placed together. A
// chunk of a version older than the one held is not stored.
func (s *Store) Put(k Key, dv uint64, size int64, data []byte, user string, took time.Duration) error {
	if len(data) == 0 || int64(len(data)) > s.cs {
		return fmt.Errorf("chunk %v/%d: %d bytes, want 1 to %d", k.FID, k.Idx, len(data), s.cs)
	}
	nb := blocks(int64(len(data)))
	t := time.Now()
	s.mu.Lock()
	f := s.files[k.FID]
	switch {
	case f == nil:
		f = &file{fid: k.FID, dv: dv, size: size}
		s.files[k.FID] = f
	case dv < f.dv:
		s.mu.Unlock()
		spent(&s.mapNanos, t)
		return nil
	case dv > f.dv:
		s.dropFileLocked(f)
		f = &file{fid: k.FID, dv: dv, size: size}
		s.files[k.FID] = f
	}
	if r, _ := s.findLocked(k, dv); r != nil {
		s.mu.Unlock()
		spent(&s.mapNanos, t)
		return nil // a concurrent fetch stored it
	}
	at, ok := s.placeLocked(f, k.Idx, nb, user)
	s.mu.Unlock()
	spent(&s.mapNanos, t)
	if !ok {
		return ErrNoSpace
	}
	err := s.layout.writeAt(at, data)
	defer spent(&s.mapNanos, time.Now())
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, _ := s.findLocked(k, dv); err != nil || s.files[k.FID] != f || r != nil {
		// Failed, the file changed, or another Put stored the chunk
		// meanwhile: give the room back.
		s.layout.release(at, nb)
		s.used -= nb
		return err
	}
	s.publishLocked(f, k.Idx, at, chunkindex.Checksum(data), int64(len(data)), took)
	return nil
}

// placeLocked finds room for nb blocks of chunk idx of f, evicting runs
// until there is.
func (s *Store) placeLocked(f *file, idx, nb int64, user string) (loc, bool) {
	for {
		if s.used+nb <= s.limit {
			if at, ok := s.layout.place(f, idx, nb, user); ok {
				s.used += nb
				return at, true
			}
		}
		if !s.evictLocked() {
			return loc{}, false
		}
	}
}

// evictCandidates is how many of the least recently used runs eviction
// looks at for one that was quick to fetch.
const evictCandidates = 8

// evictLocked frees one run; false if there is none.
func (s *Store) evictLocked() bool {
	victim := s.lru.Back()
	if victim == nil {
		return false
	}
	for e, i := victim, 0; e != nil && i < evictCandidates; e, i = e.Prev(), i+1 {
		if e.Value.(*run).took < s.fast {
			victim = e
			break
		}
	}
	s.evictions.Add(1)
	s.dropRunLocked(victim.Value.(*run))
	return true
}

// publishLocked makes a written chunk visible: it extends the run it
// continues, or starts one, and joins the run that follows if that
// continues it in turn.
func (s *Store) publishLocked(f *file, idx int64, at loc, crc uint32, n int64, took time.Duration) {
	j := sort.Search(len(f.runs), func(j int) bool { return f.runs[j].first > idx })
	var r *run
	if j > 0 {
		if p := f.runs[j-1]; p.first+p.n() == idx && p.last == s.cs && s.layout.at(p.at, p.n()) == at {
			r = p
			r.crcs = append(r.crcs, crc)
			r.last, r.took = n, max(r.took, took)
			if r.unverified != nil {
				r.unverified = append(r.unverified, make([]uint64, (r.n()+63)/64-int64(len(r.unverified)))...)
			}
			s.lru.MoveToFront(r.elem)
		}
	}
	if r == nil {
		r = &run{f: f, first: idx, at: at, crcs: []uint32{crc}, last: n, took: took}
		r.elem = s.lru.PushFront(r)
		f.runs = append(f.runs, nil)
		copy(f.runs[j+1:], f.runs[j:])
		f.runs[j] = r
		s.nruns++
		j++
	}
	s.nchunks++
	if j < len(f.runs) {
		if q := f.runs[j]; q.first == idx+1 && n == s.cs && s.layout.at(r.at, r.n()) == q.at && q.unverified == nil && r.unverified == nil {
			r.crcs = append(r.crcs, q.crcs...)
			r.last, r.took = q.last, max(r.took, q.took)
			s.lru.Remove(q.elem)
			q.dead = true
			f.runs = append(f.runs[:j], f.runs[j+1:]...)
			s.nruns--
		}
	}
	s.pending[f.fid] = true
}

// dropRunLocked frees r's room.
func (s *Store) dropRunLocked(r *run) {
	if r.dead {
		return
	}
	r.dead = true
	s.lru.Remove(r.elem)
	var nb int64
	for i := range r.n() {
		nb += blocks(r.chunkLen(i, s.cs))
	}
	s.layout.free(r.at, r.n(), r.last)
	s.used -= nb
	s.nruns--
	s.nchunks -= r.n()
	f := r.f
	for j, q := range f.runs {
		if q == r {
			f.runs = append(f.runs[:j], f.runs[j+1:]...)
			break
		}
	}
	if len(f.runs) == 0 && s.files[f.fid] == f {
		delete(s.files, f.fid)
	}
	s.pending[f.fid] = true
}

// dropChunkLocked frees chunk i of r, splitting r around it.
func (s *Store) dropChunkLocked(r *run, i int64) {
	if r.n() == 1 {
		s.dropRunLocked(r)
		return
	}
	f := r.f
	j := 0
	for f.runs[j] != r {
		j++
	}
	if i+1 < r.n() {
		t := &run{f: f, first: r.first + i + 1, at: s.layout.at(r.at, i+1), crcs: append([]uint32(nil), r.crcs[i+1:]...),
			last: r.last, took: r.took, unverified: bitRange(r.unverified, i+1, r.n())}
		t.elem = s.lru.InsertAfter(t, r.elem)
		f.runs = append(f.runs[:j+1], append([]*run{t}, f.runs[j+1:]...)...)
		s.nruns++
	}
	nb := blocks(r.chunkLen(i, s.cs))
	s.layout.release(s.layout.at(r.at, i), nb)
	s.used -= nb
	s.nchunks--
	if i == 0 {
		r.dead = true
		s.lru.Remove(r.elem)
		f.runs = append(f.runs[:j], f.runs[j+1:]...)
		s.nruns--
	} else {
		r.crcs, r.last, r.unverified = r.crcs[:i], s.cs, bitRange(r.unverified, 0, i)
	}
	s.pending[f.fid] = true
}

// bitRange is bits [from, to) of b as a bitset of their own; nil for nil.
func bitRange(b []uint64, from, to int64) []uint64 {
	if b == nil {
		return nil
	}
	out := make([]uint64, (to-from+63)/64)
	for i := from; i < to; i++ {
		if b[i/64]&(1<<(i%64)) != 0 {
			out[(i-from)/64] |= 1 << ((i - from) % 64)
		}
	}
	return out
}

func (s *Store) dropFileLocked(f *file) {
	for len(f.runs) > 0 {
		s.dropRunLocked(f.runs[0])
	}
	if s.files[f.fid] == f {
		delete(s.files, f.fid)
	}
	s.pending[f.fid] = true
}

// Drop forgets everything held of fid.
func (s *Store) Drop(fid node.FID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.files[fid]; f != nil {
		s.dropFileLocked(f)
	}
}

// CountServed adds n bytes served to clients in d, from the store or
// the origin; CountFetched n bytes fetched from the origin. Both are
// kept with the store's statistics.
func (s *Store) CountServed(n int64, d time.Duration) {
	s.served.Add(n)
	s.serveNanos.Add(int64(d))
}
func (s *Store) CountFetched(n int64) { s.fetched.Add(n) }

// syncfs writes back everything of the file system dir is on.
func syncfs(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Syncfs(int(d.Fd()))
}

// Stats are the store's counters; the cumulative ones survive restarts.
type Stats struct {
	Layout       string `json:"layout"`
	Hits         int64  `json:"hits"`
	Misses       int64  `json:"misses"`
	BytesServed  int64  `json:"bytes_served"`
	BytesFetched int64  `json:"bytes_fetched"`
	Evictions    int64  `json:"evictions"`
	// Torn counts chunks found not to match their CRC after a crash.
	Torn      int64 `json:"torn"`
	Files     int64 `json:"files"`
	Runs      int64 `json:"runs"`
	Chunks    int64 `json:"chunks"`
	BytesUsed int64 `json:"bytes_used"`
	Limit     int64 `json:"limit"`
	ChunkSize int64 `json:"chunk_size"`
	// MapNanos, ReadNanos and ServeNanos are the time spent finding and
	// placing chunks, reading them from the store's files, and serving
	// client reads in all; summed over concurrent callers, so per byte
	// served they are a read's latency broken down.
	MapNanos   int64 `json:"map_nanos"`
	ReadNanos  int64 `json:"read_nanos"`
	ServeNanos int64 `json:"serve_nanos"`
	// Indexed: every chunk stored before this time is in the index on
	// disk (chunkindex.Index.Indexed).
	Indexed time.Time `json:"indexed"`
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsLocked()
}

func (s *Store) statsLocked() Stats {
	return Stats{Layout: s.name, Hits: s.hits.Load(), Misses: s.misses.Load(), BytesServed: s.served.Load(),
		BytesFetched: s.fetched.Load(), Evictions: s.evictions.Load(), Torn: s.torn.Load(),
		Files: int64(len(s.files)), Runs: s.nruns, Chunks: s.nchunks, BytesUsed: s.used * blockSize,
		Limit: s.limit * blockSize, ChunkSize: s.cs,
		MapNanos: s.mapNanos.Load(), ReadNanos: s.readNanos.Load(), ServeNanos: s.serveNanos.Load(), Indexed: s.idx.Indexed()}
}

// ReadStats reads the counters a store in dir last published, about
// once a second, as stats.json (the store itself is locked while in use).
func ReadStats(dir string) (Stats, error) {
	var s Stats
	return s, chunkindex.ReadStats(dir, &s)
}

// Close writes the index, marks the store clean and closes it.
func (s *Store) Close() error {
	// The chunks must be on disk before the index says they need no check.
	err := syncfs(s.dir)
	if err == nil {
		err = s.idx.Close()
	} else {
		s.idx.Abandon()
	}
	if cerr := s.layout.close(); err == nil {
		err = cerr
	}
	return err
}
