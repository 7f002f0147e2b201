package client

import (
	"errors"
	"sort"
	"sync"
	"time"
)

// The write-back flusher: dirty data made under write delegations is
// stored in the background, not on the application's Close. Like
// FreeBSD's buffer daemon (the cacheDAFS thesis §3.4.2) it starts when the dirty
// bytes pass the midpoint of lodirty and hidirty (hidirty = a quarter of
// the cache + 20 chunks, lodirty = hidirty/2) and stores until they are
// under lodirty, files not open for writing first; independently, data
// dirty for longer than the age bound is stored, so a client crash loses
// a bounded window (Sprite's 30 s). The thresholds count bytes, not
// chunks: a tree of small files would otherwise pass them at a few
// megabytes, and be stored file by file while it is still being written.

// Flusher defaults.
const (
	defaultFlushAge    = 30 * time.Second
	defaultFlushWindow = 16
)

type flusher struct {
	c    *Client
	kick chan struct{}
	// halted stops the background passes (halt); stopped closes when the
	// loop has returned.
	halted   chan struct{}
	haltOnce sync.Once
	stopped  chan struct{}

	mu    sync.Mutex
	dirty map[*Node]bool // true while being stored
}

func newFlusher(c *Client) *flusher {
	return &flusher{c: c, kick: make(chan struct{}, 1), halted: make(chan struct{}), stopped: make(chan struct{}), dirty: map[*Node]bool{}}
}

// add puts n on the dirty list and wakes the flusher when it has work.
func (f *flusher) add(n *Node) {
	f.mu.Lock()
	_, known := f.dirty[n]
	if !known {
		f.dirty[n] = false
	}
	f.mu.Unlock()
	if !known && f.c.cache.DirtyBytes() > f.start() {
		f.wake()
	}
}

func (f *flusher) remove(n *Node) {
	f.mu.Lock()
	delete(f.dirty, n)
	f.mu.Unlock()
}

func (f *flusher) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Thresholds in bytes: hidirty, lodirty, and where flushing starts.
func (f *flusher) hi() int64    { return f.c.cache.Size()/4 + 20*f.c.cache.ChunkSize() }
func (f *flusher) lo() int64    { return f.hi() / 2 }
func (f *flusher) start() int64 { return (f.hi() + f.lo()) / 2 }

// nodes lists the dirty files not being stored now.
func (f *flusher) nodes() []*Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*Node, 0, len(f.dirty))
	for n, busy := range f.dirty {
		if !busy {
			out = append(out, n)
		}
	}
	return out
}

func (f *flusher) all() []*Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	ns := make([]*Node, 0, len(f.dirty))
	for n := range f.dirty {
		ns = append(ns, n)
	}
	return ns
}

// run is the flusher's loop: a pass at every wake-up and once a second.
func (f *flusher) run() {
	defer f.c.wg.Done()
	defer close(f.stopped)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-f.c.ctx.Done():
			return
		case <-f.halted:
			return
		case <-f.kick:
		case <-t.C:
		}
		f.pass(time.Now())
	}
}

// pass stores what is too old, then, above the start threshold, what it
// takes to get under lodirty.
func (f *flusher) pass(now time.Time) {
	ns := f.nodes()
	type cand struct {
		n     *Node
		since time.Time
		open  bool
		size  int64
	}
	cands := make([]cand, 0, len(ns))
	var total int64
	for _, n := range ns {
		n.mu.Lock()
		c := cand{n: n, since: n.dirtySince, open: n.opens.w > 0}
		n.mu.Unlock()
		c.size = n.entry.DirtyBytes()
		total += c.size
		cands = append(cands, c)
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].open != cands[j].open {
			return !cands[i].open
		}
		return cands[i].since.Before(cands[j].since)
	})
	var pick []*Node
	over := total > f.start()
	for _, c := range cands {
		aged := !c.since.IsZero() && now.Sub(c.since) >= f.c.flushAge
		if aged || over && total > f.lo() {
			pick = append(pick, c.n)
			total -= c.size
		}
	}
	f.store(pick, false)
}

// store stores the files ns, up to the window at a time, and reports
// whether any of them came out clean. With try, files whose lock is taken
// are skipped: a writer that drains holds its own file's lock, and two of
// them must not wait for each other.
func (f *flusher) store(ns []*Node, try bool) bool {
	sem := make(chan struct{}, defaultFlushWindow)
	var wg sync.WaitGroup
	var mu sync.Mutex
	cleaned := false
	for _, n := range ns {
		f.mu.Lock()
		busy, ok := f.dirty[n]
		if ok && !busy {
			f.dirty[n] = true
		}
		f.mu.Unlock()
		if !ok || busy {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			bytes := n.entry.DirtyBytes()
			var err error
			if try && !n.wmu.TryLock() {
				err = errBusy
			} else {
				if !try {
					n.wmu.Lock()
				}
				err = f.c.storeBack(n, true)
				n.wmu.Unlock()
			}
			f.mu.Lock()
			if _, still := f.dirty[n]; still {
				f.dirty[n] = false
			}
			f.mu.Unlock()
			if err != nil {
				if !kept(err) {
					f.c.log.Debug("flusher: store failed; will retry", "fid", n.fid, "err", err)
				}
				return
			}
			f.c.counters.flushed.Add(bytes)
			mu.Lock()
			cleaned = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	return cleaned
}

// drain stores every dirty file but skip (whose writer holds its lock),
// for a writer that found the cache full, and for Close.
func (f *flusher) drain(skip *Node) bool {
	var ns []*Node
	for _, n := range f.nodes() {
		if n != skip {
			ns = append(ns, n)
		}
	}
	return f.store(ns, skip != nil)
}

var errBusy = errors.New("file busy")

// halt stops the background passes and waits for the one under way to
// end: a file that pass is storing is skipped by a drain, and would
// otherwise be left on the list, and taken for one that could not be
// stored, by Close.
func (f *flusher) halt() {
	f.haltOnce.Do(func() { close(f.halted) })
	<-f.stopped
}

// flushAll stores every dirty file, at Close; what could not be stored is
// kept in lost/ and reported.
func (c *Client) flushAll() error {
	c.flusher.halt()
	c.flusher.drain(nil)
	var errs []error
	removes := 0
	for _, n := range c.flusher.all() {
		if n.removedIn.Load() != nil {
			removes++ // no data: the file stays at the server
			continue
		}
		n.wmu.Lock()
		name := n.entry.Policy("path")
		if name == "" {
			name = "fid " + n.fid.String()
		}
		errs = append(errs, c.keepLost(n, name, errors.New("not stored when the client closed (server unreachable)")))
		n.wmu.Unlock()
	}
	if removes > 0 {
		c.log.Warn("files removed here are still at the server: it was unreachable when the client closed", "server", c.opts.Server, "files", removes)
	}
	return errors.Join(errs...)
}
