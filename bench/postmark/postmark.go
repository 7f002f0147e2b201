// Package postmark is bench's postmark part, after the cacheDAFS thesis
// §4.2: Debian's postmark through mounts with delegations and without,
// and Postmark's loop in Go. Debian reruns postmark for the parts that
// time it too (tree, secure).
package postmark

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/bench/chart"
	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
)

// Config is the postmark part's flags.
type Config struct {
	Files, Tx       int   // -pm-files, -pm-tx
	Cache, SetCache int64 // -pm-cache, -pm-set-cache
}

// Flags defines the -pm-* flags on fs and returns what they set.
func Flags(fs *flag.FlagSet) *Config {
	c := &Config{}
	fs.IntVar(&c.Files, "pm-files", 500, "postmark: initial files of the read/write-ratio sweep and the Go port (cacheDAFS thesis: 10,000)")
	fs.IntVar(&c.Tx, "pm-tx", 2000, "postmark: transactions per run (cacheDAFS thesis: 30,000)")
	fs.Int64Var(&c.Cache, "pm-cache", 1<<30, "postmark: cache size of the mounts and library clients in the read/write-ratio sweep and the Go port")
	fs.Int64Var(&c.SetCache, "pm-set-cache", 16<<20, "postmark: cache size of the mounts in the file-set sweep, which runs 0.5-4× it")
	return c
}

const (
	Low, High = 512, 32 << 10 // the cacheDAFS thesis's file sizes
	pmAvg     = (Low + High) / 2
	// Larger than any file, so one call reads or writes a file, as in the cacheDAFS thesis.
	pmBlock = 64 << 10
	pmSeed  = 42
)

// Workload is one Postmark configuration. A bias is out of 10; -1
// leaves that kind of transaction out.
type Workload struct {
	Files, Tx            int
	ReadBias, CreateBias int
}

// Run is the delegations benchmark, after the cacheDAFS thesis §4.2: Debian's
// postmark through a mount with delegations, one without, and on the
// local file system (a read/write-ratio sweep and a file-set sweep), then
// Postmark's loop in Go through the library and the mounts, with the cost
// of each operation (the cacheDAFS thesis Appendix B).
func Run(e *harness.Env, c *Config) error {
	bin, addr, scratch := e.Bin, e.Addr, e.Scratch
	places, err := pmMount(bin, addr, scratch, "ratio", c.Cache)
	if err != nil {
		return err
	}
	defer pmUnmount(places)
	setPlaces, err := pmMount(bin, addr, scratch, "set", c.SetCache)
	if err != nil {
		return err
	}
	defer pmUnmount(setPlaces)

	fmt.Printf("\n## Postmark through the mount: read/write ratio (the cacheDAFS thesis §4.2.1)\n\n")
	fmt.Printf("Debian's postmark, %d files of %s-%s (%s, the mounts' caches are %s), %d transactions, create bias 5, %s blocks.\n",
		c.Files, harness.Human(Low), harness.Human(High), harness.MiB(int64(c.Files)*pmAvg), harness.Human(c.Cache), c.Tx, harness.Human(pmBlock))
	fmt.Println("Transactions/s timed from postmark's progress output; its own report (whole seconds) is in the last column.")
	fmt.Println()
	fmt.Println("| read bias | deleg. tx/s | no deleg. tx/s | local tx/s | deleg./no deleg. | deleg./local | postmark's tx/s (total s): deleg. / no deleg. / local |")
	fmt.Println("|---|---|---|---|---|---|---|")
	// The figure: transactions/s of each place, by read bias and by file set.
	ratio := chart.Panel{Title: fmt.Sprintf("read/write ratio: %d files, %d transactions", c.Files, c.Tx), XLabel: "read bias (10: reads only)", YLabel: "transactions/s", LogY: true}
	set := chart.Panel{Title: fmt.Sprintf("file set against a %s cache, reads only", harness.Human(c.SetCache)), XLabel: "file set ÷ cache", YLabel: "transactions/s", LogX: true, LogY: true}
	for _, pn := range []*chart.Panel{&ratio, &set} {
		pn.Series = []chart.Series{{Name: "local"}, {Name: "hoard --no-delegations"}, {Name: "hoard"}}
	}
	// point adds runs rs (deleg., no deleg., local) at x.
	point := func(pn *chart.Panel, x float64, rs []Result) {
		for i, r := range []Result{rs[2], rs[1], rs[0]} {
			pn.Series[i].X = append(pn.Series[i].X, x)
			pn.Series[i].Y = append(pn.Series[i].Y, r.TPS)
		}
	}
	before, err := publishedStats(places[0].cache)
	if err != nil {
		return err
	}
	for _, bias := range []int{10, 7, 5, 3, 0} {
		rs, err := pmRunAll(places, Workload{c.Files, c.Tx, bias, 5})
		if err != nil {
			return err
		}
		rates, own := pmCells(rs)
		fmt.Printf("| %d | %s | %s |\n", bias, rates, own)
		point(&ratio, float64(bias), rs)
	}
	after, err := publishedStats(places[0].cache)
	if err != nil {
		return err
	}
	fmt.Printf("\n(with delegations the mount wrote %s into its cache and stored %s of it: the rest was deleted before the flusher got to it)\n",
		harness.MiB(after[0].BytesWritten-before[0].BytesWritten), harness.MiB(after[0].Gauges["flushed_bytes"]-before[0].Gauges["flushed_bytes"]))

	fmt.Printf("\n## Postmark through the mount: file set against a %s cache (the cacheDAFS thesis §4.2.2)\n\n", harness.Human(c.SetCache))
	fmt.Printf("%d transactions, read bias 10, no creates or deletes among them. Reads fetched: the share of files read\n", c.Tx)
	fmt.Println("that the mount had to fetch (its cache misses over postmark's reads).")
	fmt.Println()
	fmt.Println("| file set | files | deleg. tx/s | no deleg. tx/s | local tx/s | deleg./no deleg. | deleg./local | reads fetched: deleg. / no deleg. | postmark's tx/s (total s): deleg. / no deleg. / local |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	prev, err := publishedStats(setPlaces[0].cache, setPlaces[1].cache)
	if err != nil {
		return err
	}
	for _, mult := range []float64{0.5, 1, 2, 4} {
		n := int(mult * float64(c.SetCache) / pmAvg)
		rs, err := pmRunAll(setPlaces, Workload{n, c.Tx, 10, -1})
		if err != nil {
			return err
		}
		now, err := publishedStats(setPlaces[0].cache, setPlaces[1].cache)
		if err != nil {
			return err
		}
		var fetched [2]float64
		for i := range fetched {
			fetched[i] = float64(now[i].Misses-prev[i].Misses) / float64(rs[i].rep.reads)
		}
		prev = now
		point(&set, mult, rs)
		rates, own := pmCells(rs)
		fmt.Printf("| %s (%g× the cache) | %d | %s | %.2f / %.2f | %s |\n", harness.MiB(int64(n)*pmAvg), mult, n, rates, fetched[0], fetched[1], own)
	}
	if err := e.Figure("postmark", &chart.Chart{Title: "Delegations against none: Debian's postmark through the mount (the cacheDAFS thesis, section 4.2)", Panels: []chart.Panel{ratio, set}}); err != nil {
		return err
	}
	return postmarkPorts(e, c, places[0].dir, places[1].dir)
}

// pmMount mounts the cell twice with caches of size bytes, with
// delegations and without, and returns a directory on each mount and a
// local one.
func pmMount(bin, addr, scratch, tag string, size int64) ([]*pmPlace, error) {
	var places []*pmPlace
	for _, m := range []struct{ name, flag string }{{"deleg", "--no-delegations=false"}, {"nodeleg", "--no-delegations"}} {
		name := tag + "-" + m.name
		mnt, cacheDir := filepath.Join(scratch, "pm-mnt-"+name), filepath.Join(scratch, "pm-cache-"+name)
		unmount, err := harness.MountCell(bin, addr, mnt, cacheDir, "--cache-size", fmt.Sprint(size), m.flag)
		if err != nil {
			pmUnmount(places)
			return nil, err
		}
		// Each mount in a directory of its own: the other's creates there
		// would break its promises.
		places = append(places, &pmPlace{dir: filepath.Join(mnt, "pm-"+name), cache: cacheDir, unmount: unmount})
	}
	return append(places, &pmPlace{dir: filepath.Join(scratch, "pm-local-"+tag)}), nil
}

func pmUnmount(places []*pmPlace) {
	for _, p := range places {
		if p.unmount != nil {
			p.unmount()
		}
	}
}

// publishedStats reads the counters of mounts' caches once they have
// published them again (they do once a second).
func publishedStats(dirs ...string) ([]cache.Stats, error) {
	time.Sleep(1100 * time.Millisecond)
	var ss []cache.Stats
	for _, d := range dirs {
		s, err := cache.ReadStats(d)
		if err != nil {
			return nil, err
		}
		ss = append(ss, s)
	}
	return ss, nil
}

// pmPlace is a directory postmark runs in, on a mount (with its cache
// directory and unmount) or local; each run gets a new subdirectory.
type pmPlace struct {
	dir, cache string
	unmount    func()
	runs       int
}

// pmRunAll runs w in each place, one after the other.
func pmRunAll(places []*pmPlace, w Workload) ([]Result, error) {
	var rs []Result
	for _, p := range places {
		p.runs++
		dir := filepath.Join(p.dir, fmt.Sprintf("pm%d", p.runs))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		syscall.Sync() // no writeback of an earlier run during this one
		r, err := Debian(context.Background(), dir, w, High)
		if err != nil {
			return nil, fmt.Errorf("postmark in %s: %w", dir, err)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// pmCells formats the transactions/s of runs on the deleg., no-deleg. and
// local places with their ratios, and postmark's own figures.
func pmCells(rs []Result) (rates, own string) {
	d, n, l := rs[0].TPS, rs[1].TPS, rs[2].TPS
	o := make([]string, len(rs))
	for i, r := range rs {
		o[i] = fmt.Sprintf("%d (%d)", r.rep.txRate, r.rep.total)
	}
	return fmt.Sprintf("%.0f | %.0f | %.0f | %.2f× | %.2f×", d, n, l, d/n, d/l), strings.Join(o, " / ")
}

// Result is one run of Debian's postmark: transactions per second timed
// from the progress it prints (its report counts whole seconds), and the
// report.
type Result struct {
	TPS float64 // transactions per second
	rep pmReport
}

// pmReport is what postmark reports: seconds in all (whole seconds, as
// its transactions per second), files read.
type pmReport struct{ total, txRate, reads int }

// Debian runs Debian's postmark on w in dir, files of Low to high
// bytes, until ctx ends.
func Debian(ctx context.Context, dir string, w Workload, high int) (Result, error) {
	script := fmt.Sprintf("set location %s\nset number %d\nset transactions %d\nset size %d %d\nset read %d\nset write %d\n"+
		"set bias read %d\nset bias create %d\nset buffering false\nset seed %d\nrun\nquit\n",
		dir, w.Files, w.Tx, Low, high, pmBlock, pmBlock, w.ReadBias, w.CreateBias, pmSeed)
	cmd := exec.CommandContext(ctx, "postmark")
	cmd.Stdin = strings.NewReader(script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Result{}, err
	}
	if err := cmd.Start(); err != nil {
		return Result{}, err
	}
	// Postmark flushes stdout as each phase starts (and at each tenth of
	// the transactions); the report follows the last phase.
	marks := []string{"Performing transactions", "Deleting files..."}
	var at []time.Time
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, rerr := stdout.Read(buf)
		now := time.Now()
		out = append(out, buf[:n]...)
		for len(at) < len(marks) && bytes.Contains(out, []byte(marks[len(at)])) {
			at = append(at, now)
		}
		if rerr != nil {
			break
		}
	}
	err = cmd.Wait()
	if err == nil && (stderr.Len() > 0 || len(at) < len(marks)) {
		err = errors.New("errors, or an incomplete run")
	}
	if err != nil {
		return Result{}, fmt.Errorf("%v: %s%s", err, stderr.Bytes(), out)
	}
	rep, err := parsePostmark(out)
	if err != nil {
		return Result{}, err
	}
	return Result{TPS: float64(w.Tx) / at[1].Sub(at[0]).Seconds(), rep: rep}, nil
}

var pmReportRE = regexp.MustCompile(`(\d+) seconds total\s+\d+ seconds of transactions \((\d+) per second\)(?s:.*?)\s(\d+) read \(`)

// parsePostmark reads postmark's verbose report.
func parsePostmark(out []byte) (pmReport, error) {
	m := pmReportRE.FindSubmatch(out)
	if m == nil {
		return pmReport{}, fmt.Errorf("no report in postmark's output: %s", out)
	}
	var v [3]int
	for i := range v {
		v[i], _ = strconv.Atoi(string(m[i+1]))
	}
	return pmReport{total: v[0], txRate: v[1], reads: v[2]}, nil
}

// postmarkPorts runs Postmark's loop in Go on the local file system,
// through the library with and without delegations, and through the two
// mounts: the same operations in the same order on each.
// mntDeleg and mntNoDeleg are directories on the two mounts.
func postmarkPorts(e *harness.Env, cfg *Config, mntDeleg, mntNoDeleg string) error {
	addr, scratch := e.Addr, e.Scratch
	w := Workload{cfg.Files, cfg.Tx, 5, 5}
	names := []string{"local", "library", "library, no deleg.", "mount", "mount, no deleg.", "library, no dir deleg."}
	targets := []pmTarget{osDir(filepath.Join(scratch, "pm-port"))}
	clients := make([]*pathfs.FS, len(names)) // the library's, by target
	libs := []client.Options{{}, {NoDelegations: true}, {NoDirDelegations: true}}
	for i, o := range libs {
		if i == 2 {
			targets = append(targets, osDir(filepath.Join(mntDeleg, "port")), osDir(filepath.Join(mntNoDeleg, "port")))
		}
		o.Server, o.CacheDir, o.CacheSize = addr, filepath.Join(scratch, fmt.Sprintf("pm-lib-cache%d", i)), cfg.Cache
		c, err := pathfs.Dial(o)
		if err != nil {
			return err
		}
		defer c.Close()
		dir := fmt.Sprintf("/pm-lib%d", i)
		if err := c.Mkdir(dir, 0o755); err != nil {
			return err
		}
		clients[len(targets)] = c
		targets = append(targets, libDir{c, dir})
	}
	var rs []*pmPort
	var notes []string
	for i, t := range targets {
		if d, ok := t.(osDir); ok {
			if err := os.MkdirAll(string(d), 0o755); err != nil {
				return err
			}
		}
		var before client.Stats
		c := clients[i]
		if c != nil {
			before = c.Client().Stats()
		}
		syscall.Sync()
		r, err := postmarkLoop(t, w)
		if err != nil {
			return fmt.Errorf("postmark's loop, %s: %w", names[i], err)
		}
		if c != nil {
			s := c.Client().Stats()
			notes = append(notes, fmt.Sprintf("%s: %d RPCs, %d opens served locally, %d stores, %d files made locally, %d of them never sent", names[i],
				s.RPCs-before.RPCs, s.LocalOpens-before.LocalOpens, s.Stores-before.Stores, s.MadeHere-before.MadeHere, s.MadeDropped-before.MadeDropped))
		}
		rs = append(rs, r)
	}

	fmt.Printf("\n## Postmark's loop in Go (bench/postmark): library, mounts and local file system\n\n")
	fmt.Printf("%d files of %s-%s, %d transactions, read bias 5, create bias 5, seed %d; caches of %s.\n",
		w.Files, harness.Human(Low), harness.Human(High), w.Tx, pmSeed, harness.Human(cfg.Cache))
	fmt.Println()
	fmt.Printf("| phase | %s | library/library, no deleg. | library/local | mount/local |\n", strings.Join(names, " | "))
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	phases := []struct {
		name string
		rate func(r *pmPort) float64
	}{
		{"creation alone (files/s)", func(r *pmPort) float64 { return float64(r.pool) / r.create.Seconds() }},
		{"transactions (tx/s)", func(r *pmPort) float64 { return float64(w.Tx) / r.tx.Seconds() }},
		{"deletion alone (files/s)", func(r *pmPort) float64 { return float64(r.left) / r.del.Seconds() }},
	}
	for _, p := range phases {
		cells := make([]string, len(rs))
		for i, r := range rs {
			cells[i] = fmt.Sprintf("%.0f", p.rate(r))
		}
		fmt.Printf("| %s | %s | %.2f× | %.2f× | %.2f× |\n", p.name, strings.Join(cells, " | "),
			p.rate(rs[1])/p.rate(rs[2]), p.rate(rs[1])/p.rate(rs[0]), p.rate(rs[3])/p.rate(rs[0]))
	}
	fmt.Printf("\n(%s)\n", strings.Join(notes, "; "))

	fmt.Printf("\n## Cost of each operation in the runs above, mean µs (the cacheDAFS thesis Appendix B)\n\n")
	fmt.Printf("| operation | %s | library/local | mount/local |\n", strings.Join(names, " | "))
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	row := func(name string, mean func(r *pmPort) float64) {
		cells := make([]string, len(rs))
		for i, r := range rs {
			cells[i] = fmt.Sprintf("%.1f", mean(r))
		}
		fmt.Printf("| %s | %s | %.2f× | %.2f× |\n", name, strings.Join(cells, " | "), mean(rs[1])/mean(rs[0]), mean(rs[3])/mean(rs[0]))
	}
	for op := range pmOps {
		row(pmOpNames[op], func(r *pmPort) float64 { return r.mean(op) })
	}
	row("open + close after reading", func(r *pmPort) float64 { return r.mean(opOpen) + r.mean(opCloseRead) })
	return nil
}

// pmTarget is where the Go port runs: a directory of the cell through the
// library, or one through os (local, or on a mount).
type pmTarget interface {
	open(name string, flag int) (io.ReadWriteCloser, error)
	remove(name string) error
}

type osDir string

func (d osDir) open(name string, flag int) (io.ReadWriteCloser, error) {
	f, err := os.OpenFile(filepath.Join(string(d), name), flag, 0o644)
	if err != nil {
		return nil, err // not a nil *os.File in a non-nil interface
	}
	return f, nil
}

func (d osDir) remove(name string) error { return os.Remove(filepath.Join(string(d), name)) }

type libDir struct {
	c   *pathfs.FS
	dir string
}

func (l libDir) open(name string, flag int) (io.ReadWriteCloser, error) {
	f, err := l.c.Open(l.dir+"/"+name, flag, 0o644)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (l libDir) remove(name string) error { return l.c.Remove(l.dir + "/" + name) }

// pmOp is an operation the port times: the cacheDAFS thesis Appendix B's, finer.
type pmOp int

const (
	opCreate pmOp = iota
	opWrite
	opCloseWrite
	opOpen
	opRead
	opAppend
	opCloseRead
	opDelete
	pmOps
)

var pmOpNames = [pmOps]string{"create (open with O_CREAT)", "write a new file", "close after writing", "open an existing file",
	"read a whole file", "append", "close after reading", "delete"}

// pmPort is one run of the port: phase times, files created before and
// deleted after the transactions, and the time each operation took.
type pmPort struct {
	create, tx, del time.Duration
	pool, left      int
	n               [pmOps]int
	spent           [pmOps]time.Duration
}

func (r *pmPort) timed(op pmOp, fn func() error) error {
	start := time.Now()
	err := fn()
	r.spent[op] += time.Since(start)
	r.n[op]++
	return err
}

// mean is op's mean time in µs.
func (r *pmPort) mean(op pmOp) float64 { return harness.Micros(r.spent[op]) / float64(max(r.n[op], 1)) }

// pmData is what the port writes: no file system here compresses.
var pmData = bytes.Repeat([]byte("postmark"), High/8)

// postmarkLoop is Postmark 1.5's run on t: create w.Files files of random
// sizes; then w.Tx transactions, each a read of a whole file or an append
// (up to the largest size) chosen by the read bias, then a create or a
// delete chosen by the create bias; then delete the files left. Files are
// picked at random and written or read in one call, as by postmark with
// blocks larger than a file.
func postmarkLoop(t pmTarget, w Workload) (*pmPort, error) {
	r := &pmPort{pool: w.Files}
	rng := rand.New(rand.NewSource(pmSeed))
	type file struct {
		name string
		size int
	}
	var live []file
	created := 0
	buf := make([]byte, High)
	openAs := func(op pmOp, name string, flag int) (h io.ReadWriteCloser, err error) {
		err = r.timed(op, func() error { h, err = t.open(name, flag); return err })
		return h, err
	}
	write := func(h io.ReadWriteCloser, op pmOp, n int) error {
		werr := r.timed(op, func() error { _, err := h.Write(pmData[:n]); return err })
		return cmp.Or(werr, r.timed(opCloseWrite, h.Close))
	}
	create := func() error {
		created++
		f := file{strconv.Itoa(created), Low + rng.Intn(High-Low)}
		h, err := openAs(opCreate, f.name, os.O_RDWR|os.O_CREATE)
		if err != nil {
			return err
		}
		live = append(live, f)
		return write(h, opWrite, f.size)
	}
	read := func(f file) error {
		h, err := openAs(opOpen, f.name, os.O_RDONLY)
		if err != nil {
			return err
		}
		rerr := r.timed(opRead, func() error { _, err := io.ReadFull(h, buf[:f.size]); return err })
		return cmp.Or(rerr, r.timed(opCloseRead, h.Close))
	}
	appendTo := func(f *file) error {
		if f.size >= High {
			return nil
		}
		h, err := openAs(opOpen, f.name, os.O_RDWR|os.O_APPEND)
		if err != nil {
			return err
		}
		n := 1 + rng.Intn(High-f.size)
		f.size += n
		return write(h, opAppend, n)
	}
	remove := func(i int) error {
		name := live[i].name
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
		return r.timed(opDelete, func() error { return t.remove(name) })
	}

	start := time.Now()
	for range w.Files {
		if err := create(); err != nil {
			return nil, err
		}
	}
	r.create = time.Since(start)
	start = time.Now()
	for range w.Tx {
		if len(live) == 0 {
			return nil, errors.New("out of files: more files or fewer transactions")
		}
		var err error
		if w.ReadBias >= 0 {
			if f := &live[rng.Intn(len(live))]; rng.Intn(10) < w.ReadBias {
				err = read(*f)
			} else {
				err = appendTo(f)
			}
		}
		if err == nil && w.CreateBias >= 0 {
			if rng.Intn(10) < w.CreateBias {
				err = create()
			} else {
				err = remove(rng.Intn(len(live)))
			}
		}
		if err != nil {
			return nil, err
		}
	}
	r.tx = time.Since(start)
	r.left = len(live)
	start = time.Now()
	for len(live) > 0 {
		if err := remove(len(live) - 1); err != nil {
			return nil, err
		}
	}
	r.del = time.Since(start)
	return r, nil
}
