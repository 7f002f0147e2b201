package latency

import (
	"testing"
	"time"
)

func TestRecorder(t *testing.T) {
	var r Recorder
	for _, d := range []time.Duration{100 * time.Microsecond, 500 * time.Microsecond, 3 * time.Millisecond, time.Minute} {
		r.Observe(d)
	}
	h := r.Snapshot()
	// 0.1 ms and 0.5 ms in the first bucket (≤ 0.5 ms), 3 ms in ≤ 5 ms,
	// a minute past the last bound: counted, in no bucket.
	if h.Counts[0] != 2 || h.Counts[3] != 1 || h.Count != 4 || h.Sum != time.Minute+3600*time.Microsecond {
		t.Fatalf("snapshot: %+v", h)
	}
	var sum Histogram
	sum.Add(h)
	sum.Add(h)
	if sum.Counts[0] != 4 || sum.Count != 8 || sum.Sum != 2*h.Sum {
		t.Fatalf("sum of two: %+v", sum)
	}
}
