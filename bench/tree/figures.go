package tree

import (
	"time"

	"github.com/hoardfs/hoard/bench/chart"
	"github.com/hoardfs/hoard/bench/harness"
)

// seriesOver is one line of a figure: of(x) at each x.
func seriesOver[T int | float64](name string, xs []T, of func(T) float64) chart.Series {
	s := chart.Series{Name: name}
	for _, x := range xs {
		s.X = append(s.X, float64(x))
		s.Y = append(s.Y, of(x))
	}
	return s
}

// figures draws the tree part: each workload's seconds on the local
// disk, bindfs and hoard as the file count doubles, and the large file's
// rates against local's.
func (c *Config) figures(e *harness.Env, ns []int, res map[string]map[int]*treeTimes, bigs map[string]*bigTimes, big int64) error {
	at := func(fsys string, of func(*treeTimes) time.Duration) func(int) float64 {
		return func(n int) float64 {
			if t := res[fsys][n]; t != nil {
				return of(t).Seconds()
			}
			return 0
		}
	}
	ch := &chart.Chart{Title: "Trees of small files: local disk, bindfs and hoard as the file count doubles (seconds, lower is better)", Columns: 4}
	for _, w := range treeRows {
		if w.pm && !c.Postmark {
			continue // not run
		}
		p := chart.Panel{Title: w.short, XLabel: "files", YLabel: "seconds", LogX: true, LogY: true}
		for _, fsys := range []string{"local", "bindfs", "hoard", "hoard-uring"} {
			if res[fsys] != nil {
				p.Series = append(p.Series, seriesOver(fsys, ns, at(fsys, w.of)))
			}
		}
		if w.pm && c.NoDeleg && res["hoard"] != nil {
			p.Series = append(p.Series, seriesOver("hoard --no-delegations", ns, at("hoard", func(t *treeTimes) time.Duration { return t.pmNoDeleg })))
		}
		ch.Panels = append(ch.Panels, p)
	}
	if err := e.Figure("tree", ch); err != nil {
		return err
	}
	if big == 0 || bigs["local"] == nil {
		return nil
	}
	// Rates over local's: the write, the cold read, each warm read, IOPS.
	rates := func(b *bigTimes) []float64 {
		mb := func(d time.Duration) float64 { return harness.MBps(big, d) }
		return []float64{mb(b.write), mb(b.cold), mb(b.warm[0]), mb(b.warm[1]), mb(b.warm[2]), b.iops}
	}
	local := rates(bigs["local"])
	p := chart.Panel{Title: "A file of " + harness.Human(big), YLabel: "rate ÷ local's (higher is better)",
		Categories: []string{"dd write, fsync", "cold read", "1st re-read", "2nd", "3rd", "4 KiB random"}, Ref: 1, RefName: "local"}
	for _, fsys := range []string{"bindfs", "hoard"} {
		if b := bigs[fsys]; b != nil {
			s := chart.Series{Name: fsys, Y: rates(b)}
			for i := range s.Y {
				s.Y[i] /= local[i]
			}
			p.Series = append(p.Series, s)
		}
	}
	return e.Figure("bigfile", &chart.Chart{Title: "A large file: rates through bindfs and hoard against the local disk's", Panels: []chart.Panel{p}})
}
