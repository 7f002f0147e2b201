// Command bench measures hoard against baselines taken in the same run on
// the same machine (the local file system, bindfs, raw loopback TCP,
// hoard with a feature off), one part per workload, and prints tables
// with the ratios. With -charts, the parts with headline comparisons
// also save them as figures (package chart).
//
// Usage: go run ./bench [-only PART,...] [-charts DIR] [-size 1G] [-files 10000] [-dir DIR]
// (make bench builds the hoard binary first, passes it in HOARD_BIN and
// saves the figures of docs/benchmarks.md in docs/charts).
package main

import (
	"bufio"
	"cmp"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/bench/chart"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
)

var (
	sizeFlag  = flag.Int64("size", 1<<30, "bytes in the large file")
	filesFlag = flag.Int("files", 10000, "number of small files")
	smallFlag = flag.Int("small", 4096, "bytes in each small file")
	dirFlag   = flag.String("dir", "", "scratch directory on the disk to measure (default: a temp dir under the current directory)")
	readSize  = flag.Int("read", 1<<20, "read size for the large file")
	profile   = flag.String("cpuprofile", "", "write a CPU profile of the disk-cache cold fetches here")
	only      = flag.String("only", "all", "which parts to run, separated by commas: lib (the library), fuse (the mount), split (Selective Caching's Tables 3 and 4), stat (stat latency during a bulk fetch), mixed (admission policies on a mixed workload), postmark (the cacheDAFS thesis's Postmark, delegations on and off; not in all), proxy (clients of a proxy vs of a distant origin; not in all), hades (the Hades thesis's figures 6.1-6.3, the proxy's store layouts; not in all), build (compiling a C tree from mounts, direct and through a proxy; not in all), nache (clients' scratch files through a proxy, its delegations on and off; not in all), tree (cp -r, postmark, find | xargs cat, tar, rm -r, dd and fio on local disk, bindfs and hoard at doubling file counts; not in all), secure (TLS, tokens and ACLs vs --insecure; not in all), cell (the location database up to 100,000 volumes; not in all), move (moving a volume between servers; not in all), release (releasing a volume to read-only sites; not in all), all (lib, fuse, split, stat and mixed); or charts alone, which runs nothing and draws the figures saved in -charts again")
	statSize  = flag.Int64("stat-size", 4<<30, "bytes fetched while stat latency is measured")
	streams   = flag.Int("streams", 0, "data-channel connections per client (0: the client's default)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// parts are the parts -only can name, and what each runs.
var parts = map[string]func(bin, addr string, serverPID int, scratch string) error{
	"lib":      libBench,
	"fuse":     func(bin, addr string, _ int, scratch string) error { return fuseBench(bin, addr, scratch) },
	"split":    func(bin, addr string, _ int, scratch string) error { return splitBench(bin, addr, scratch) },
	"stat":     func(_, addr string, _ int, _ string) error { return statBench(addr) },
	"mixed":    func(_, addr string, _ int, scratch string) error { return mixedBench(addr, scratch) },
	"postmark": func(bin, addr string, _ int, scratch string) error { return postmarkBench(bin, addr, scratch) },
	"proxy":    func(bin, _ string, _ int, scratch string) error { return proxyBench(bin, scratch) },
	"hades":    func(bin, _ string, _ int, scratch string) error { return hadesBench(bin, scratch) },
	"build":    func(bin, _ string, _ int, scratch string) error { return buildBench(bin, scratch) },
	"nache":    func(bin, _ string, _ int, scratch string) error { return nacheBench(bin, scratch) },
	"tree":     func(bin, _ string, _ int, scratch string) error { return treeBench(bin, scratch) },
	"secure":   func(bin, _ string, _ int, scratch string) error { return secureBench(bin, scratch) },
	"cell":     func(bin, _ string, _ int, scratch string) error { return cellBench(bin, scratch) },
	"move":     func(bin, _ string, _ int, scratch string) error { return moveBench(bin, scratch) },
	"release":  func(bin, _ string, _ int, scratch string) error { return releaseBench(bin, scratch) },
}

// toolsOf are the programs part runs that a machine may lack.
func toolsOf(part string) []string {
	switch part {
	case "tree":
		t := []string{"postmark", "fio", "taskset"}
		if strings.Contains(*treeFS, "bindfs") {
			t = append(t, "bindfs", "fusermount3")
		}
		return t
	case "postmark":
		return []string{"postmark"}
	case "build":
		return []string{"gcc"}
	}
	return nil
}

// haveTools checks, before any part starts, that the programs the parts
// run are installed, and names the Debian packages that have the
// missing ones.
func haveTools(todo []string) error {
	debian := map[string]string{"fusermount3": "fuse3", "taskset": "util-linux"}
	var missing, pkgs []string
	for _, p := range todo {
		for _, t := range toolsOf(p) {
			if _, err := exec.LookPath(t); err != nil && !slices.Contains(missing, t) {
				missing = append(missing, t)
				pkgs = append(pkgs, cmp.Or(debian[t], t))
			}
		}
	}
	if missing != nil {
		return fmt.Errorf("%s not installed (Debian: apt-get install %s)", strings.Join(missing, ", "), strings.Join(pkgs, " "))
	}
	return nil
}

// allParts are the parts "all" runs.
var allParts = []string{"lib", "fuse", "split", "stat", "mixed"}

func run() error {
	var todo []string
	for _, p := range strings.Split(*only, ",") {
		switch {
		case p == "all":
			todo = append(todo, allParts...)
		case p == "charts" && *only == "charts":
		case parts[p] == nil:
			names := slices.Sorted(maps.Keys(parts))
			return fmt.Errorf("-only %q: want parts separated by commas, each one of %s or all; or charts alone", *only, strings.Join(names, ", "))
		default:
			todo = append(todo, p)
		}
	}
	if *only == "charts" {
		if *chartsDir == "" {
			return fmt.Errorf("-only charts: name the figures' directory with -charts")
		}
		drawn, err := chart.RenderDir(*chartsDir)
		for _, d := range drawn {
			fmt.Println("drew", d)
		}
		return err
	}
	if err := haveTools(todo); err != nil {
		return err
	}
	bin := os.Getenv("HOARD_BIN")
	if bin == "" {
		return fmt.Errorf("set HOARD_BIN to a built hoard binary (make bench does)")
	}
	scratch := *dirFlag
	if scratch == "" {
		wd, _ := os.Getwd()
		d, err := os.MkdirTemp(wd, ".bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		scratch = d
	}
	addr, serverPID, stop, err := startServer(bin, filepath.Join(scratch, "server"))
	if err != nil {
		return err
	}
	defer stop()
	fmt.Printf("# hoard benchmark, %s\n\nmachine: %s\n", time.Now().Format("2006-01-02"), machineInfo())
	for _, p := range todo {
		if err := parts[p](bin, addr, serverPID, scratch); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// libBench measures the library: a large file cold and warm, bypassed
// writes, and small cached files.
func libBench(_, addr string, serverPID int, scratch string) error {
	// The large file: written once locally and once into hoard.
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	local := filepath.Join(scratch, "local.big")
	if err := writeLocal(local, data, *sizeFlag); err != nil {
		return err
	}
	w, err := pathfs.Dial(client.Options{Server: addr, CacheSize: 64 << 20})
	if err != nil {
		return err
	}
	if err := writeRemote(w, "/big", data, *sizeFlag); err != nil {
		return err
	}

	fmt.Printf("\n## Large file (%s, %s reads)\n\n", human(*sizeFlag), human(int64(*readSize)))
	fmt.Println("| measurement | hoard | baseline | ratio |")
	fmt.Println("|---|---|---|---|")

	// Cold fetch vs raw TCP: into memory, and into a file on the same disk
	// (a cold fetch into a disk cache must write the bytes too).
	// Each timed phase starts with no dirty pages in flight, so that
	// writeback of an earlier phase does not slow a later one.
	syscall.Sync()
	tcpMem, err := rawTCP(local, *sizeFlag, "")
	if err != nil {
		return err
	}
	syscall.Sync()
	tcpDisk, err := rawTCP(local, *sizeFlag, filepath.Join(scratch, "tcp.copy"))
	if err != nil {
		return err
	}
	// Best of three, alternating, each with a fresh client and cache.
	var cold, coldMem, serverCPU, clientCPU time.Duration
	var c *pathfs.FS
	for i := 0; i < 3; i++ {
		// alwaysCache: these measure the cache's own path, not auto's choice.
		m, err := pathfs.Dial(client.Options{Server: addr, CacheSize: *sizeFlag + 256<<20, AutoMin: alwaysCache, DataStreams: *streams})
		if err != nil {
			return err
		}
		syscall.Sync()
		d, err := readRemote(m, "/big", *sizeFlag)
		if err != nil {
			return err
		}
		m.Close()
		coldMem = minDur(coldMem, d)
		if c != nil {
			c.Close()
		}
		cacheDir := filepath.Join(scratch, fmt.Sprintf("cache%d", i))
		if c, err = pathfs.Dial(client.Options{Server: addr, CacheDir: cacheDir, CacheSize: *sizeFlag + 256<<20, AutoMin: alwaysCache, DataStreams: *streams}); err != nil {
			return err
		}
		syscall.Sync()
		if *profile != "" && i == 0 {
			pf, err := os.Create(*profile)
			if err != nil {
				return err
			}
			pprof.StartCPUProfile(pf)
		}
		s0, c0 := procCPU(serverPID), procCPU(os.Getpid())
		d, err = readRemote(c, "/big", *sizeFlag)
		pprof.StopCPUProfile()
		if err != nil {
			return err
		}
		if d < cold || cold == 0 {
			serverCPU, clientCPU = procCPU(serverPID)-s0, procCPU(os.Getpid())-c0
		}
		cold = minDur(cold, d)
	}
	fmt.Printf("| cold fetch, memory cache (MB/s) | %.0f | %.0f raw TCP into memory | %.2f× |\n", mbps(*sizeFlag, coldMem), mbps(*sizeFlag, tcpMem), tcpMem.Seconds()/coldMem.Seconds())
	fmt.Printf("| cold fetch, disk cache (MB/s) | %.0f | %.0f raw TCP into memory | %.2f× |\n", mbps(*sizeFlag, cold), mbps(*sizeFlag, tcpMem), tcpMem.Seconds()/cold.Seconds())
	fmt.Printf("| cold fetch, disk cache (MB/s) | %.0f | %.0f raw TCP into a file on the same disk | %.2f× |\n", mbps(*sizeFlag, cold), mbps(*sizeFlag, tcpDisk), tcpDisk.Seconds()/cold.Seconds())

	// Warm re-read vs local file (both from the page cache).
	readLocal(local, *sizeFlag)
	var bestLocal, bestWarm time.Duration
	for i := 0; i < 5; i++ {
		l, err := readLocal(local, *sizeFlag)
		if err != nil {
			return err
		}
		h, err := readRemote(c, "/big", *sizeFlag)
		if err != nil {
			return err
		}
		bestLocal, bestWarm = minDur(bestLocal, l), minDur(bestWarm, h)
	}
	st := c.Client().Stats()
	fmt.Printf("| warm re-read (MB/s) | %.0f | %.0f local file | %.2f× |\n", mbps(*sizeFlag, bestWarm), mbps(*sizeFlag, bestLocal), bestLocal.Seconds()/bestWarm.Seconds())
	// A bypassed write (its runs kept aside at the server as one stage,
	// published at fsync) against a local write, both made durable: best
	// of three, alternating.
	var bestLocalW, bestBypassW time.Duration
	for i := 0; i < 3; i++ {
		syscall.Sync()
		l, err := timeDurableWrite(func() (durableFile, error) { return os.Create(filepath.Join(scratch, "local.w")) }, data, *sizeFlag)
		if err != nil {
			return err
		}
		syscall.Sync()
		h, err := timeDurableWrite(func() (durableFile, error) { return w.Create("/__bypassed") }, data, *sizeFlag)
		if err != nil {
			return err
		}
		bestLocalW, bestBypassW = minDur(bestLocalW, l), minDur(bestBypassW, h)
	}
	os.Remove(filepath.Join(scratch, "local.w"))
	fmt.Printf("| bypassed write, fsync'd (MB/s) | %.0f | %.0f local file | %.2f× |\n", mbps(*sizeFlag, bestBypassW), mbps(*sizeFlag, bestLocalW), bestLocalW.Seconds()/bestBypassW.Seconds())
	fmt.Printf("\n(best disk-cache cold fetch: %.2f s wall, server %.2f s CPU, client %.2f s CPU)\n", cold.Seconds(), serverCPU.Seconds(), clientCPU.Seconds())
	c.Close()
	if st.BytesFetched != *sizeFlag {
		fmt.Printf("\n(note: %d bytes fetched for a %d-byte file)\n", st.BytesFetched, *sizeFlag)
	}
	os.Remove(local)

	return smallFiles(w, addr, scratch)
}

func smallFiles(w *pathfs.FS, addr, scratch string) error {
	n, size := *filesFlag, *smallFlag
	fmt.Printf("\n## %d small files of %s, cached (per-operation latency)\n\n", n, human(int64(size)))
	localDir := filepath.Join(scratch, "small")
	os.MkdirAll(localDir, 0o755)
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	if err := w.Mkdir("/small", 0o755); err != nil {
		return err
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("d%02d/f%05d", i%100, i)
		if i < 100 {
			os.Mkdir(filepath.Join(localDir, fmt.Sprintf("d%02d", i)), 0o755)
			if err := w.Mkdir("/small/"+fmt.Sprintf("d%02d", i), 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(localDir, names[i]), buf, 0o644); err != nil {
			return err
		}
		if err := writeRemote(w, "/small/"+names[i], buf, int64(size)); err != nil {
			return err
		}
	}
	c, err := pathfs.Dial(client.Options{Server: addr, CacheDir: filepath.Join(scratch, "cache-small"), CacheSize: 1 << 30})
	if err != nil {
		return err
	}
	defer c.Close()
	p := make([]byte, size)
	// Warm both.
	for _, name := range names {
		f, err := c.Open("/small/"+name, os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		f.ReadAt(p, 0)
		f.Close()
		os.ReadFile(filepath.Join(localDir, name))
	}
	fetched := c.Client().Stats().BytesFetched
	rpcs := c.Client().Stats().RPCs
	type op struct {
		name   string
		hoard  func(string) error
		native func(string) error
	}
	ops := []op{
		{"stat", func(n string) error { _, err := c.Stat("/small/" + n); return err },
			func(n string) error { _, err := os.Stat(filepath.Join(localDir, n)); return err }},
		{"open+close", func(n string) error {
			f, err := c.Open("/small/"+n, os.O_RDONLY, 0)
			if err != nil {
				return err
			}
			return f.Close()
		}, func(n string) error {
			f, err := os.Open(filepath.Join(localDir, n))
			if err != nil {
				return err
			}
			return f.Close()
		}},
		{"open+read+close", func(n string) error {
			f, err := c.Open("/small/"+n, os.O_RDONLY, 0)
			if err != nil {
				return err
			}
			if _, err := f.ReadAt(p, 0); err != nil && err != io.EOF {
				return err
			}
			return f.Close()
		}, func(n string) error {
			f, err := os.Open(filepath.Join(localDir, n))
			if err != nil {
				return err
			}
			if _, err := f.ReadAt(p, 0); err != nil && err != io.EOF {
				return err
			}
			return f.Close()
		}},
	}
	fmt.Println("| operation | hoard (µs/op) | local FS (µs/op) | ratio (hoard/local) |")
	fmt.Println("|---|---|---|---|")
	for _, o := range ops {
		var bh, bl time.Duration
		for round := 0; round < 3; round++ {
			h, err := timeAll(names, o.hoard)
			if err != nil {
				return fmt.Errorf("%s: %w", o.name, err)
			}
			l, err := timeAll(names, o.native)
			if err != nil {
				return err
			}
			bh, bl = minDur(bh, h), minDur(bl, l)
		}
		us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(len(names)) }
		fmt.Printf("| %s | %.2f | %.2f | %.2f× |\n", o.name, us(bh), us(bl), bh.Seconds()/bl.Seconds())
	}
	st := c.Client().Stats()
	fmt.Printf("\n(cached phase: %d bytes fetched, %d RPCs across all operations above)\n", st.BytesFetched-fetched, st.RPCs-rpcs)
	return nil
}

// alwaysCache as Options.AutoMin turns auto's bypass of large files off.
const alwaysCache = 1 << 62

func timeAll(names []string, fn func(string) error) (time.Duration, error) {
	start := time.Now()
	for _, n := range names {
		if err := fn(n); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

func minDur(a, b time.Duration) time.Duration {
	if a == 0 || b < a {
		return b
	}
	return a
}

func mbps(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }

func human(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func startServer(bin, data string, extra ...string) (string, int, func(), error) {
	// Security is measured on its own (secure.go); the rest run insecure,
	// as before there was any.
	return startHoard(bin, append([]string{"server", "--insecure", "--data", data}, extra...)...)
}

// startHoard runs `hoard args... --listen ADDR` on a free port until it
// says it serves, and returns ADDR, its pid and how to stop it.
func startHoard(bin string, args ...string) (string, int, func(), error) {
	addr, err := freePort()
	if err != nil {
		return "", 0, nil, err
	}
	cmd := exec.Command(bin, append(args, "--listen", addr)...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	sc := bufio.NewScanner(stderr)
	serving := false
	for !serving && sc.Scan() {
		serving = strings.Contains(sc.Text(), "serving")
	}
	if !serving {
		cmd.Process.Kill()
		cmd.Wait()
		return "", 0, nil, fmt.Errorf("hoard %s did not start", args[0])
	}
	go io.Copy(io.Discard, stderr)
	return addr, cmd.Process.Pid, func() { cmd.Process.Kill(); cmd.Wait() }, nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func writeLocal(path string, data []byte, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return fillAndClose(f, data, size)
}

func writeRemote(c *pathfs.FS, path string, data []byte, size int64) error {
	f, err := c.Create(path)
	if err != nil {
		return err
	}
	return fillAndClose(f, data, size)
}

type durableFile interface {
	io.WriteCloser
	Sync() error
}

// timeDurableWrite times writing size bytes (data repeated) to the file
// create makes, an fsync and the close.
func timeDurableWrite(create func() (durableFile, error), data []byte, size int64) (time.Duration, error) {
	start := time.Now()
	f, err := create()
	if err != nil {
		return 0, err
	}
	if err := fill(f, data, size); err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return 0, err
	}
	return time.Since(start), f.Close()
}

// fillAndClose writes size bytes, data repeated, then closes.
func fillAndClose(f io.WriteCloser, data []byte, size int64) error {
	if err := fill(f, data, size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fill(f io.Writer, data []byte, size int64) error {
	for off := int64(0); off < size; off += int64(len(data)) {
		if _, err := f.Write(data[:min(int64(len(data)), size-off)]); err != nil {
			return err
		}
	}
	return nil
}

func readLocal(path string, size int64) (time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return readAll(f, size)
}

func readRemote(c *pathfs.FS, path string, size int64) (time.Duration, error) {
	f, err := c.Open(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return readAll(f, size)
}

func readAll(r io.ReaderAt, size int64) (time.Duration, error) {
	p := make([]byte, *readSize)
	start := time.Now()
	var off int64
	for off < size {
		n, err := r.ReadAt(p, off)
		off += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if off != size {
		return 0, fmt.Errorf("read %d bytes, want %d", off, size)
	}
	return time.Since(start), nil
}

// rawTCP copies the local file over a loopback TCP connection (sendfile on
// the sending side, a plain read loop on the receiving side, writing into
// the file sink unless it is empty) and times it.
func rawTCP(path string, size int64, sink string) (time.Duration, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		io.Copy(conn, f)
	}()
	readLocal(path, size) // the sender reads from the page cache, as hoard's server does
	var out *os.File
	if sink != "" {
		if out, err = os.Create(sink); err != nil {
			return 0, err
		}
		defer os.Remove(sink)
		defer out.Close()
	}
	start := time.Now()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	p := make([]byte, 256<<10)
	var got int64
	for got < size {
		n, err := conn.Read(p)
		if out != nil && n > 0 {
			if _, werr := out.Write(p[:n]); werr != nil {
				return 0, werr
			}
		}
		got += int64(n)
		if err != nil {
			break
		}
	}
	if got != size {
		return 0, fmt.Errorf("raw TCP moved %d bytes, want %d", got, size)
	}
	return time.Since(start), nil
}

// procCPU is a process's user+system CPU time so far, from /proc.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	var utime, stime int64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// machineInfo names the machine: cores, CPU, memory, kernel and Go.
func machineInfo() string {
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscan(strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1], &kb)
		mem = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
	}
	return fmt.Sprintf("%d cores (%s), %s RAM, kernel %s, Go %s", runtime.NumCPU(), cpu, mem, strings.TrimSpace(string(kernel)), runtime.Version())
}
