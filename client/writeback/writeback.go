// Package writeback is the client's flusher: writes made under write
// delegations are stored in the background, not on the application's
// Close. Like FreeBSD's buffer daemon (the cacheDAFS thesis §3.4.2) it
// starts when the dirty bytes pass the midpoint of lodirty and hidirty
// and stores until they are under lodirty, files not open for writing
// first; independently, data dirty for longer than the age bound is
// stored, so a client crash loses a bounded window (Sprite's 30 s). The
// thresholds count bytes, not chunks: a tree of small files would
// otherwise pass them at a few megabytes, and be stored file by file
// while it is still being written.
package writeback

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"
)

// File is a file with writes not yet stored, as the flusher sees it.
// Values of F must be comparable: the flusher keys its list by them.
type File interface {
	comparable
	// Dirty reports the file's unstored bytes, when the oldest of them
	// was written (zero: no bound applies), and whether it is open for
	// writing.
	Dirty() (bytes int64, since time.Time, writing bool)
	// Store stores the file's writes. With try it fails at once with
	// ErrBusy when a writer holds the file.
	Store(try bool) error
}

// ErrBusy is Store's answer, with try, for a file a writer holds.
var ErrBusy = errors.New("file busy")

// Config are a flusher's thresholds and reports.
type Config struct {
	// Age bounds how long a write stays unstored; Window is how many
	// files are stored at once.
	Age    time.Duration
	Window int
	// Hi is hidirty in bytes (lodirty is half of it); DirtyBytes is how
	// many unstored bytes there are in all.
	Hi         func() int64
	DirtyBytes func() int64
	// Stored hears of the bytes each successful store cleaned. A store
	// that failed is tried again at the next pass.
	Stored func(bytes int64)
}

// Flusher keeps the list of dirty files and stores them.
type Flusher[F File] struct {
	cfg  Config
	kick chan struct{}
	// halted stops the background passes (Halt); stopped closes when Run
	// has returned.
	halted   chan struct{}
	haltOnce sync.Once
	stopped  chan struct{}

	mu    sync.Mutex
	dirty map[F]bool // true while being stored
}

// New is a flusher with an empty list.
func New[F File](cfg Config) *Flusher[F] {
	return &Flusher[F]{cfg: cfg, kick: make(chan struct{}, 1), halted: make(chan struct{}), stopped: make(chan struct{}), dirty: map[F]bool{}}
}

// Add puts x on the dirty list and wakes the flusher when it has work.
func (f *Flusher[F]) Add(x F) {
	f.mu.Lock()
	_, known := f.dirty[x]
	if !known {
		f.dirty[x] = false
	}
	f.mu.Unlock()
	if !known && f.cfg.DirtyBytes() > f.start() {
		f.Wake()
	}
}

// Remove takes x off the list: it has nothing unstored.
func (f *Flusher[F]) Remove(x F) {
	f.mu.Lock()
	delete(f.dirty, x)
	f.mu.Unlock()
}

// Wake asks for a pass now.
func (f *Flusher[F]) Wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Thresholds in bytes: hidirty, lodirty, and where flushing starts.
func (f *Flusher[F]) hi() int64    { return f.cfg.Hi() }
func (f *Flusher[F]) lo() int64    { return f.hi() / 2 }
func (f *Flusher[F]) start() int64 { return (f.hi() + f.lo()) / 2 }

// idle lists the dirty files not being stored now.
func (f *Flusher[F]) idle() []F {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]F, 0, len(f.dirty))
	for x, busy := range f.dirty {
		if !busy {
			out = append(out, x)
		}
	}
	return out
}

// Files lists every file on the list.
func (f *Flusher[F]) Files() []F {
	f.mu.Lock()
	defer f.mu.Unlock()
	xs := make([]F, 0, len(f.dirty))
	for x := range f.dirty {
		xs = append(xs, x)
	}
	return xs
}

// Run makes a pass at every wake-up and once a tick, until ctx ends or
// Halt.
func (f *Flusher[F]) Run(ctx context.Context, tick <-chan time.Time) {
	defer close(f.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.halted:
			return
		case <-f.kick:
		case <-tick:
		}
		f.Pass(time.Now())
	}
}

// Pass stores what is older than the age bound at now, then, above the
// start threshold, what it takes to get under lodirty.
func (f *Flusher[F]) Pass(now time.Time) {
	xs := f.idle()
	type cand struct {
		x       F
		since   time.Time
		writing bool
		size    int64
	}
	cands := make([]cand, 0, len(xs))
	var total int64
	for _, x := range xs {
		size, since, writing := x.Dirty()
		total += size
		cands = append(cands, cand{x, since, writing, size})
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].writing != cands[j].writing {
			return !cands[i].writing
		}
		return cands[i].since.Before(cands[j].since)
	})
	var pick []F
	over := total > f.start()
	for _, c := range cands {
		aged := !c.since.IsZero() && now.Sub(c.since) >= f.cfg.Age
		if aged || over && total > f.lo() {
			pick = append(pick, c.x)
			total -= c.size
		}
	}
	f.store(pick, false)
}

// store stores the files xs, up to the window at a time, and reports
// whether any of them came out clean. With try, files whose writer holds
// them are skipped: a writer that drains holds its own file, and two of
// them must not wait for each other.
func (f *Flusher[F]) store(xs []F, try bool) bool {
	sem := make(chan struct{}, f.cfg.Window)
	var wg sync.WaitGroup
	var mu sync.Mutex
	cleaned := false
	for _, x := range xs {
		f.mu.Lock()
		busy, ok := f.dirty[x]
		if ok && !busy {
			f.dirty[x] = true
		}
		f.mu.Unlock()
		if !ok || busy {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			bytes, _, _ := x.Dirty()
			err := x.Store(try)
			f.mu.Lock()
			if _, still := f.dirty[x]; still {
				f.dirty[x] = false
			}
			f.mu.Unlock()
			if err != nil {
				return
			}
			f.cfg.Stored(bytes)
			mu.Lock()
			cleaned = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	return cleaned
}

// Drain stores every dirty file but skip (whose writer holds it), for a
// writer that found the cache full (skip: its own file), and for Close
// (the zero F: none). It reports whether any came out clean.
func (f *Flusher[F]) Drain(skip F) bool {
	var zero F
	var xs []F
	for _, x := range f.idle() {
		if x != skip {
			xs = append(xs, x)
		}
	}
	return f.store(xs, skip != zero)
}

// Halt stops the background passes and waits for the one under way to
// end: a file that pass is storing is skipped by a drain, and would
// otherwise be left on the list, and taken for one that could not be
// stored, by Close.
func (f *Flusher[F]) Halt() {
	f.haltOnce.Do(func() { close(f.halted) })
	<-f.stopped
}
