package harness

import (
	"slices"
	"time"
)

// Timed is how long fn took.
func Timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// BestOf is the shortest of n runs of fn.
func BestOf(n int, fn func() error) (time.Duration, error) {
	var best time.Duration
	for i := 0; i < n; i++ {
		d, err := Timed(fn)
		if err != nil {
			return 0, err
		}
		best = MinDur(best, d)
	}
	return best, nil
}

// TimeAll times fn on each of names, one after the other.
func TimeAll(names []string, fn func(string) error) (time.Duration, error) {
	start := time.Now()
	for _, n := range names {
		if err := fn(n); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// Pct is the p-th percentile of d, 0 if d is empty.
func Pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}
