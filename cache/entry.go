package cache

import (
	"bytes"
	"container/list"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/chunkindex"
	"github.com/hoardfs/hoard/node"
)

// chunk is one present chunk of an entry.
type chunk struct {
	e     *Entry
	idx   int64
	n     int64 // valid bytes
	crc   uint32
	dirty bool          // holds local writes not yet stored: pinned
	elem  *list.Element // in the cache's LRU while clean (Cache.mu)
	// gen is the LRU generation of the chunk's last move to the front.
	gen atomic.Int64
	// unchecked: a clean chunk an earlier process recorded, not yet read
	// against its checksum by this one (checked). Anything may have
	// changed the cache file while no process held it.
	unchecked atomic.Bool
}

// Entry is one cached file. Its methods are safe for concurrent use.
//
// Lock order: Entry.mu before Cache.mu; never one entry's lock while
// waiting for another's.
type Entry struct {
	c   *Cache
	fid node.FID

	mu     sync.RWMutex
	st     node.Status
	hasSt  bool
	cut    int64 // lowest local truncation point not yet stored; -1 none
	chunks map[int64]*chunk
	dirty  []Range
	// dirtyLen is the total length of dirty (setDirtyLocked).
	dirtyLen int64
	policy   map[string]string
	gone     bool
	// pins counts users reading the cache file behind the cache's back
	// (FUSE passthrough): its chunks are not evicted, and a new version
	// goes to a new file rather than under their feet.
	pins int

	file     cacheFile
	openElem *list.Element // in Cache.openFiles (Cache.mu)
	mem      map[int64][]byte
}

func (c *Cache) newEntry(fid node.FID) *Entry {
	e := &Entry{c: c, fid: fid, cut: -1, chunks: map[int64]*chunk{}}
	if c.dir == "" {
		e.mem = map[int64][]byte{}
	}
	return e
}

// FID is the file this entry caches.
func (e *Entry) FID() node.FID { return e.fid }

func (e *Entry) path() string { return e.c.filePath(e.fid) }

// filePath is where fid's cache file lives.
func (c *Cache) filePath(fid node.FID) string {
	return filepath.Join(c.dir, "files", strconv.FormatUint(fid.Volume, 10),
		strconv.FormatUint(fid.Vnode, 10)+"."+strconv.FormatUint(fid.Unique, 10))
}

// Path is the cache file, for handing to the kernel as a passthrough
// backing file; empty in a memory cache.
func (e *Entry) Path() string {
	if e.c.dir == "" || e.c.sealer != nil {
		return "" // the kernel would read ciphertext
	}
	return e.path()
}

// Status is the last status stored.
func (e *Entry) Status() (node.Status, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.st, e.hasSt
}

// readableLocked: present, or wholly past a local truncation (zeros).
func (e *Entry) readableLocked(idx int64) bool {
	return e.chunks[idx] != nil || e.cut >= 0 && idx*e.c.cs >= e.cut
}

// Local reports whether chunk idx holds this client's bytes, which only
// the cache has: unstored writes (pinned), or zeros wholly past a local
// truncation.
func (e *Entry) Local(idx int64) bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if ch := e.chunks[idx]; ch != nil {
		return ch.dirty
	}
	return e.cut >= 0 && idx*e.c.cs >= e.cut
}

// ReadAt reads from present chunks only: ErrMiss if any chunk of the range
// is missing. Reads stop at the status size (io.EOF as os.File.ReadAt).
func (e *Entry) ReadAt(p []byte, off int64) (int, error) {
	cs := e.c.cs
	for {
		e.mu.RLock()
		if !e.hasSt || off < 0 {
			e.mu.RUnlock()
			return 0, ErrMiss
		}
		size := int64(e.st.Size)
		if off >= size {
			e.mu.RUnlock()
			return 0, io.EOF
		}
		end := min(off+int64(len(p)), size)
		first, last := off/cs, (end-1)/cs
		var few [8]*chunk
		touched := few[:0]
		var bad *chunk
		for idx := first; idx <= last && bad == nil; idx++ {
			if !e.readableLocked(idx) {
				e.mu.RUnlock()
				return 0, ErrMiss
			}
			ch := e.chunks[idx]
			if ch != nil && !e.checkedLocked(ch) {
				bad = ch
			} else if ch != nil && e.c.stale(ch) {
				touched = append(touched, ch)
			}
		}
		if bad != nil {
			e.mu.RUnlock()
			e.dropCorrupt(bad)
			return 0, ErrMiss // fetched again
		}
		if e.mem == nil && e.file == nil {
			e.mu.RUnlock()
			e.mu.Lock()
			err := e.openFileLocked()
			e.mu.Unlock()
			if err != nil {
				return 0, err
			}
			continue
		}
		n, err := e.readLocked(p[:end-off], off)
		e.mu.RUnlock()
		e.c.touch(touched)
		if err == nil && end-off < int64(len(p)) {
			err = io.EOF
		}
		return n, err
	}
}

// stale reports whether a read of ch should move it to the LRU's front:
// a chunk already in the front eighth stays put, so a hot chunk costs one
// atomic load per read, not a lock (the spirit of Faster AFS's hint).
func (c *Cache) stale(ch *chunk) bool {
	return c.lruGen.Load()-ch.gen.Load() >= c.lruLen.Load()/8
}

// touch moves chunks to the front of the LRU.
func (c *Cache) touch(chs []*chunk) {
	if len(chs) == 0 {
		return
	}
	c.mu.Lock()
	for _, ch := range chs {
		if ch.elem != nil {
			c.lru.MoveToFront(ch.elem)
			ch.gen.Store(c.lruGen.Add(1))
		}
	}
	c.mu.Unlock()
}

// pushLocked puts a clean chunk of an unpinned entry at the LRU's front
// (Cache.mu and the entry's lock held).
func (c *Cache) pushLocked(ch *chunk) {
	if ch.dirty || ch.e.pins > 0 {
		return
	}
	ch.elem = c.lru.PushFront(ch)
	ch.gen.Store(c.lruGen.Add(1))
	c.lruLen.Store(int64(c.lru.Len()))
}

// unlinkLocked takes a chunk off the LRU (Cache.mu held).
func (c *Cache) unlinkLocked(ch *chunk) {
	if ch.elem != nil {
		c.lru.Remove(ch.elem)
		ch.elem = nil
		c.lruLen.Store(int64(c.lru.Len()))
	}
}

func (e *Entry) readLocked(p []byte, off int64) (int, error) {
	if e.mem != nil {
		cs := e.c.cs
		for done := 0; done < len(p); {
			at := off + int64(done)
			idx, in := at/cs, at%cs
			span := min(int64(len(p)-done), cs-in)
			buf := e.mem[idx]
			k := 0
			if in < int64(len(buf)) {
				k = copy(p[done:done+int(span)], buf[in:])
			}
			clear(p[done+k : done+int(span)])
			done += int(span)
		}
		return len(p), nil
	}
	n, err := e.file.ReadAt(p, off)
	if err == io.EOF {
		// The cache file may end before the size: the rest are zeros.
		clear(p[n:])
		n, err = len(p), nil
	}
	return n, err
}

// writeLocked writes p at off; with own, a memory cache may keep p itself.
func (e *Entry) writeLocked(p []byte, off int64, own bool) error {
	e.c.stats.written.Add(int64(len(p)))
	if e.mem != nil {
		cs := e.c.cs
		if own && off%cs == 0 && e.mem[off/cs] == nil && int64(len(p)) <= cs {
			e.mem[off/cs] = p
			return nil
		}
		for done := 0; done < len(p); {
			at := off + int64(done)
			idx, in := at/cs, at%cs
			span := min(int64(len(p)-done), cs-in)
			buf := e.mem[idx]
			if int64(len(buf)) < in+span {
				buf = append(buf, make([]byte, in+span-int64(len(buf)))...)
			}
			copy(buf[in:], p[done:done+int(span)])
			e.mem[idx] = buf
			done += int(span)
		}
		return nil
	}
	if err := e.openFileLocked(); err != nil {
		return err
	}
	_, err := e.file.WriteAt(p, off)
	if errors.Is(err, syscall.ENOSPC) {
		// The file system is full, not the cache: shrink it, so that
		// eviction makes room, and let the caller serve from memory
		// (a fetch) or store and retry (a write), as when it is full.
		e.c.diskFull()
		return ErrNoSpace
	}
	return err
}

func (e *Entry) openFileLocked() error {
	if e.file != nil || e.mem != nil {
		return nil
	}
	p := e.path()
	f, err := os.OpenFile(p, os.O_RDWR, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		f, err = e.c.spare.create(p)
	}
	if err != nil {
		return err
	}
	e.file = f
	if e.c.sealer != nil {
		if e.file, err = e.c.sealer.seal(f, e.fid); err != nil {
			f.Close()
			return err
		}
	}
	e.c.fileOpened(e)
	return nil
}

func (e *Entry) closeFileLocked() {
	if e.file == nil {
		return
	}
	e.file.Close()
	e.file = nil
	e.c.fileClosed(e)
}

// punch releases a chunk's disk blocks, keeping the file's size.
func (e *Entry) punch(idx, n int64) {
	if e.mem != nil {
		delete(e.mem, idx)
		return
	}
	if e.openFileLocked() != nil {
		return
	}
	cs := e.c.cs
	unix.Fallocate(int(e.file.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, idx*cs, max(n, cs))
}

// resizeFileLocked sets the cache file's length to the status size, so a
// complete file can be used as it is.
func (e *Entry) resizeFileLocked(size int64) {
	if e.mem != nil {
		cs := e.c.cs
		if buf, ok := e.mem[size/cs]; ok && int64(len(buf)) > size%cs {
			e.mem[size/cs] = buf[:size%cs]
		}
		return
	}
	if e.file == nil {
		if _, err := os.Stat(e.path()); err != nil {
			return
		}
		if e.openFileLocked() != nil {
			return
		}
	}
	e.file.Truncate(size)
}

// Missing lists the chunks of [off, off+n) not cached, clipped to the size.
func (e *Entry) Missing(off, n int64) []int64 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	size := int64(e.st.Size)
	end := min(off+n, size)
	if off < 0 || off >= end {
		return nil
	}
	var out []int64
	for idx := off / e.c.cs; idx*e.c.cs < end; idx++ {
		if !e.readableLocked(idx) {
			out = append(out, idx)
		}
	}
	return out
}

// Present reports whether chunk idx is cached.
func (e *Entry) Present(idx int64) bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.chunks[idx] != nil
}

// Complete reports whether every byte of the file can be read from the
// cache: then the kernel may read the cache file itself (passthrough),
// so every chunk is checked first.
func (e *Entry) Complete() bool {
	e.mu.RLock()
	if !e.hasSt {
		e.mu.RUnlock()
		return false
	}
	for idx := int64(0); idx*e.c.cs < int64(e.st.Size); idx++ {
		if !e.readableLocked(idx) {
			e.mu.RUnlock()
			return false
		}
		if ch := e.chunks[idx]; ch != nil && !e.checkedLocked(ch) {
			e.mu.RUnlock()
			e.dropCorrupt(ch)
			return false
		}
	}
	e.mu.RUnlock()
	return true
}

// checkedLocked reports whether chunk ch may be served (mu held, shared
// or not): it was written or fetched by this process, or it matches its
// checksum, read once in this process's life; a flipped bit in a cache
// file that no process held open would otherwise be served for good.
func (e *Entry) checkedLocked(ch *chunk) bool {
	if !ch.unchecked.Load() {
		return true
	}
	buf := make([]byte, ch.n)
	var n int
	var err error
	switch {
	case e.file != nil:
		n, err = e.file.ReadAt(buf, ch.idx*e.c.cs)
	default:
		var f *os.File
		if f, err = os.Open(e.path()); err == nil {
			n, err = f.ReadAt(buf, ch.idx*e.c.cs)
			f.Close()
		}
	}
	if (err == nil || err == io.EOF) && int64(n) == ch.n && chunkindex.Checksum(buf) == ch.crc {
		ch.unchecked.Store(false)
		return true
	}
	return false
}

// dropCorrupt drops chunk ch, which failed its checksum, so that it is
// fetched again; the first of a process's is logged, all are counted.
func (e *Entry) dropCorrupt(ch *chunk) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.chunks[ch.idx] != ch || !ch.unchecked.Load() || ch.dirty {
		return // dropped, checked or written meanwhile
	}
	e.dropLocked(ch)
	if e.c.stats.corrupt.Add(1) == 1 {
		slog.Warn("cache: a chunk failed its checksum and is fetched again; more are counted in hoard cache stats", "dir", e.c.dir, "fid", e.fid, "chunk", ch.idx)
	}
}

// chunkLen is the valid length of chunk idx in a file of size bytes.
func (e *Entry) chunkLen(idx int64, size uint64) int64 {
	return max(0, min(e.c.cs, int64(size)-idx*e.c.cs))
}

// dropLocked forgets a chunk and returns its space.
func (e *Entry) dropLocked(ch *chunk) {
	c := e.c
	delete(e.chunks, ch.idx)
	e.punch(ch.idx, ch.n)
	c.mu.Lock()
	c.unlinkLocked(ch)
	c.used -= charge(ch.n)
	c.pending[e] = true
	c.mu.Unlock()
	c.stats.chunks.Add(-1)
}

// evict is reserve's eviction of a chunk it took off the LRU: unless it
// was dropped or dirtied meanwhile.
func (e *Entry) evict(ch *chunk) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.chunks[ch.idx] != ch || ch.dirty || e.pins > 0 {
		return
	}
	e.dropLocked(ch)
	e.c.stats.evictions.Add(1)
}

// clearLocked drops the clean chunks, and the dirty ones too with all.
// A pinned cache file with nothing dirty is replaced instead of punched:
// its readers keep the old bytes through their descriptors.
func (e *Entry) clearLocked(all bool) {
	if e.pins > 0 && e.mem == nil && (all || !e.anyDirtyLocked()) {
		e.unlinkFileLocked(false)
		return
	}
	for _, ch := range e.chunks {
		if all || !ch.dirty {
			e.dropLocked(ch)
		}
	}
}

// unlinkFileLocked drops every chunk at once, with the cache file:
// cheaper than punching each out of a file about to go anyway. With
// later, the file of an entry that is going is unlinked by the committer
// (unlinkDoomed), off the caller's path (a remove).
func (e *Entry) unlinkFileLocked(later bool) {
	e.closeFileLocked()
	switch {
	case e.mem != nil:
		clear(e.mem)
	case later:
		e.c.mu.Lock()
		e.c.doomed = append(e.c.doomed, e.fid)
		e.c.mu.Unlock()
	default:
		os.Remove(e.path())
	}
	for _, ch := range e.chunks {
		delete(e.chunks, ch.idx)
		e.c.mu.Lock()
		e.c.unlinkLocked(ch)
		e.c.used -= charge(ch.n)
		e.c.pending[e] = true
		e.c.mu.Unlock()
		e.c.stats.chunks.Add(-1)
	}
}

func (e *Entry) anyDirtyLocked() bool {
	for _, ch := range e.chunks {
		if ch.dirty {
			return true
		}
	}
	return false
}

// Pin keeps the cache file's chunks in place while someone reads the file
// directly; Unpin ends that.
func (e *Entry) Pin() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pins++; e.pins == 1 {
		e.c.mu.Lock()
		for _, ch := range e.chunks {
			e.c.unlinkLocked(ch)
		}
		e.c.mu.Unlock()
	}
}

// Unpin undoes one Pin.
func (e *Entry) Unpin() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pins--; e.pins == 0 {
		e.c.mu.Lock()
		for _, ch := range e.chunks {
			e.c.pushLocked(ch)
		}
		e.c.mu.Unlock()
	}
}

// Learn merges a status the server sent (a fetch's, a lookup's, a
// store's, a break's refetch) with the entry's local state, atomically:
// the entry is the one owner of a cached file's size and DataVersion. A
// status older than the entry's is ignored, so a reply that raced a newer
// one cannot roll the file back. While local writes or a truncation are
// unstored the local size stands: it wins at the next store. A new
// DataVersion drops the clean chunks (the data changed); chunks past the
// size go. It reports whether the DataVersion changed.
func (e *Entry) Learn(st node.Status) (changed bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone {
		return false, fmt.Errorf("cache: %v was dropped", e.fid)
	}
	if e.hasSt && st.DataVersion < e.st.DataVersion {
		return false, nil
	}
	if e.cut >= 0 || e.dirtyLen > 0 {
		st.Size = e.st.Size
	}
	changed = e.hasSt && e.st.DataVersion != st.DataVersion
	if changed {
		e.clearLocked(false)
	}
	e.resizeLocked(st.Size)
	e.st, e.hasSt = st, true
	e.c.markPending(e)
	return changed, nil
}

// resizeLocked drops what lies past size: whole chunks, and a clean last
// chunk that would shrink (its checksum covers the longer length).
func (e *Entry) resizeLocked(size uint64) {
	if e.hasSt && size == e.st.Size {
		return
	}
	for idx, ch := range e.chunks {
		n := e.chunkLen(idx, size)
		switch {
		case n == 0 || n < ch.n && !ch.dirty:
			e.dropLocked(ch)
		case n < ch.n:
			e.c.release(charge(ch.n) - charge(n))
			ch.n = n
		}
	}
	e.setDirtyLocked(clip(e.dirty, int64(size)))
	e.resizeFileLocked(int64(size))
}

// Admit stores one fetched chunk of data version dv: space is reserved
// first (evicting LRU clean chunks), then the chunk is written,
// checksummed and marked present. A memory cache keeps data itself: the
// caller must not change it afterwards.
func (e *Entry) Admit(idx int64, dv uint64, data []byte) error {
	e.mu.RLock()
	n, _, ok := e.admitShapeLocked(idx, dv, data)
	present := e.chunks[idx] != nil
	e.mu.RUnlock()
	if !ok {
		return ErrStale
	}
	if present || n == 0 {
		return nil // cached already, or zeros past a local truncation
	}
	if err := e.c.reserve(charge(n)); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	n2, keep, ok := e.admitShapeLocked(idx, dv, data)
	switch {
	case e.gone || !ok || n2 != n:
		e.c.release(charge(n))
		return ErrStale
	case e.chunks[idx] != nil || n2 == 0:
		e.c.release(charge(n))
		return nil
	}
	if e.mem == nil && isZero(data[:keep]) {
		// A hole at the server stays one in the cache file: a sparse file
		// takes no room, and SEEK_HOLE finds its holes (SeekData).
		e.punch(idx, n)
	} else if err := e.writeLocked(data[:keep], idx*e.c.cs, true); err != nil {
		e.c.release(charge(n))
		if errors.Is(err, ErrNoSpace) {
			e.punch(idx, n) // what the write took before it failed
		}
		return err
	}
	ch := &chunk{e: e, idx: idx, n: n, crc: chunkindex.Checksum(data[:keep])}
	e.chunks[idx] = ch
	e.c.stats.chunks.Add(1)
	if keep < n {
		// Server bytes up to a local truncation point, zeros after: this
		// chunk is local state until the truncation is stored.
		ch.dirty = true
		e.c.markPending(e)
		return nil
	}
	e.c.mu.Lock()
	e.c.pushLocked(ch)
	e.c.pending[e] = true
	e.c.mu.Unlock()
	return nil
}

// admitShapeLocked checks fetched data against the entry: the chunk's
// length n, and how many bytes of data to keep (fewer when a local
// truncation point falls inside the chunk; none when the chunk lies wholly
// past it, where the file reads as zeros until the truncation is stored).
func (e *Entry) admitShapeLocked(idx int64, dv uint64, data []byte) (n, keep int64, ok bool) {
	if !e.hasSt || e.st.DataVersion != dv {
		return 0, 0, false
	}
	start := idx * e.c.cs
	if e.cut >= 0 && e.cut <= start {
		return 0, 0, true
	}
	n = e.chunkLen(idx, e.st.Size)
	if e.cut >= 0 && e.cut < start+n {
		keep = e.cut - start
		return n, keep, int64(len(data)) >= keep
	}
	return n, n, n > 0 && int64(len(data)) == n
}

// WriteAt writes local data. Chunks it covers only in part must be present
// already or lie wholly past the file's data (ErrMiss otherwise: fetch them
// and retry). Touched chunks become dirty, pinned until Cleaned. Writing
// past the end leaves zeros between, as a local truncation does.
func (e *Entry) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("cache: negative offset")
	}
	if len(p) == 0 {
		return 0, nil
	}
	end := off + int64(len(p))
	if err := e.checkBefore(off, end); err != nil {
		return 0, err
	}
	var reserved int64
	defer func() { e.c.release(reserved) }()
	for attempt := 0; ; attempt++ {
		e.mu.RLock()
		need, err := e.writeCostLocked(off, end)
		e.mu.RUnlock()
		if err != nil {
			return 0, err
		}
		if need > reserved {
			if err := e.c.reserve(need - reserved); err != nil {
				return 0, err
			}
			reserved = need
		}
		e.mu.Lock()
		need, err = e.writeCostLocked(off, end)
		if err != nil || need > reserved {
			e.mu.Unlock()
			if err != nil {
				return 0, err
			}
			if attempt > 8 {
				return 0, ErrNoSpace
			}
			continue
		}
		err = e.applyWriteLocked(p, off, end)
		if err == nil {
			reserved -= need
		}
		e.mu.Unlock()
		if err != nil {
			return 0, err
		}
		return len(p), nil
	}
}

// checkBefore checks the chunks a write of [off, end) keeps bytes of (the
// chunks it covers in part, the last chunk it extends) against their
// checksums if an earlier process recorded them: once written a chunk is
// local state, never checked again, so a flipped bit merged into it would
// be stored. A bad one is dropped (ErrMiss: fetch it and retry).
func (e *Entry) checkBefore(off, end int64) error {
	cs := e.c.cs
	e.mu.RLock()
	var bad []*chunk
	check := func(idx int64) {
		if ch := e.chunks[idx]; ch != nil && !e.checkedLocked(ch) {
			bad = append(bad, ch)
		}
	}
	check(off / cs)
	check((end - 1) / cs)
	if size := int64(e.st.Size); size > 0 && (size-1)/cs < off/cs {
		check((size - 1) / cs)
	}
	e.mu.RUnlock()
	for _, ch := range bad {
		e.dropCorrupt(ch)
	}
	if len(bad) > 0 {
		return ErrMiss
	}
	return nil
}

// writeCostLocked checks a write's preconditions and returns the extra
// space it needs.
func (e *Entry) writeCostLocked(off, end int64) (int64, error) {
	if e.gone {
		return 0, fmt.Errorf("cache: %v was dropped", e.fid)
	}
	if !e.hasSt {
		return 0, ErrMiss
	}
	cs := e.c.cs
	size := int64(e.st.Size)
	newSize := uint64(max(size, end))
	var need int64
	for idx := off / cs; idx*cs < end; idx++ {
		ch := e.chunks[idx]
		n := e.chunkLen(idx, newSize)
		if ch != nil {
			need += charge(n) - charge(ch.n)
			continue
		}
		cstart := idx * cs
		within := min(cstart+cs, size) // the chunk's bytes that exist now
		if cstart < size && !(off <= cstart && end >= within) && !e.readableLocked(idx) {
			return 0, ErrMiss
		}
		need += charge(n)
	}
	// Growing the last chunk before off as the file extends.
	if last := (size - 1) / cs; size > 0 && last < off/cs {
		if ch := e.chunks[last]; ch != nil {
			need += charge(e.chunkLen(last, newSize)) - charge(ch.n)
		}
	}
	return need, nil
}

func (e *Entry) applyWriteLocked(p []byte, off, end int64) error {
	cs := e.c.cs
	size := int64(e.st.Size)
	if off > size && (e.cut < 0 || size < e.cut) {
		e.cut = size // the gap reads as zeros, as after a truncation
	}
	if err := e.writeLocked(p, off, false); err != nil {
		return err
	}
	newSize := uint64(max(size, end))
	if last := (size - 1) / cs; size > 0 && last < off/cs {
		if ch := e.chunks[last]; ch != nil {
			e.dirtyChunkLocked(ch)
			ch.n = e.chunkLen(last, newSize)
		}
	}
	for idx := off / cs; idx*cs < end; idx++ {
		ch := e.chunks[idx]
		if ch == nil {
			ch = &chunk{e: e, idx: idx}
			e.chunks[idx] = ch
			e.c.stats.chunks.Add(1)
		}
		e.dirtyChunkLocked(ch)
		ch.n = e.chunkLen(idx, newSize)
	}
	e.st.Size = newSize
	e.setDirtyLocked(addRange(e.dirty, Range{off, end - off}))
	e.c.markPending(e)
	return nil
}

// dirtyChunkLocked pins a chunk: off the LRU until Cleaned.
func (e *Entry) dirtyChunkLocked(ch *chunk) {
	if ch.dirty {
		return
	}
	ch.dirty = true
	ch.unchecked.Store(false) // local state now: its checksum is made at Cleaned
	e.c.mu.Lock()
	e.c.unlinkLocked(ch)
	e.c.mu.Unlock()
}

// Truncate changes the size locally; the next store carries it. A chunk
// cut in the middle must be present (ErrMiss otherwise).
func (e *Entry) Truncate(size int64) error {
	if size < 0 {
		return errors.New("cache: negative size")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.hasSt {
		return ErrMiss
	}
	cs := e.c.cs
	old := int64(e.st.Size)
	if size < old && size%cs != 0 && !e.readableLocked(size/cs) {
		return ErrMiss
	}
	if ch := e.chunks[size/cs]; size < old && ch != nil && !e.checkedLocked(ch) {
		// The chunk cut in the middle keeps its first part, which must be
		// the server's bytes: fetched again (checkBefore).
		e.dropLocked(ch)
		e.c.stats.corrupt.Add(1)
		return ErrMiss
	}
	if size < old {
		for idx, ch := range e.chunks {
			if n := e.chunkLen(idx, uint64(size)); n == 0 {
				e.dropLocked(ch)
			} else if n < ch.n {
				e.dirtyChunkLocked(ch)
				e.c.release(charge(ch.n) - charge(n))
				ch.n = n
			}
		}
		e.setDirtyLocked(clip(e.dirty, size))
	}
	if point := min(size, old); e.cut < 0 || point < e.cut {
		e.cut = point
	}
	e.st.Size = uint64(size)
	e.resizeFileLocked(size)
	e.c.markPending(e)
	return nil
}

// Cut is the lowest size truncated to since the last store.
func (e *Entry) Cut() (int64, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.cut, e.cut >= 0
}

// Dirty returns the unstored byte ranges, sorted and merged.
func (e *Entry) Dirty() []Range {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return append([]Range(nil), e.dirty...)
}

// DirtyBytes is the total length of the unstored ranges.
func (e *Entry) DirtyBytes() int64 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.dirtyLen
}

// setDirtyLocked makes rs the unstored ranges, keeping their total, and
// the cache's, current: the flusher reads the cache's at every new dirty
// file, so it must not be a walk over them all.
func (e *Entry) setDirtyLocked(rs []Range) {
	var n int64
	for _, r := range rs {
		n += r.Len
	}
	e.c.dirtyBytes.Add(n - e.dirtyLen)
	e.dirty, e.dirtyLen = rs, n
}

// Cleaned records that stored reached the server, which answered st: those
// ranges stop being dirty, chunks with nothing dirty left are checksummed
// and become evictable, the truncation point is cleared, and the status
// becomes st with the chunks kept.
func (e *Entry) Cleaned(stored []Range, st node.Status) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range stored {
		e.setDirtyLocked(subRange(e.dirty, r))
	}
	e.cut = -1
	e.resizeLocked(st.Size)
	e.st, e.hasSt = st, true
	cs := e.c.cs
	var buf []byte // as long as the longest chunk to checksum: a small file's store allocates little
	for idx, ch := range e.chunks {
		if !ch.dirty || overlaps(e.dirty, Range{idx * cs, cs}) {
			continue
		}
		if int64(len(buf)) < ch.n {
			buf = make([]byte, ch.n)
		}
		// The bound on open cache files may have closed this one since
		// it was written (maxOpen): thousands of files wait for the
		// write-back at once.
		if err := e.openFileLocked(); err != nil {
			return err
		}
		n, err := e.readLocked(buf[:ch.n], idx*cs)
		if err != nil {
			return err
		}
		ch.crc, ch.dirty = chunkindex.Checksum(buf[:n]), false
		e.c.mu.Lock()
		e.c.pushLocked(ch)
		e.c.mu.Unlock()
	}
	e.c.markPending(e)
	return nil
}

// Invalidate drops the clean chunks, keeping local writes.
func (e *Entry) Invalidate() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.clearLocked(false)
	return nil
}

// Discard drops everything, local writes included, and the status: the
// caller has saved what it needed.
func (e *Entry) Discard() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.clearLocked(true)
	e.setDirtyLocked(nil)
	e.cut, e.hasSt, e.st = -1, false, node.Status{}
	e.resizeFileLocked(0)
	e.c.markPending(e)
}

// SetPolicy sets a persistent per-file field; "" deletes it.
func (e *Entry) SetPolicy(key, value string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if value == "" {
		delete(e.policy, key)
	} else {
		if e.policy == nil {
			e.policy = map[string]string{}
		}
		e.policy[key] = value
	}
	e.c.markPending(e)
	return nil
}

// Policy returns a per-file field.
func (e *Entry) Policy(key string) string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.policy[key]
}

func (e *Entry) recordLocked() *record {
	r := &record{st: e.st, hasSt: e.hasSt, cut: e.cut, dirty: e.dirty, policy: e.policy}
	for _, ch := range e.chunks {
		r.chunks = append(r.chunks, chunkRecord{idx: ch.idx, n: ch.n, crc: ch.crc, dirty: ch.dirty})
	}
	sort.Slice(r.chunks, func(i, j int) bool { return r.chunks[i].idx < r.chunks[j].idx })
	return r
}

// --- byte range sets (sorted, merged) ---

func addRange(rs []Range, r Range) []Range {
	all := append(append([]Range(nil), rs...), r)
	sort.Slice(all, func(i, j int) bool { return all[i].Off < all[j].Off })
	out := all[:1]
	for _, x := range all[1:] {
		last := &out[len(out)-1]
		if x.Off <= last.Off+last.Len {
			last.Len = max(last.Len, x.Off+x.Len-last.Off)
		} else {
			out = append(out, x)
		}
	}
	return out
}

func subRange(rs []Range, r Range) []Range {
	var out []Range
	start, end := r.Off, r.Off+r.Len
	for _, x := range rs {
		xe := x.Off + x.Len
		if xe <= start || x.Off >= end {
			out = append(out, x)
			continue
		}
		if x.Off < start {
			out = append(out, Range{x.Off, start - x.Off})
		}
		if xe > end {
			out = append(out, Range{end, xe - end})
		}
	}
	return out
}

func clip(rs []Range, size int64) []Range {
	var out []Range
	for _, x := range rs {
		if x.Off >= size {
			break
		}
		out = append(out, Range{x.Off, min(x.Len, size-x.Off)})
	}
	return out
}

func overlaps(rs []Range, r Range) bool {
	for _, x := range rs {
		if x.Off < r.Off+r.Len && r.Off < x.Off+x.Len {
			return true
		}
	}
	return false
}

// Rescan finds writes made to the cache file behind the cache's back (a
// FUSE passthrough writer: the kernel writes the file itself): chunks whose
// checksum or length changed, and chunks past the old end, become dirty.
// The file must have been complete when the writer opened it.
func (e *Entry) Rescan() error {
	if e.mem != nil {
		return nil
	}
	for attempt := 0; ; attempt++ {
		e.mu.RLock()
		size, need, err := e.rescanCostLocked()
		e.mu.RUnlock()
		if err != nil {
			return err
		}
		if err := e.c.reserve(need); err != nil {
			return err
		}
		e.mu.Lock()
		size2, need2, err := e.rescanCostLocked()
		if err != nil || size2 != size || need2 > need {
			e.mu.Unlock()
			e.c.release(need)
			if err != nil || attempt > 8 {
				return cmpErr(err, ErrNoSpace)
			}
			continue
		}
		err = e.rescanLocked(size)
		e.mu.Unlock()
		e.c.release(need - need2)
		return err
	}
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// rescanCostLocked returns the file's current size and the space its new
// and grown chunks need.
func (e *Entry) rescanCostLocked() (int64, int64, error) {
	if err := e.openFileLocked(); err != nil {
		return 0, 0, err
	}
	fi, err := e.file.Stat()
	if err != nil {
		return 0, 0, err
	}
	size := fi.Size()
	var need int64
	for idx := int64(0); idx*e.c.cs < size; idx++ {
		n := e.chunkLen(idx, uint64(size))
		if ch := e.chunks[idx]; ch != nil {
			need += max(0, charge(n)-charge(ch.n))
		} else {
			need += charge(n)
		}
	}
	return size, need, nil
}

func (e *Entry) rescanLocked(size int64) error {
	cs := e.c.cs
	old := int64(e.st.Size)
	if size < old {
		for idx, ch := range e.chunks {
			if e.chunkLen(idx, uint64(size)) == 0 {
				e.dropLocked(ch)
			}
		}
		e.setDirtyLocked(clip(e.dirty, size))
		if e.cut < 0 || size < e.cut {
			e.cut = size
		}
	}
	buf := make([]byte, cs)
	for idx := int64(0); idx*cs < size; idx++ {
		n := e.chunkLen(idx, uint64(size))
		if _, err := e.file.ReadAt(buf[:n], idx*cs); err != nil && err != io.EOF {
			return err
		}
		ch := e.chunks[idx]
		if ch != nil && !ch.dirty && ch.n == n && chunkindex.Checksum(buf[:n]) == ch.crc {
			continue
		}
		if ch == nil {
			ch = &chunk{e: e, idx: idx}
			e.chunks[idx] = ch
			e.c.stats.chunks.Add(1)
		}
		e.dirtyChunkLocked(ch)
		if n < ch.n {
			e.c.release(charge(ch.n) - charge(n))
		}
		ch.n = n
		e.setDirtyLocked(addRange(e.dirty, Range{idx * cs, n}))
	}
	e.st.Size = uint64(size)
	e.c.markPending(e)
	return nil
}

// zeroBuf is what isZero compares with, a memcmp at a time.
var zeroBuf [64 << 10]byte

// isZero reports whether p holds only zeros.
func isZero(p []byte) bool {
	for len(p) > 0 {
		k := min(len(p), len(zeroBuf))
		if !bytes.Equal(p[:k], zeroBuf[:k]) {
			return false
		}
		p = p[k:]
	}
	return true
}

// SeekData is lseek's SEEK_DATA or SEEK_HOLE (whence) from off in a file
// the cache holds whole: its cache file is sparse where the file is (holes
// fetched are kept as holes, and local truncations make them), so the
// file system under the cache answers. ErrMiss when the cache cannot
// tell: part of the file is not cached, or the cache is in memory or
// encrypted.
func (e *Entry) SeekData(off int64, whence int) (int64, error) {
	if e.mem != nil || e.c.sealer != nil || !e.Complete() {
		return 0, ErrMiss
	}
	f, err := os.Open(e.path())
	if err != nil {
		return 0, ErrMiss
	}
	defer f.Close()
	// The cache file ends at its last byte written: holes at the end of
	// the file may be missing from it.
	if fi, err := f.Stat(); err == nil && off >= fi.Size() {
		if whence == unix.SEEK_HOLE {
			return off, nil
		}
		return 0, syscall.ENXIO
	}
	return unix.Seek(int(f.Fd()), off, whence)
}
