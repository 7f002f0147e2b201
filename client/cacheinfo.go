package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/callback"
	"slices"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/node"
)

// What `hoard cache ls`, `warmup`, `evict` and `flush` ask of a mount's
// client, per file: what the cache holds and why, as OpenAFS's fs
// getcacheparms and CernVM-FS's cvmfs_talk tell of theirs, but per read
// path.

// FileCache is what the cache holds of one file, and the rule that
// decides whether its reads go through the cache.
type FileCache struct {
	Size        int64 `json:"size"`
	Cached      int64 `json:"cached"`
	Chunks      int64 `json:"chunks"`
	ChunksTotal int64 `json:"chunks_total"`
	Dirty       int64 `json:"dirty"`
	// Policy is cache or bypass; Why the rule that chose it; Probation
	// that auto bypasses it until it is read at random or again.
	Policy    string `json:"policy"`
	Why       string `json:"why"`
	Probation bool   `json:"probation,omitempty"`
	// PromiseMs is how long the server's promise to tell of a change
	// (the callback) still holds; 0: none, the next open asks.
	PromiseMs int64 `json:"promise_ms"`
	// Delegation is the delegation held on it: read, write or "".
	Delegation string `json:"delegation,omitempty"`
	// CacheSize and CacheUsed are the whole cache's: a warmup larger than
	// the cache would evict its own first files.
	CacheSize int64 `json:"cache_size"`
	CacheUsed int64 `json:"cache_used"`
}

// CacheInfo reports what the cache holds of file n, opened as base in
// parent (nil when unknown), as k's user sees it.
func (k *Nodes) CacheInfo(n *Node, parent *Node, base string) (FileCache, error) {
	d, err := k.Policy(n, parent, base)
	if err != nil {
		return FileCache{}, err
	}
	c := n.c
	st := n.status()
	fc := FileCache{Size: int64(st.Size), Policy: "cache", Why: d.Why, Probation: d.Probation,
		CacheSize: c.cache.Size(), CacheUsed: c.cache.Used()}
	if d.Bypass {
		fc.Policy = "bypass"
	}
	if st.Type != node.TypeFile || n.entry == nil {
		return fc, nil
	}
	cs := c.cache.ChunkSize()
	fc.ChunksTotal = c.chunks(st.Size)
	for idx := range fc.ChunksTotal {
		if n.entry.Present(idx) {
			fc.Chunks++
			fc.Cached += min(cs, fc.Size-idx*cs)
		}
	}
	fc.Dirty = n.entry.DirtyBytes()
	now := time.Now()
	at := n.at()
	at.Table(func(cb *callback.Client) {
		if t, ok := cb.Expiry(n.fid); ok && t.After(now) {
			fc.PromiseMs = t.Sub(now).Milliseconds()
		}
		if h, ok := cb.Delegation(n.fid, now); ok {
			fc.Delegation = h.Kind.String()
		}
	})
	return fc, nil
}

// warmBatch is how many chunks a warmup fetches at once: enough to keep
// a distant server's pipe full, few enough to stop soon when cancelled.
const warmBatch = 8

// ErrCacheFull says a warmup stopped because the cache holds nothing more
// it may evict for the file.
var ErrCacheFull = errors.New("the cache is full: nothing more can be evicted for it")

// Warm brings the whole of file n into the cache as k's user, whatever
// its policy (the caller decides whether a bypassed file is warmed), and
// calls progress with the bytes of each batch of chunks as they land. It
// stops, with ctx's error, between batches once ctx is done; what it
// fetched stays cached.
func (k *Nodes) Warm(ctx context.Context, n *Node, name string, progress func(int64)) error {
	for attempt := 0; ; attempt++ {
		err := k.warm(ctx, n, name, progress)
		if errors.Is(err, cache.ErrStale) && attempt < 3 {
			continue // the file changed under the fetch: again, at the new version
		}
		return err
	}
}

func (k *Nodes) warm(ctx context.Context, n *Node, name string, progress func(int64)) error {
	st, err := n.c.fresh(n, k.u)
	if err != nil {
		return err
	}
	if st.Type != node.TypeFile || n.entry == nil {
		return fmt.Errorf("warm %v: %w", n.fid, syscall.EISDIR)
	}
	n.named(name, false)
	cs := n.c.cache.ChunkSize()
	size := int64(st.Size)
	missing := n.entry.Missing(0, size)
	for len(missing) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch := missing[:min(warmBatch, len(missing))]
		missing = missing[len(batch):]
		mem, err := n.fetch(batch, true, k.u)
		if err != nil {
			return err
		}
		if len(mem) > 0 {
			return ErrCacheFull
		}
		var got int64
		for _, idx := range batch {
			got += min(cs, size-idx*cs)
		}
		progress(got)
	}
	if est, ok := n.entry.Status(); ok && est.DataVersion != st.DataVersion {
		return cache.ErrStale
	}
	return nil
}

// named remembers name, n's path in the cell, with its cache entry where
// none is yet (replace: the one before, for a writer): lost/ reports the
// writes a crash strands by it, and a status page names a cached file by
// it when no kernel holds an inode of it (a warmup's, an earlier
// mount's). Once per file: a warm open costs a read lock, no write.
func (n *Node) named(name string, replace bool) {
	if n.entry == nil || name == "" {
		return
	}
	if p := n.entry.Policy("path"); p != name && (replace || p == "") {
		n.entry.SetPolicy("path", name)
	}
}

// Evict drops what the cache holds of file n but its local writes, which
// stay until they are stored.
func (k *Nodes) Evict(n *Node) error {
	if n.entry == nil {
		return nil
	}
	return n.entry.Invalidate()
}

// LargestCached lists the n files holding the most space in the cache,
// most first (cache.Cache.Largest): for a status page, not a hot path.
func (k *Nodes) LargestCached(n int) []cache.Usage { return k.c.cache.Largest(n) }

// DirtyFile is a file with writes not yet stored at its server.
type DirtyFile struct {
	Path  string `json:"path"`
	Dirty int64  `json:"dirty"`
}

// mine reports whether n's unstored writes are k's user's to see and to
// flush: the client's own user (a mount's owner) answers for all of them,
// any other user only for the writes they made, as the rest of a shared
// mount keeps users apart.
func (k *Nodes) mine(n *Node) bool {
	return k.u.Key() == k.c.self.Key() || n.c.writerOf(n).Key() == k.u.Key()
}

// DirtyFiles lists the files with writes not yet stored that are k's
// user's (mine), at every server of the cell this client reaches, most
// dirty bytes first.
func (k *Nodes) DirtyFiles() []DirtyFile {
	var fs []DirtyFile
	for _, d := range k.c.flusher.Files() {
		if b := d.n.entry.DirtyBytes(); b > 0 && k.mine(d.n) {
			fs = append(fs, DirtyFile{Path: d.n.entry.Policy("path"), Dirty: b})
		}
	}
	slices.SortFunc(fs, func(a, b DirtyFile) int { return cmp.Compare(b.Dirty, a.Dirty) })
	return fs
}

// Refusal is a file whose writes a flush could not store: the server
// refused them (quota, rights, size), and they were kept in lost/.
type Refusal struct {
	Path  string `json:"path"`
	Dirty int64  `json:"dirty"`
	Err   string `json:"err"`
}

// FlushAll stores the writes of every file of k's user's (mine) now
// rather than when write-back would. A file whose store fails for a while
// stays dirty, for DirtyFiles to show; those the server refused, and
// lost/ kept, are returned.
func (k *Nodes) FlushAll() []Refusal {
	type was struct {
		n      *Node
		losses uint64
		dirty  int64
	}
	var files []was
	for _, d := range k.c.flusher.Files() {
		if k.mine(d.n) {
			files = append(files, was{d.n, d.n.lossCount(), d.n.entry.DirtyBytes()})
		}
	}
	if k.u.Key() == k.c.self.Key() {
		k.c.flusher.Drain(dirtyNode{})
	} else {
		for _, f := range files {
			dirtyNode{f.n}.Store(false)
		}
	}
	var out []Refusal
	for _, f := range files {
		if err := f.n.lostSince(f.losses); err != nil {
			out = append(out, Refusal{Path: f.n.entry.Policy("path"), Dirty: f.dirty, Err: err.Error()})
		}
	}
	return out
}
