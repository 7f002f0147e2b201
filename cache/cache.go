// Package cache is the client's chunk cache: one sparse cache file per
// remote file, holding the file's bytes at their real offsets, plus an index
// (bbolt) of which chunks are present, their CRC32C, the file's last known
// status, local writes not yet stored, and per-file policy fields.
//
// The layout lets a fully cached file be handed to the kernel as a FUSE
// passthrough backing file (one backing file per inode); a chunk-per-file
// layout could not. Chunks are the unit of fetching and eviction. New
// cache files are taken from a few empty ones made ahead (spare.go).
//
// Space is a hard limit: a chunk's bytes (rounded up to 4 KiB) are
// reserved before it is written, eviction is LRU over clean chunks, and
// dirty chunks are never evicted. When nothing can be evicted the caller is
// told (ErrNoSpace) and serves the read without caching.
//
// Crash safety does not rest on the index: index updates are group
// committed in the background (chunkindex), and after an unclean shutdown
// every present chunk is checked against its CRC before use, so an index
// ahead of or behind the data is never served wrong. The hit path does
// not checksum.
package cache

import (
	"container/list"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/chunkindex"
	"github.com/hoardfs/hoard/node"
)

// Errors the cache returns.
var (
	// ErrMiss: a chunk of the range is not cached.
	ErrMiss = errors.New("cache: chunk not present")
	// ErrStale: the data belongs to another data version than the entry's.
	ErrStale = errors.New("cache: data version changed")
	// ErrNoSpace: no space can be reserved (everything left is dirty).
	ErrNoSpace = errors.New("cache: full of data that cannot be evicted")
)

// DefaultChunkSize is the chunk size of a new cache unless told otherwise.
const DefaultChunkSize = 256 << 10

const blockSize = 4096

// maxOpen bounds the cache files kept open at once: half the process's
// descriptor limit (Go raises the soft limit to the hard one), within
// [256, 16384]. Reopening a closed cache file costs a read several µs.
var maxOpen = func() int {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) != nil {
		return 1024
	}
	return int(max(256, min(rl.Cur/2, 16384)))
}()

// Options configure Open.
type Options struct {
	// Dir holds the cache; empty keeps it in memory only.
	Dir string
	// Size is the hard limit on cached bytes.
	Size int64
	// ChunkSize applies when the cache is created: a power of two from
	// 4 KiB to 64 MiB, default 256 KiB. An existing cache keeps its own.
	ChunkSize int64
	// Key, if set (KeySize bytes), encrypts the cache files (sealed.go);
	// the cache then starts empty, and refuses a directory holding
	// writes not yet stored, which only the key they were written under
	// could read.
	Key []byte
}

// Range is a byte range.
type Range struct{ Off, Len int64 }

// Cache is an open chunk cache.
type Cache struct {
	dir string
	// size is the limit on the bytes cached (Cache.mu): the configured
	// size, less what the file system under dir cannot give (capToDisk,
	// diskFull).
	size     int64
	cs       int64
	fullOnce sync.Once
	// idx and spare are nil for a memory cache.
	idx   *chunkindex.Index
	spare *spares
	// sealer encrypts the cache files; nil: they are plain.
	sealer *sealer

	mu      sync.Mutex
	entries map[node.FID]*Entry
	lru     *list.List // of *chunk, most recent at the front
	lruGen  atomic.Int64
	lruLen  atomic.Int64
	used    int64
	// dirtyBytes is the total of the entries' unstored ranges.
	dirtyBytes atomic.Int64
	pending    map[*Entry]bool // index records to write
	// doomed are files dropped whose cache files are still to be unlinked.
	doomed []node.FID
	gauges map[string]int64
	// openFiles lists entries holding an open cache file, most recent
	// first, to bound descriptors.
	openFiles *list.List

	stats  counters
	stop   chan struct{} // ends the spares' maker
	closed atomic.Bool
}

type counters struct {
	hits, misses, fetched, written, evictions, bypassed, recovered, corrupt, chunks atomic.Int64
}

// Stats are the cache's counters. The cumulative ones survive restarts.
type Stats struct {
	Hits         int64 `json:"hits"`
	Misses       int64 `json:"misses"`
	BytesFetched int64 `json:"bytes_fetched"`
	BytesCached  int64 `json:"bytes_cached"`
	// BytesWritten counts bytes written into the cache's store (fetched
	// chunks and local writes): what caching costs the cache disk.
	BytesWritten int64 `json:"bytes_written"`
	Limit        int64 `json:"limit"`
	Chunks       int64 `json:"chunks"`
	Files        int64 `json:"files"`
	Evictions    int64 `json:"evictions"`
	Bypassed     int64 `json:"bypassed"`
	Recovered    int64 `json:"recovered"`
	// Corrupt counts chunks that failed their checksum when first read
	// after a start, and were fetched again.
	Corrupt   int64            `json:"corrupt"`
	ChunkSize int64            `json:"chunk_size"`
	Gauges    map[string]int64 `json:"gauges,omitempty"`
	Updated   time.Time        `json:"updated"`
	// Indexed: every change made to the cache before this time is in
	// its index on disk (chunkindex.Index.Indexed).
	Indexed time.Time `json:"indexed"`
}

// Open opens or creates a cache.
func Open(o Options) (*Cache, error) {
	if o.Size <= 0 {
		return nil, fmt.Errorf("cache size %d: must be positive", o.Size)
	}
	cs := o.ChunkSize
	if cs == 0 {
		cs = DefaultChunkSize
	}
	if cs < blockSize || cs > 64<<20 || cs&(cs-1) != 0 {
		return nil, fmt.Errorf("chunk size %d: want a power of two from 4 KiB to 64 MiB", cs)
	}
	c := &Cache{dir: o.Dir, size: o.Size, cs: cs, entries: map[node.FID]*Entry{}, lru: list.New(),
		pending: map[*Entry]bool{}, gauges: map[string]int64{}, openFiles: list.New(),
		stop: make(chan struct{})}
	if o.Dir == "" {
		return c, nil // memory is not a disk to steal
	}
	if o.Key != nil {
		var err error
		if c.sealer, err = newSealer(o.Key); err != nil {
			return nil, err
		}
	}
	if err := c.openDir(); err != nil {
		if c.idx != nil {
			c.idx.Abandon()
		}
		return nil, err
	}
	c.capToDisk()
	go c.spare.run(c.stop)
	return c, nil
}

func (c *Cache) openDir() error {
	dir := c.dir
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o700); err != nil {
		return fmt.Errorf("cache directory %s: %w", dir, errors.Unwrap(err))
	}
	var err error
	if c.idx, err = chunkindex.Open(dir); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	if c.spare, err = newSpares(dir); err != nil {
		return err
	}
	if err := c.openIndex(); err != nil {
		// An index that cannot be read is discarded with the data it
		// described (removeOrphans): start empty rather than serve from it.
		slog.Warn("cache index unreadable; starting empty", "dir", dir, "err", err)
		c.entries = map[node.FID]*Entry{}
		c.lru.Init()
		c.lruLen.Store(0)
		c.used = 0
		c.stats.chunks.Store(0)
		c.dirtyBytes.Store(0)
		if err := c.idx.Reset(); err != nil {
			return fmt.Errorf("cache directory %s: %w", dir, err)
		}
		if err := c.openIndex(); err != nil {
			return fmt.Errorf("cache directory %s: %w", dir, err)
		}
	}
	if c.sealer != nil {
		if err := c.forgetAll(); err != nil {
			return err
		}
	}
	if !c.idx.Clean() {
		c.verify()
		c.removeOrphans()
	}
	return c.idx.Start(chunkindex.Source{Changes: c.changes, Stats: func() any { return c.Stats() }}, 100*time.Millisecond)
}

// openIndex reads the chunk size, the counters and every record.
func (c *Cache) openIndex() error {
	v, err := c.idx.Setting("chunksize", []byte(strconv.FormatInt(c.cs, 10)))
	if err != nil {
		return err
	}
	if c.cs, err = strconv.ParseInt(string(v), 10, 64); err != nil {
		return fmt.Errorf("chunk size %q: %w", v, err)
	}
	var s Stats
	if c.idx.LoadStats(&s) {
		c.stats.hits.Store(s.Hits)
		c.stats.misses.Store(s.Misses)
		c.stats.fetched.Store(s.BytesFetched)
		c.stats.written.Store(s.BytesWritten)
		c.stats.evictions.Store(s.Evictions)
		c.stats.bypassed.Store(s.Bypassed)
		c.stats.recovered.Store(s.Recovered)
		c.stats.corrupt.Store(s.Corrupt)
	}
	return c.idx.Load(func(k, v []byte) error {
		fid, ok := node.FIDOfKey(k)
		if !ok {
			return errBadRecord
		}
		r, err := decodeRecord(v)
		if err != nil {
			return fmt.Errorf("record %v: %w", fid, err)
		}
		c.load(fid, r)
		return nil
	})
}

// load installs an entry from its index record.
func (c *Cache) load(fid node.FID, r record) {
	e := c.newEntry(fid)
	e.st, e.hasSt, e.cut, e.policy = r.st, r.hasSt, r.cut, r.policy
	e.setDirtyLocked(r.dirty)
	for _, cr := range r.chunks {
		ch := &chunk{e: e, idx: cr.idx, n: cr.n, crc: cr.crc, dirty: cr.dirty}
		ch.unchecked.Store(!cr.dirty)
		e.chunks[cr.idx] = ch
		c.used += charge(cr.n)
		c.stats.chunks.Add(1)
		if !ch.dirty {
			ch.elem = c.lru.PushBack(ch)
			c.lruLen.Store(int64(c.lru.Len()))
		}
	}
	c.entries[fid] = e
}

// verify checks every clean chunk against its checksum after an unclean
// shutdown, dropping the ones that do not match.
func (c *Cache) verify() {
	var bad int64
	buf := make([]byte, c.cs)
	for _, e := range c.entries {
		for idx, ch := range e.chunks {
			if ch.dirty {
				continue
			}
			ok := false
			if f, err := os.Open(e.path()); err == nil {
				n, _ := f.ReadAt(buf[:ch.n], idx*c.cs)
				ok = int64(n) == ch.n && chunkindex.Checksum(buf[:ch.n]) == ch.crc
				f.Close()
			}
			ch.unchecked.Store(!ok)
			if !ok {
				c.dropChunkLocked(e, ch)
				bad++
			}
		}
		c.pending[e] = true
	}
	c.stats.recovered.Add(bad)
	if bad > 0 {
		slog.Warn("cache: dropped chunks that failed their checksum after an unclean shutdown", "dir", c.dir, "chunks", bad)
	}
}

// Flush commits pending index updates now.
func (c *Cache) Flush() error {
	if c.idx == nil {
		return nil
	}
	return c.idx.Commit()
}

// changes unlinks the files of dropped entries and encodes the records
// changed since the last commit. An entry dropped and made again leaves
// its FID two entries: the live one's record wins.
func (c *Cache) changes() map[string][]byte {
	c.unlinkDoomed()
	c.mu.Lock()
	todo := c.pending
	c.pending = map[*Entry]bool{}
	c.mu.Unlock()
	recs := make(map[string][]byte, len(todo))
	for e := range todo {
		e.mu.RLock()
		var val []byte
		if !e.gone {
			val = e.recordLocked().encode()
		}
		e.mu.RUnlock()
		k := string(e.fid.Key())
		if _, live := recs[k]; val != nil || !live {
			recs[k] = val
		}
	}
	return recs
}

// unlinkDoomed unlinks the cache files of dropped entries. A file whose
// FID has an entry again (it should not: dropped files are gone at the
// server) is that entry's now, and stays. Unlinked before or after the
// index forgets the entry, a crash leaves either a record without its
// file, whose chunks verify drops, or a file without a record, which
// removeOrphans does.
func (c *Cache) unlinkDoomed() {
	c.mu.Lock()
	doomed := c.doomed
	c.doomed = nil
	c.mu.Unlock()
	for _, fid := range doomed {
		c.mu.Lock()
		if _, ok := c.entries[fid]; !ok {
			os.Remove(c.filePath(fid))
		}
		c.mu.Unlock()
	}
}

// removeOrphans removes cache files no entry owns, after an unclean
// shutdown (unlinkDoomed).
func (c *Cache) removeOrphans() {
	owned := make(map[string]bool, len(c.entries))
	for _, e := range c.entries {
		owned[e.path()] = true
	}
	vols, _ := os.ReadDir(filepath.Join(c.dir, "files"))
	var n int
	for _, v := range vols {
		dir := filepath.Join(c.dir, "files", v.Name())
		files, _ := os.ReadDir(dir)
		for _, f := range files {
			if p := filepath.Join(dir, f.Name()); !owned[p] && os.Remove(p) == nil {
				n++
			}
		}
	}
	if n > 0 {
		slog.Info("cache: removed files of entries dropped before an unclean shutdown", "dir", c.dir, "files", n)
	}
}

// forgetAll empties an encrypted cache as it opens: its files are
// unreadable without the key of the process that wrote them. Writes not
// yet stored are not dropped: the cache refuses to open.
func (c *Cache) forgetAll() error {
	if n := c.dirtyBytes.Load(); n > 0 {
		return fmt.Errorf("cache directory %s holds %d bytes of writes not yet stored: open it once without encryption to store them", c.dir, n)
	}
	c.entries = map[node.FID]*Entry{}
	c.lru.Init()
	c.lruLen.Store(0)
	c.used = 0
	c.stats.chunks.Store(0)
	if err := c.idx.Reset(); err != nil {
		return fmt.Errorf("cache directory %s: %w", c.dir, err)
	}
	if err := c.openIndex(); err != nil {
		return fmt.Errorf("cache directory %s: %w", c.dir, err)
	}
	c.removeOrphans()
	return nil
}

func (c *Cache) markPending(e *Entry) {
	c.mu.Lock()
	c.pending[e] = true
	c.mu.Unlock()
}

// Close commits the index, marks the cache clean and releases it. The
// cache files are not synced: every chunk is checked against its CRC
// the first time it is read after a start.
func (c *Cache) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	close(c.stop)
	if c.idx == nil {
		return nil
	}
	err := c.idx.Close()
	c.mu.Lock()
	entries := make([]*Entry, 0, len(c.entries))
	for _, e := range c.entries {
		entries = append(entries, e)
	}
	c.mu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		e.closeFileLocked()
		e.mu.Unlock()
	}
	return err
}

// ChunkSize is the cache's chunk size.
func (c *Cache) ChunkSize() int64 { return c.cs }

// Size is the limit.
func (c *Cache) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size
}

// diskMargin is what the cache leaves free on its file system at start,
// for its index and lost/: a tenth of the free space, at most 64 MiB.
func diskMargin(free int64) int64 { return min(free/10, 64<<20) }

// capToDisk bounds the cache by what its file system can give it at
// start: what it holds already and the space free, less diskMargin. A
// size the disk cannot hold would fail fetches with ENOSPC rather than
// evict (a 1 GiB default on a small file system).
func (c *Cache) capToDisk() {
	var st unix.Statfs_t
	if unix.Statfs(c.dir, &st) != nil {
		return
	}
	free := int64(st.Bavail) * st.Bsize
	if limit := max(c.used+free-diskMargin(free), c.cs); limit < c.size {
		slog.Warn("cache: its file system has less room than the cache size; using less", "dir", c.dir,
			"size", c.size, "using", limit)
		c.size = limit
	}
}

// diskFull shrinks the cache below what it holds when a write to a cache
// file found its file system full (other files took the room since the
// start): eviction then frees disk space where the size alone would not.
func (c *Cache) diskFull() {
	c.mu.Lock()
	c.size = max(c.cs, min(c.size, c.used-c.used/10))
	size := c.size
	c.mu.Unlock()
	c.fullOnce.Do(func() {
		slog.Warn("cache: its file system is full; the cache shrinks to make room", "dir", c.dir, "using", size)
	})
}

// Used is the space reserved now; never more than Size.
func (c *Cache) Used() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// DirtyBytes is the total length of the unstored writes of all entries.
func (c *Cache) DirtyBytes() int64 { return c.dirtyBytes.Load() }

// Dir is the cache directory; empty for a memory cache.
func (c *Cache) Dir() string { return c.dir }

func charge(n int64) int64 { return (n + blockSize - 1) / blockSize * blockSize }

// reserve makes room for n more bytes, evicting least recently used clean
// chunks. It must be called with no entry lock held.
func (c *Cache) reserve(n int64) error {
	if n <= 0 {
		return nil
	}
	for {
		c.mu.Lock()
		if c.used+n <= c.size {
			c.used += n
			c.mu.Unlock()
			return nil
		}
		var victims []*chunk
		need := c.used + n - c.size
		for el := c.lru.Back(); el != nil && need > 0; {
			ch := el.Value.(*chunk)
			el = el.Prev()
			c.unlinkLocked(ch)
			victims = append(victims, ch)
			need -= charge(ch.n)
		}
		c.mu.Unlock()
		if len(victims) == 0 {
			return ErrNoSpace
		}
		for _, ch := range victims {
			ch.e.evict(ch)
		}
	}
}

// release returns n reserved bytes.
func (c *Cache) release(n int64) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	c.used -= n
	c.mu.Unlock()
}

// dropChunkLocked forgets a chunk during load-time verification (no other
// goroutine runs yet).
func (c *Cache) dropChunkLocked(e *Entry, ch *chunk) {
	c.unlinkLocked(ch)
	delete(e.chunks, ch.idx)
	c.used -= charge(ch.n)
	c.stats.chunks.Add(-1)
	e.punch(ch.idx, ch.n)
}

// Entry returns the entry for fid, creating it in memory if needed.
func (c *Cache) Entry(fid node.FID) *Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[fid]
	if e == nil {
		e = c.newEntry(fid)
		c.entries[fid] = e
	}
	return e
}

// Lookup returns an existing entry.
func (c *Cache) Lookup(fid node.FID) (*Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[fid]
	return e, ok
}

// Entries lists every known FID.
func (c *Cache) Entries() []node.FID {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]node.FID, 0, len(c.entries))
	for f := range c.entries {
		out = append(out, f)
	}
	return out
}

// Drop forgets a file that no longer exists on the server. It refuses a
// file with unstored writes.
func (c *Cache) Drop(fid node.FID) error { return c.drop(fid, false) }

// Remove drops fid's entry like Drop, unstored writes included: for a
// file nobody can read any more (removed, and no longer open).
func (c *Cache) Remove(fid node.FID) { c.drop(fid, true) }

func (c *Cache) drop(fid node.FID, unstored bool) error {
	e, ok := c.Lookup(fid)
	if !ok {
		return nil
	}
	e.mu.Lock()
	if len(e.dirty) > 0 && !unstored {
		e.mu.Unlock()
		return fmt.Errorf("cache: %v has unstored writes", fid)
	}
	e.unlinkFileLocked(true)
	e.setDirtyLocked(nil)
	e.cut, e.gone = -1, true
	e.mu.Unlock()
	c.mu.Lock()
	delete(c.entries, fid)
	c.pending[e] = true
	c.mu.Unlock()
	return nil
}

// Counters and gauges, cheap enough for the hit path.

func (c *Cache) CountHit(n int64)      { c.stats.hits.Add(n) }
func (c *Cache) CountMiss(n int64)     { c.stats.misses.Add(n) }
func (c *Cache) CountFetched(n int64)  { c.stats.fetched.Add(n) }
func (c *Cache) CountBypassed(n int64) { c.stats.bypassed.Add(n) }

// SetGauge records a value owned by the caller (e.g. callbacks held).
func (c *Cache) SetGauge(name string, v int64) {
	c.mu.Lock()
	c.gauges[name] = v
	c.mu.Unlock()
}

// Stats returns the counters now.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	g := make(map[string]int64, len(c.gauges))
	for k, v := range c.gauges {
		g[k] = v
	}
	used, files := c.used, int64(len(c.entries))
	c.mu.Unlock()
	return Stats{
		Hits: c.stats.hits.Load(), Misses: c.stats.misses.Load(), BytesFetched: c.stats.fetched.Load(), BytesWritten: c.stats.written.Load(),
		BytesCached: used, Limit: c.Size(), Chunks: c.stats.chunks.Load(), Files: files,
		Evictions: c.stats.evictions.Load(), Bypassed: c.stats.bypassed.Load(), Recovered: c.stats.recovered.Load(),
		Corrupt: c.stats.corrupt.Load(), ChunkSize: c.cs, Gauges: g, Updated: time.Now(), Indexed: c.indexed(),
	}
}

func (c *Cache) indexed() time.Time {
	if c.idx == nil {
		return time.Time{}
	}
	return c.idx.Indexed()
}

// ReadStats reads the counters a cache in dir last published, about once
// a second, as stats.json (the cache itself is locked while in use).
func ReadStats(dir string) (Stats, error) {
	var s Stats
	err := chunkindex.ReadStats(dir, &s)
	if errors.Is(err, os.ErrNotExist) {
		return s, fmt.Errorf("no statistics yet (stats.json is written by a client using this cache)")
	}
	return s, err
}

// fileOpened records that e holds an open cache file, closing the least
// recently opened ones beyond the bound.
func (c *Cache) fileOpened(e *Entry) {
	c.mu.Lock()
	if e.openElem != nil {
		c.openFiles.MoveToFront(e.openElem)
		c.mu.Unlock()
		return
	}
	e.openElem = c.openFiles.PushFront(e)
	var victims []*Entry
	for el := c.openFiles.Back(); c.openFiles.Len()-len(victims) > maxOpen && el != nil; el = el.Prev() {
		if v := el.Value.(*Entry); v != e {
			victims = append(victims, v)
		}
	}
	c.mu.Unlock()
	for _, v := range victims {
		// TryLock: a busy entry keeps its file this time; never wait on
		// another entry's lock while holding ours.
		if v.mu.TryLock() {
			v.closeFileLocked()
			v.mu.Unlock()
		}
	}
}

func (c *Cache) fileClosed(e *Entry) {
	c.mu.Lock()
	if e.openElem != nil {
		c.openFiles.Remove(e.openElem)
		e.openElem = nil
	}
	c.mu.Unlock()
}
