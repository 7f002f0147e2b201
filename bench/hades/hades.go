// Package hades is bench's hades part: Hades' figures 6.1-6.3, read
// throughput at the clients of a proxy whose store is pooled against one
// file per chunk.
package hades

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoardfs/hoard/bench/chart"
	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/bench/proxy"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/client/policy"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/proxystore"
)

// Config is the hades part's flags.
type Config struct {
	Scale float64 // -hades-scale
	Big   int64   // -hades-big
	BW    float64 // -hades-bw
	Par   int     // -hades-par
}

// Flags defines the -hades-* flags on fs and returns what they set.
func Flags(fs *flag.FlagSet) *Config {
	c := &Config{}
	fs.Float64Var(&c.Scale, "hades-scale", 1, "hades: scales every workload, the small-file ones by file count, the large-file ones by file size (e.g. 0.01 for a smoke run)")
	fs.Int64Var(&c.Big, "hades-big", 256<<20, "hades: bytes per file of the last workload, before -hades-scale (Hades: 1 GiB)")
	fs.Float64Var(&c.BW, "hades-bw", 0, "hades: the origin's bandwidth towards the proxy in MB/s (0: unlimited)")
	fs.IntVar(&c.Par, "hades-par", 8, "hades: files each user reads at once in the parallel modes")
	return c
}

// hadesLoad is a read workload of Hades' chapter 6: users, each reading
// files of its own.
type hadesLoad struct {
	tag          string
	users, files int // files per user
	size         int64
}

func (l hadesLoad) String() string {
	if l.users == 1 {
		return fmt.Sprintf("%d × %s", l.files, harness.Human(l.size))
	}
	return fmt.Sprintf("%d users × %d × %s", l.users, l.files, harness.Human(l.size))
}

func (l hadesLoad) bytes() int64 { return int64(l.users*l.files) * l.size }

func (l hadesLoad) user(u int) string { return fmt.Sprintf("hades-user%d", u) }

func (l hadesLoad) path(u, j int) string { return fmt.Sprintf("/hades/%s/u%d/f%05d", l.tag, u, j) }

// loads are Hades' figures 6.1-6.3 (the last one's files -hades-big
// bytes), scaled by -hades-scale.
func (cfg *Config) loads() []hadesLoad {
	s := cfg.Scale
	count := func(n int) int { return max(1, int(math.Round(float64(n)*s))) }
	size := func(n int64) int64 { return max(4<<10, int64(float64(n)*s)/4096*4096) }
	return []hadesLoad{
		{"a", 2, count(1000), 100 << 10},
		{"b", 2, count(500), 1 << 20},
		{"c", 1, 5, size(100 << 20)},
		{"d", 1, 5, size(cfg.Big)},
	}
}

// hadesMode is one of Hades' modes: parallel or sequential reads, with
// the proxy's store empty (cold) or holding the files (warm).
type hadesMode struct {
	name      string
	par, cold bool
}

var hadesModes = []hadesMode{{"Par/Cold", true, true}, {"Par/Warm", true, false}, {"Seq/Warm", false, false}}

// hadesWarmRuns is how many times a warm mode runs, the best counting: a
// run does not change the store, and the shortest take under a second.
const hadesWarmRuns = 3

func (m hadesMode) runs() int {
	if m.cold {
		return 1
	}
	return hadesWarmRuns
}

// Run reproduces Hades' figures 6.1-6.3: read throughput at the
// clients of a proxy whose store is laid out pooled (a file's chunks
// together, a user's files one after the other) against one file per
// chunk, the origin 0 and 50 ms away. Each workload and layout gets a new
// proxy, and each mode new clients that bypass their caches, so every
// byte read comes from the proxy. Its proxies serve a data channel if
// pxData (-px-data).
func Run(e *harness.Env, cfg *Config, pxData bool) error {
	bin := e.Bin
	began := time.Now()
	loads := cfg.loads()
	var lim *proxy.Link
	bw := "unlimited"
	if cfg.BW > 0 {
		lim = &proxy.Link{Rate: cfg.BW * 1e6}
		bw = fmt.Sprintf("limited to %g MB/s by the shaper", cfg.BW)
	}
	dir := filepath.Join(e.Scratch, "hades")
	o, err := proxy.StartOrigin(bin, dir, 0, lim)
	if err != nil {
		return err
	}
	defer o.Close()
	c := newContent()
	if err := hadesWrite(o, loads, c); err != nil {
		return err
	}

	fmt.Printf("\n## Hades: read throughput through the proxy, pooled vs per-chunk store (figures 6.1-6.3)\n\n")
	fmt.Printf("Workloads: %s. ", hadesList(loads))
	if cfg.Big != 1<<30 {
		reads := 0
		for _, m := range hadesModes {
			reads += 2 * m.runs()
		}
		fmt.Printf("The last is Hades' 5 × 1 GiB with %s files (-hades-big), to keep this part within about 20 minutes: each workload is read %d times per origin RTT (2 layouts), the cold reads at the origin's pace. ", harness.Human(cfg.Big), reads)
	}
	if cfg.Scale != 1 {
		fmt.Printf("All scaled by %g (-hades-scale). ", cfg.Scale)
	}
	fmt.Printf("Par: %d files at once per user; Seq: one after the other per user (the users of a workload read at the same time). ", cfg.Par)
	fmt.Printf("Cold: a new proxy, its store empty; Warm: the store the cold run filled, the page cache dropped before each run, best of %d. ", hadesWarmRuns)
	fmt.Printf("Clients are new in each mode and bypass their caches. Origin bandwidth: %s.\n\n", bw)
	fmt.Println("| origin RTT | workload | mode | pooled (MB/s) | per-chunk (MB/s) | pooled/per-chunk |")
	fmt.Println("|---|---|---|---|---|---|")
	var runs, blocks []string
	var notes []string
	fig := &chart.Chart{Title: "The proxy's store: pooled against per-chunk layout, read throughput at its clients (Hades figure 6.1)", Columns: len(loads)}
	for _, rtt := range []time.Duration{0, 50 * time.Millisecond} {
		o.SetRTT(rtt)
		for _, l := range loads {
			var rates [][]float64
			var times [][]blockTimes
			for _, layout := range []string{proxystore.Pooled, proxystore.PerChunk} {
				r, bt, st, ns, err := cfg.layout(bin, o, filepath.Join(dir, "proxy-"+layout), l, c, layout, pxData)
				if err != nil {
					return fmt.Errorf("%v, %s, %s: %w", rtt, l, layout, err)
				}
				rates = append(rates, r)
				times = append(times, bt)
				for _, n := range ns {
					notes = append(notes, fmt.Sprintf("%v, %s, %s: %s", rtt, l, layout, n))
				}
				avg := 0.0
				if st.Runs > 0 {
					avg = float64(st.Chunks) / float64(st.Runs)
				}
				runs = append(runs, fmt.Sprintf("| %v | %s | %s | %d | %d | %d | %.2f | %d |", rtt, l, layout, st.Files, st.Chunks, st.Runs, avg, st.Evictions))
			}
			p := chart.Panel{Title: fmt.Sprintf("%s, origin %d ms away", l, rtt.Milliseconds()), YLabel: "MB/s",
				Series: []chart.Series{{Name: proxystore.PerChunk, Y: rates[1]}, {Name: proxystore.Pooled, Y: rates[0]}}}
			for _, m := range hadesModes {
				p.Categories = append(p.Categories, m.name)
			}
			fig.Panels = append(fig.Panels, p)
			for i, m := range hadesModes {
				fmt.Printf("| %v | %s | %s | %.0f | %.0f | %.2f× |\n", rtt, l, m.name, rates[0][i], rates[1][i], rates[0][i]/rates[1][i])
				p, q := times[0][i], times[1][i]
				blocks = append(blocks, fmt.Sprintf("| %v | %s | %s | %s | %s | %.2f× |", rtt, l, m.name, p, q, p.total()/q.total()))
			}
		}
	}
	fmt.Printf("\nFigure 6.2: a 4 KiB block's time at the proxy in µs, the best run's average (hoard proxy stats): map (finding and placing chunks in the store) / store read / origin fetch and other = total; summed over concurrent reads, so parallel reads add up the time they wait on each other.\n\n")
	fmt.Println("| origin RTT | workload | mode | pooled | per-chunk | pooled/per-chunk |")
	fmt.Println("|---|---|---|---|---|---|")
	fmt.Println(strings.Join(blocks, "\n"))
	fmt.Printf("\nThe proxies' stores after the warm runs (hoard proxy stats):\n\n")
	fmt.Println("| origin RTT | workload | layout | files | chunks | runs | chunks per run | evictions |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	fmt.Println(strings.Join(runs, "\n"))
	fmt.Println()
	if len(notes) == 0 {
		fmt.Println("(checked: every byte read matched the bytes written; in every run the proxy served the bytes the clients read, in the cold ones fetched each from the origin once, in the warm ones fetched none)")
	} else {
		fmt.Println("(checked: every byte read matched the bytes written; the proxy's counters were off in these runs:)")
		for _, n := range notes {
			fmt.Println("-", n)
		}
	}
	fmt.Printf("\n(this part took %s)\n", time.Since(began).Round(time.Second))
	return e.Figure("hades", fig)
}

func hadesList(loads []hadesLoad) string {
	var s []string
	for _, l := range loads {
		s = append(s, l.String())
	}
	return strings.Join(s, "; ")
}

// hadesWrite writes every workload's files at the origin.
func hadesWrite(o *proxy.Origin, loads []hadesLoad, c content) error {
	return o.Write(func(w *pathfs.FS) error {
		if err := w.Mkdir("/hades", 0o755); err != nil {
			return err
		}
		for _, l := range loads {
			if err := w.Mkdir("/hades/"+l.tag, 0o755); err != nil {
				return err
			}
			for u := range l.users {
				// Written past the writer's cache: gigabytes of new
				// files are not worth caching on the writer.
				d := filepath.Dir(l.path(u, 0))
				if err := w.Mkdir(d, 0o755); err != nil {
					return err
				}
				if err := w.SetPolicy(d, policy.Bypass, false); err != nil {
					return err
				}
				for j := range l.files {
					if err := harness.WriteRemote(w, l.path(u, j), c.of(l.path(u, j)), l.size); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// blockTimes is a 4 KiB block's time at the proxy, in µs, broken down
// as the Hades thesis's figure 6.2 does.
type blockTimes struct{ mapping, read, fetch float64 }

// blockTimesOf is the average block's time between two of the proxy's
// counters.
func blockTimesOf(prev, st *pb.ProxyStatsReply) blockTimes {
	blocks := float64(st.BytesServed-prev.BytesServed) / 4096
	us := func(ns int64) float64 { return float64(ns) / 1e3 / blocks }
	m, r := st.MapNanos-prev.MapNanos, st.ReadNanos-prev.ReadNanos
	return blockTimes{us(m), us(r), us(st.ServeNanos - prev.ServeNanos - m - r)}
}

func (b blockTimes) total() float64 { return b.mapping + b.read + b.fetch }

func (b blockTimes) String() string {
	return fmt.Sprintf("%.2f / %.1f / %.1f = %.1f", b.mapping, b.read, b.fetch, b.total())
}

// layout runs the modes on a new proxy whose store has the given
// layout, and returns the MB/s of each and a block's time at the proxy in
// its best run, the proxy's counters after the last, and what was off in
// them.
func (cfg *Config) layout(bin string, o *proxy.Origin, dir string, l hadesLoad, c content, layout string, pxData bool) ([]float64, []blockTimes, *pb.ProxyStatsReply, []string, error) {
	defer os.RemoveAll(dir)
	px, _, stop, err := proxy.Start(bin, o, dir, l.bytes(), layout, pxData)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer stop()
	prev, err := proxy.Stats(bin, px)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	var rates []float64
	var times []blockTimes
	var notes []string
	for _, m := range hadesModes {
		par := 1
		if m.par {
			par = cfg.Par
		}
		var best time.Duration
		var bt blockTimes
		for range m.runs() {
			harness.DropCaches()
			d, err := hadesRead(px, l, c, par)
			if err != nil {
				return nil, nil, nil, nil, fmt.Errorf("%s: %w", m.name, err)
			}
			st, err := proxy.Stats(bin, px)
			if err != nil {
				return nil, nil, nil, nil, err
			}
			served, fetched := st.BytesServed-prev.BytesServed, st.BytesFetched-prev.BytesFetched
			if served < l.bytes() {
				return nil, nil, nil, nil, fmt.Errorf("%s: the clients read %d bytes, the proxy served only %d", m.name, l.bytes(), served)
			}
			if best == 0 || d < best {
				best, bt = d, blockTimesOf(prev, st)
			}
			want := int64(0)
			if m.cold {
				want = l.bytes()
			}
			if served != l.bytes() || fetched != want {
				notes = append(notes, fmt.Sprintf("%s: served %d bytes for %d read, fetched %d from the origin (want %d)", m.name, served, l.bytes(), fetched, want))
			}
			prev = st
		}
		rates = append(rates, harness.MBps(l.bytes(), best))
		times = append(times, bt)
	}
	return rates, times, prev, notes, nil
}

// hadesRead has a new client per user read the user's files from addr,
// par at a time each, checking every byte, and returns the time all took.
// The clients bypass their caches: every byte comes from addr.
func hadesRead(addr string, l hadesLoad, c content, par int) (time.Duration, error) {
	cs, err := harness.DialAll(l.users, func(u int) client.Options {
		return client.Options{Server: addr, Name: l.user(u), BypassThreshold: 1, CacheSize: 64 << 20, DialTimeout: 30 * time.Second}
	})
	if err != nil {
		return 0, err
	}
	defer harness.CloseAll(cs)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, l.users*par)
	for u, cl := range cs {
		var next atomic.Int64
		for range par {
			wg.Go(func() {
				buf := make([]byte, 1<<20)
				for {
					j := int(next.Add(1)) - 1
					if j >= l.files {
						return
					}
					if err := readChecked(cl, l.path(u, j), l.size, c, buf); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	return time.Since(start), errors.Join(harness.Collect(errs)...)
}

// readChecked reads the file at path through buf and checks it holds the
// size bytes c says.
func readChecked(cl *pathfs.FS, path string, size int64, c content, buf []byte) error {
	f, err := cl.Open(path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var off int64
	for off < size {
		n, err := f.ReadAt(buf, off)
		if !c.matches(path, off, buf[:n]) {
			return fmt.Errorf("%s: the %d bytes at %d are not the ones written", path, n, off)
		}
		off += int64(n)
		if err == io.EOF || n == 0 {
			break
		}
		if err != nil {
			return err
		}
	}
	if off != size {
		return fmt.Errorf("%s: read %d bytes, want %d", path, off, size)
	}
	return nil
}

// period is the length after which generated file data repeats; not a
// multiple of a block or a chunk, so that a block or chunk served at the
// wrong offset does not compare equal.
const period = 1<<20 + 4093

// content is generated file data: each file's is one period of a pattern,
// repeated, starting at an offset in the pattern that depends on the
// file's path, so that another file's bytes do not compare equal either.
type content struct {
	pat []byte // the period twice: any period of it is one slice
}

func newContent() content {
	pat := make([]byte, 2*period)
	for i := range period {
		pat[i] = byte(i*7 + i>>9)
	}
	copy(pat[period:], pat[:period])
	return content{pat}
}

// of is the first period of the file at path: its data is that repeated.
func (c content) of(path string) []byte {
	h := fnv.New64a()
	h.Write([]byte(path))
	s := h.Sum64() % period
	return c.pat[s : s+period]
}

// matches reports whether b is the data of the file at path at off.
func (c content) matches(path string, off int64, b []byte) bool {
	data := c.of(path)
	for len(b) > 0 {
		i := off % period
		n := min(int64(len(b)), period-i)
		if !bytes.Equal(b[:n], data[i:i+n]) {
			return false
		}
		b, off = b[n:], off+n
	}
	return true
}
