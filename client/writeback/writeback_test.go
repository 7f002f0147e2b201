package writeback

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/poll"
)

// file is a dirty file of the tests.
type file struct {
	name    string
	w       *world
	bytes   int64
	since   time.Time
	writing bool
	busy    bool // a writer holds it
	fail    error
}

// world holds the files and records the stores, in order.
type world struct {
	mu     sync.Mutex
	stored []string
	// gate, when set, holds every store until closed.
	gate chan struct{}
	in   atomic.Int32
	// files are the dirty files DirtyBytes counts (set); bytes is what
	// the flusher reported stored.
	files []*file
	bytes atomic.Int64
}

func (f *file) Dirty() (int64, time.Time, bool) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	return f.bytes, f.since, f.writing
}

func (f *file) Store(try bool) error {
	f.w.in.Add(1)
	if f.w.gate != nil {
		<-f.w.gate
	}
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if try && f.busy {
		return ErrBusy
	}
	if f.fail != nil {
		return f.fail
	}
	f.w.stored = append(f.w.stored, f.name)
	f.bytes, f.since = 0, time.Time{}
	return nil
}

// set makes fs the world's files.
func (w *world) set(fs ...*file) {
	w.mu.Lock()
	w.files = fs
	w.mu.Unlock()
}

func (w *world) total() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var t int64
	for _, f := range w.files {
		t += f.bytes
	}
	return t
}

// flusher with hidirty 1000 bytes: lodirty 500, start 750.
func newTest(w *world) *Flusher[*file] {
	return New[*file](Config{Age: 30 * time.Second, Window: 2,
		Hi:         func() int64 { return 1000 },
		DirtyBytes: w.total,
		Stored:     func(b int64) { w.bytes.Add(b) }})
}

var t0 = time.Unix(1_000_000, 0)

func TestPassStoresWhatIsTooOld(t *testing.T) {
	w := &world{}
	fl := newTest(w)
	old := &file{name: "old", w: w, bytes: 10, since: t0}
	young := &file{name: "young", w: w, bytes: 10, since: t0.Add(20 * time.Second)}
	never := &file{name: "no bound", w: w, bytes: 10}
	w.set(old, young, never)
	for _, f := range w.files {
		fl.Add(f)
	}
	fl.Pass(t0.Add(29 * time.Second))
	if len(w.stored) != 0 {
		t.Fatalf("stored %v before the age bound", w.stored)
	}
	fl.Pass(t0.Add(30 * time.Second))
	if len(w.stored) != 1 || w.stored[0] != "old" || w.bytes.Load() != 10 {
		t.Fatalf("stored %v (%d bytes) at the age bound, want old", w.stored, w.bytes.Load())
	}
}

// Above the start threshold the flusher stores until the dirty bytes are
// under lodirty: files not open for writing first, oldest first.
func TestPassStoresDownToLodirty(t *testing.T) {
	w := &world{}
	fl := newTest(w)
	a := &file{name: "writing, oldest", w: w, bytes: 300, since: t0, writing: true}
	b := &file{name: "closed, newer", w: w, bytes: 300, since: t0.Add(2 * time.Second)}
	c := &file{name: "closed, older", w: w, bytes: 300, since: t0.Add(time.Second)}
	w.set(a, b, c)
	for _, f := range w.files {
		fl.Add(f)
	}
	fl.Pass(t0.Add(3 * time.Second)) // 900 > 750: down to 500
	if len(w.stored) != 2 || !contains(w.stored, c.name) || !contains(w.stored, b.name) {
		t.Fatalf("stored %v, want the two closed files", w.stored)
	}
	if w.total() > 500 {
		t.Fatalf("%d dirty bytes left, over lodirty", w.total())
	}
	w.stored = nil
	fl.Pass(t0.Add(4 * time.Second))
	if len(w.stored) != 0 {
		t.Fatalf("stored %v below the start threshold", w.stored)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// A drain for a writer that found the cache full skips the writer's own
// file and any other a writer holds; Close's drain waits for them.
func TestDrain(t *testing.T) {
	w := &world{}
	fl := newTest(w)
	own := &file{name: "own", w: w, bytes: 1}
	held := &file{name: "held", w: w, bytes: 1, busy: true}
	free := &file{name: "free", w: w, bytes: 1}
	w.set(own, held, free)
	for _, f := range w.files {
		fl.Add(f)
	}
	if !fl.Drain(own) {
		t.Fatal("a drain that stored a file said none came out clean")
	}
	if len(w.stored) != 1 || w.stored[0] != "free" {
		t.Fatalf("a writer's drain stored %v, want only the free file", w.stored)
	}
	w.stored = nil
	fl.Drain(nil)
	if !contains(w.stored, "own") || !contains(w.stored, "held") {
		t.Fatalf("close's drain stored %v, want every file", w.stored)
	}
}

// A file being stored is not picked again by a pass meanwhile, and a file
// whose store failed stays on the list for the next one.
func TestNoFileStoredTwiceAtOnce(t *testing.T) {
	w := &world{gate: make(chan struct{})}
	fl := newTest(w)
	f := &file{name: "f", w: w, bytes: 5, since: t0}
	w.set(f)
	fl.Add(f)
	done := make(chan struct{})
	go func() { fl.Pass(t0.Add(time.Hour)); close(done) }()
	for w.in.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	fl.Pass(t0.Add(time.Hour)) // f is being stored: not again
	close(w.gate)
	<-done
	if w.in.Load() != 1 {
		t.Fatalf("%d stores of one file at once", w.in.Load())
	}
	fl.Remove(f)
	if len(fl.Files()) != 0 {
		t.Fatal("a removed file is still listed")
	}
	bad := &file{name: "bad", w: w, bytes: 5, since: t0, fail: context.DeadlineExceeded}
	w.set(bad)
	fl.Add(bad)
	fl.Pass(t0.Add(time.Hour))
	if got := fl.Files(); len(got) != 1 || got[0] != bad {
		t.Fatalf("a file whose store failed left the list: %v", got)
	}
}

// Add wakes the flusher once the dirty bytes pass the start threshold,
// and Halt stops its loop.
func TestRunWakesAboveStart(t *testing.T) {
	w := &world{}
	fl := newTest(w)
	small := &file{name: "small", w: w, bytes: 100}
	big := &file{name: "big", w: w, bytes: 800}
	w.set(small, big)
	ran := make(chan struct{})
	go func() { fl.Run(context.Background(), nil); close(ran) }()
	fl.Add(small)
	fl.Add(big) // 900 > 750
	poll.Wait(t, 5*time.Second, "the flusher woken by passing the start threshold", func() bool { return w.bytes.Load() != 0 })
	fl.Halt()
	<-ran
}
