package cache

import (
	"container/heap"

	"github.com/hoardfs/hoard/node"
)

// Usage is the cache space one file holds.
type Usage struct {
	FID node.FID
	// Path is the file's path as its entry keeps it (the "path" field,
	// SetPolicy), if it does.
	Path string
	// Bytes is the space its chunks take (each rounded up to 4 KiB, as
	// the limit counts them); Dirty the bytes of it not yet stored.
	Bytes, Dirty int64
}

// Largest lists the n files holding the most cache space, most first.
// It visits every entry and chunk (O(entries + chunks), each entry's lock
// taken in turn): for a status page's poll, not a hot path.
func (c *Cache) Largest(n int) []Usage {
	if n <= 0 {
		return nil
	}
	c.mu.Lock()
	es := make([]*Entry, 0, len(c.entries))
	for _, e := range c.entries {
		es = append(es, e)
	}
	c.mu.Unlock()
	// Entry.mu comes before Cache.mu: the entries are read after it is
	// let go.
	top := make(usageHeap, 0, n+1)
	for _, e := range es {
		u := e.usage()
		if u.Bytes == 0 && u.Dirty == 0 {
			continue
		}
		if len(top) < n {
			heap.Push(&top, u)
		} else if u.Bytes > top[0].Bytes {
			top[0] = u
			heap.Fix(&top, 0)
		}
	}
	out := make([]Usage, len(top))
	for i := len(out) - 1; i >= 0; i-- {
		out[i] = heap.Pop(&top).(Usage)
	}
	return out
}

func (e *Entry) usage() Usage {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.gone {
		return Usage{}
	}
	u := Usage{FID: e.fid, Path: e.policy["path"], Dirty: e.dirtyLen}
	for _, ch := range e.chunks {
		u.Bytes += charge(ch.n)
	}
	return u
}

// usageHeap is a min-heap by Bytes: its root is the smallest of the
// largest seen so far.
type usageHeap []Usage

func (h usageHeap) Len() int           { return len(h) }
func (h usageHeap) Less(i, j int) bool { return h[i].Bytes < h[j].Bytes }
func (h usageHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *usageHeap) Push(x any)        { *h = append(*h, x.(Usage)) }
func (h *usageHeap) Pop() any {
	old := *h
	u := old[len(old)-1]
	*h = old[:len(old)-1]
	return u
}
