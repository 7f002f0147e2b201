// Package latency records how long requests take, as histograms with
// fixed buckets, without locks: the client's fetches and stores, the
// server's waits for other clients. Package metrics serves them.
package latency

import (
	"sync/atomic"
	"time"
)

// Bounds are the upper bounds, in seconds, of the buckets: from a fetch
// on loopback to a store that waited out a distant server.
var Bounds = [...]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Histogram is a snapshot of a Recorder: Counts[i] requests took at most
// Bounds[i] and more than the bound before (the rest took longer than
// the last), Count in all, Sum their total time.
type Histogram struct {
	Counts []uint64
	Count  uint64
	Sum    time.Duration
}

// Add adds o's requests to h.
func (h *Histogram) Add(o Histogram) {
	if h.Counts == nil {
		h.Counts = make([]uint64, len(Bounds))
	}
	for i, n := range o.Counts {
		h.Counts[i] += n
	}
	h.Count += o.Count
	h.Sum += o.Sum
}

// Recorder records durations from many goroutines at once. Its zero
// value is ready.
type Recorder struct {
	counts [len(Bounds)]atomic.Uint64
	count  atomic.Uint64
	sum    atomic.Int64
}

// Observe records one request that took d.
func (r *Recorder) Observe(d time.Duration) {
	s := d.Seconds()
	for i, b := range Bounds {
		if s <= b {
			r.counts[i].Add(1)
			break
		}
	}
	r.count.Add(1)
	r.sum.Add(int64(d))
}

// Since records the time since start: defer r.Since(time.Now()).
func (r *Recorder) Since(start time.Time) { r.Observe(time.Since(start)) }

// Snapshot is what r recorded so far.
func (r *Recorder) Snapshot() Histogram {
	h := Histogram{Counts: make([]uint64, len(Bounds)), Count: r.count.Load(), Sum: time.Duration(r.sum.Load())}
	for i := range h.Counts {
		h.Counts[i] = r.counts[i].Load()
	}
	return h
}
