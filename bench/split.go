package main

import (
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/bench/chart"
	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
)

// splitBench reproduces Selective Caching's Tables 3 and 4 through the FUSE mount:
// cold reads of 1 MiB to 1 GiB files (a fresh mount and an empty cache
// each run, the server's page cache warm), caching vs bypass, over the
// control connection vs the split data channel, next to a raw loopback
// TCP copy of the same bytes.
func splitBench(e *harness.Env) error {
	bin, addr, scratch := e.Bin, e.Addr, e.Scratch
	var sizes []int64
	for _, s := range []int64{1 << 20, 10 << 20, 100 << 20, 1 << 30} {
		if s <= e.Size {
			sizes = append(sizes, s)
		}
	}
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*11 + i>>10)
	}
	w, err := writer(addr, "/t34")
	if err != nil {
		return err
	}
	defer w.Close()
	name := func(s int64) string { return "f" + harness.Human(s) }
	raw := map[int64]time.Duration{}
	for _, s := range sizes {
		local := filepath.Join(scratch, "t34-"+name(s))
		if err := harness.WriteLocal(local, data, s); err != nil {
			return err
		}
		if err := harness.WriteRemote(w, "/t34/"+name(s), data, s); err != nil {
			return err
		}
		// Warm the server's page cache, and measure the physical limit.
		if _, err := e.ReadRemote(w, "/t34/"+name(s), s); err != nil {
			return err
		}
		if raw[s], err = harness.BestOf(3, func() error { _, err := e.RawTCP(local, s, ""); return err }); err != nil {
			return err
		}
		os.Remove(local)
	}

	type config struct {
		name    string
		policy  string
		streams int
	}
	configs := []config{{"caching", "cache", 0}, {"bypass", "bypass", 0}, {"caching + split", "cache", 4}, {"bypass + split", "bypass", 4}}
	results := map[string]map[int64]cpuRun{}
	mnt := filepath.Join(scratch, "t34-mnt")
	cache := filepath.Join(scratch, "t34-cache")
	os.MkdirAll(mnt, 0o755)
	for _, cf := range configs {
		results[cf.name] = map[int64]cpuRun{}
		for _, s := range sizes {
			best := cpuRun{elapsed: time.Hour}
			for i := 0; i < 3; i++ {
				r, err := func() (cpuRun, error) {
					os.RemoveAll(cache)
					pidfile := filepath.Join(scratch, "t34.pid")
					out, err := exec.Command(bin, "mount", "--insecure", "--server", addr, "--cache", cache, "--cache-size", fmt.Sprint(s+512<<20),
						"--data-streams", fmt.Sprint(cf.streams), "--daemon", "--pidfile", pidfile, mnt).CombinedOutput()
					if err != nil {
						return cpuRun{}, fmt.Errorf("mount: %v: %s", err, out)
					}
					defer exec.Command(bin, "umount", mnt).Run()
					pid, err := readPid(pidfile)
					if err != nil {
						return cpuRun{}, err
					}
					if err := syscall.Setxattr(filepath.Join(mnt, "t34"), "user.hoard.policy", []byte(cf.policy), 0); err != nil {
						return cpuRun{}, fmt.Errorf("setting the %s policy: %w", cf.policy, err)
					}
					path := filepath.Join(mnt, "t34", name(s))
					buf := make([]byte, 256)
					n, err := syscall.Getxattr(path, "user.hoard.policy", buf)
					if err != nil || !strings.HasPrefix(string(buf[:n]), cf.policy) {
						return cpuRun{}, fmt.Errorf("policy of %s is %q (%v), want %s", path, buf[:n], err, cf.policy)
					}
					syscall.Sync()
					u0, s0, err := procTimes(pid)
					if err != nil {
						return cpuRun{}, err
					}
					r, err := timedReader(path, s)
					if err != nil {
						return cpuRun{}, err
					}
					u1, s1, err := procTimes(pid)
					r.user += u1 - u0
					r.sys += s1 - s0
					return r, err
				}()
				if err != nil {
					return fmt.Errorf("%s, %s: %w", cf.name, harness.Human(s), err)
				}
				if r.elapsed < best.elapsed {
					best = r
				}
			}
			results[cf.name][s] = best
		}
	}

	fmt.Printf("\n## Selective Caching's Tables 3 and 4: cold reads through the FUSE mount\n\n")
	fmt.Println("Best of 3 runs, each on a fresh mount with an empty disk cache, the server's page cache warm.")
	fmt.Println("User and system seconds are the mount process's plus the reader's (dd, 1 MiB blocks).")
	fmt.Println()
	fmt.Println("| size | raw TCP MB/s | configuration | elapsed s | user s | system s | MB/s | × raw TCP |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, s := range sizes {
		for _, cf := range configs {
			r := results[cf.name][s]
			fmt.Printf("| %s | %.0f | %s | %.3f | %.2f | %.2f | %.0f | %.2f× |\n", harness.Human(s), harness.MBps(s, raw[s]), cf.name,
				r.elapsed.Seconds(), r.user.Seconds(), r.sys.Seconds(), harness.MBps(s, r.elapsed), raw[s].Seconds()/r.elapsed.Seconds())
		}
	}
	impr := func(a, b time.Duration) string {
		if a == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f", math.Round(100*(a-b).Seconds()/a.Seconds())+0) // +0: no "-0"
	}
	table := func(title, base, other string) {
		fmt.Printf("\n%s\n\n", title)
		fmt.Printf("| size | elapsed %s s | %s s | impr %% | user %s s | %s s | impr %% | system %s s | %s s | impr %% |\n",
			base, other, base, other, base, other)
		fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
		for _, s := range sizes {
			a, b := results[base][s], results[other][s]
			fmt.Printf("| %s | %.3f | %.3f | %s | %.2f | %.2f | %s | %.2f | %.2f | %s |\n", harness.Human(s),
				a.elapsed.Seconds(), b.elapsed.Seconds(), impr(a.elapsed, b.elapsed),
				a.user.Seconds(), b.user.Seconds(), impr(a.user, b.user),
				a.sys.Seconds(), b.sys.Seconds(), impr(a.sys, b.sys))
		}
	}
	table("Table 3 (selective caching, data over the control connection):", "caching", "bypass")
	table("Table 3 with the split path on both sides:", "caching + split", "bypass + split")
	table("Table 4 (combined: caching without split vs bypass + split):", "caching", "bypass + split")
	p := chart.Panel{XLabel: "file size", YLabel: "MB/s", Series: []chart.Series{{Name: "raw TCP"}}}
	for _, s := range sizes {
		p.Categories = append(p.Categories, harness.Human(s))
		p.Series[0].Y = append(p.Series[0].Y, harness.MBps(s, raw[s]))
	}
	for _, cf := range configs {
		cs := chart.Series{Name: cf.name}
		for _, s := range sizes {
			cs.Y = append(cs.Y, harness.MBps(s, results[cf.name][s].elapsed))
		}
		p.Series = append(p.Series, cs)
	}
	return e.Figure("split", &chart.Chart{Title: "Bypass against caching: a cold read through the mount, with and without the split data path", Panels: []chart.Panel{p}})
}

// writer is a client for filling dir, a new directory, with test files:
// everything it touches bypasses its small memory cache.
func writer(addr, dir string) (*pathfs.FS, error) {
	w, err := pathfs.Dial(client.Options{Server: addr, CacheSize: 64 << 20, BypassThreshold: 1})
	if err != nil {
		return nil, err
	}
	if err := w.Mkdir(dir, 0o755); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// cpuRun is one timed run: wall time and the CPU it cost.
type cpuRun struct{ elapsed, user, sys time.Duration }

// timedReader reads path with dd in 1 MiB blocks, checks it read size
// bytes, and returns its wall time and CPU.
func timedReader(path string, size int64) (cpuRun, error) {
	var r cpuRun
	cmd := exec.Command("dd", "if="+path, "of=/dev/null", "bs=1M")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	r.elapsed = time.Since(start)
	if err != nil {
		return r, fmt.Errorf("dd: %v: %s", err, out)
	}
	m := regexp.MustCompile(`(\d+) bytes`).FindSubmatch(out)
	if m == nil || string(m[1]) != fmt.Sprint(size) {
		return r, fmt.Errorf("dd read %s, want %d bytes: %s", m, size, out)
	}
	r.user, r.sys = cmd.ProcessState.UserTime(), cmd.ProcessState.SystemTime()
	return r, nil
}

func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// procTimes is a process's user and system CPU time so far, from /proc.
func procTimes(pid int) (user, sys time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const tick = 10 * time.Millisecond // USER_HZ on Linux
	return time.Duration(ut) * tick, time.Duration(st) * tick, nil
}

// statBench measures what a bulk transfer does to control RPCs: the
// latency of stats (each one a lookup RPC: fresh names) sent every 2 ms
// while the same client streams a large file, over the control connection
// and over the split data channel, against the same client idle.
func statBench(e *harness.Env) error {
	addr, size := e.Addr, *statSize
	const names = 5000
	w, err := writer(addr, "/stat")
	if err != nil {
		return err
	}
	defer w.Close()
	for i := 0; i < 2*names; i++ {
		f, err := w.Create(fmt.Sprintf("/stat/f%05d", i))
		if err != nil {
			return err
		}
		f.Close()
	}
	data := make([]byte, 4<<20)
	if err := harness.WriteRemote(w, "/stat/big", data, size); err != nil {
		return err
	}
	if _, err := e.ReadRemote(w, "/stat/big", size); err != nil { // the server's page cache
		return err
	}
	fmt.Printf("\n## stat latency during a %s fetch by the same client\n\n", harness.Human(size))
	fmt.Println("| data path | idle p50 µs | idle p99 µs | busy p50 µs | busy p99 µs | p99 busy/idle | stats during the fetch | fetch MB/s |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for i, split := range []bool{false, true} {
		// A memory cache and bypass: the fetch touches no disk.
		c, err := pathfs.Dial(client.Options{Server: addr, CacheSize: 64 << 20, BypassThreshold: 1, NoDataChannel: !split})
		if err != nil {
			return err
		}
		base := i * names
		probe := func(from, max int, stop <-chan struct{}) []time.Duration {
			var lat []time.Duration
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for k := from; k < from+max; k++ {
				select {
				case <-stop:
					return lat
				case <-tick.C:
				}
				t := time.Now()
				if _, err := c.Stat(fmt.Sprintf("/stat/f%05d", base+k)); err != nil {
					fmt.Fprintln(os.Stderr, "bench: stat:", err)
					return lat
				}
				lat = append(lat, time.Since(t))
			}
			return lat
		}
		idle := probe(0, 1000, nil)
		stop := make(chan struct{})
		var busy []time.Duration
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); busy = probe(1000, names-1000, stop) }()
		d, err := e.ReadRemote(c, "/stat/big", size)
		close(stop)
		wg.Wait()
		c.Close()
		if err != nil {
			return err
		}
		label := "control connection (gRPC)"
		if split {
			label = "split data channel"
		}
		ip50, ip99 := harness.Pct(idle, 50), harness.Pct(idle, 99)
		bp50, bp99 := harness.Pct(busy, 50), harness.Pct(busy, 99)
		fmt.Printf("| %s | %.0f | %.0f | %.0f | %.0f | %.2f× | %d | %.0f |\n", label, harness.Micros(ip50), harness.Micros(ip99), harness.Micros(bp50), harness.Micros(bp99),
			bp99.Seconds()/ip99.Seconds(), len(busy), harness.MBps(size, d))
	}
	return nil
}

// mixedBench runs one mixed workload under three admission policies, each
// with an empty disk cache: a hot working set (small files read whole,
// two mid-sized files read at random) revisited every round, and between
// rounds a large file streamed once, end to end. Auto should keep the hot
// set cached and write the streamed files nowhere; always-cache lets each
// stream evict the hot set; a size threshold bypasses the streams but also
// the mid-sized hot files.
func mixedBench(e *harness.Env) error {
	addr, scratch := e.Addr, e.Scratch
	const (
		smallFiles  = 200
		smallSize   = 256 << 10
		midFiles    = 2
		midSize     = 48 << 20
		midReads    = 200
		largeSize   = 192 << 20
		rounds      = 6
		cacheSize   = 192 << 20
		threshold   = 32 << 20
		randomBlock = 64 << 10
	)
	w, err := writer(addr, "/mixed")
	if err != nil {
		return err
	}
	defer w.Close()
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*5 + i>>12)
	}
	for i := 0; i < smallFiles; i++ {
		if err := harness.WriteRemote(w, fmt.Sprintf("/mixed/s%03d", i), data, smallSize); err != nil {
			return err
		}
	}
	for i := 0; i < midFiles; i++ {
		if err := harness.WriteRemote(w, fmt.Sprintf("/mixed/m%d", i), data, midSize); err != nil {
			return err
		}
	}
	for i := 0; i < rounds; i++ {
		if err := harness.WriteRemote(w, fmt.Sprintf("/mixed/l%d", i), data, largeSize); err != nil {
			return err
		}
	}
	fmt.Printf("\n## Admission policies on a mixed workload\n\n")
	fmt.Printf("%d rounds, %s disk cache. Each round: %d files of %s read whole and %d random %s reads in each of %d files of %s (the hot set, %s),\n",
		rounds, harness.Human(cacheSize), smallFiles, harness.Human(smallSize), midReads, harness.Human(randomBlock), midFiles, harness.Human(midSize),
		harness.Human(smallFiles*smallSize+midFiles*midSize))
	fmt.Printf("then a new %s file streamed once. Hit ratio counts reads served from the cache.\n\n", harness.Human(largeSize))
	fmt.Println("| policy | hot-set hit ratio, rounds 2+ | overall hit ratio | bytes written to the cache | bytes fetched | elapsed s |")
	fmt.Println("|---|---|---|---|---|---|")
	policies := []struct {
		name string
		o    client.Options
	}{
		{"always cache", client.Options{AutoMin: alwaysCache}},
		{fmt.Sprintf("size threshold %s", harness.Human(threshold)), client.Options{BypassThreshold: threshold}},
		{"auto (default)", client.Options{}},
	}
	for i, p := range policies {
		o := p.o
		o.Server, o.CacheDir, o.CacheSize = addr, filepath.Join(scratch, fmt.Sprintf("mixed-cache-%d", i)), cacheSize
		c, err := pathfs.Dial(o)
		if err != nil {
			return err
		}
		var hotHits, hotReads int64
		start := time.Now()
		rng := rand.New(rand.NewSource(1))
		for r := 0; r < rounds; r++ {
			before := c.Client().Stats()
			for k := 0; k < smallFiles; k++ {
				if _, err := e.ReadRemote(c, fmt.Sprintf("/mixed/s%03d", k), smallSize); err != nil {
					return err
				}
			}
			for k := 0; k < midFiles; k++ {
				f, err := c.Open(fmt.Sprintf("/mixed/m%d", k), os.O_RDONLY, 0)
				if err != nil {
					return err
				}
				buf := make([]byte, randomBlock)
				for j := 0; j < midReads; j++ {
					if _, err := f.ReadAt(buf, rng.Int63n(midSize/randomBlock)*randomBlock); err != nil {
						f.Close()
						return err
					}
				}
				f.Close()
			}
			if r > 0 {
				after := c.Client().Stats()
				hotHits += after.Hits - before.Hits
				hotReads += after.Hits - before.Hits + after.Misses - before.Misses
			}
			if _, err := e.ReadRemote(c, fmt.Sprintf("/mixed/l%d", r), largeSize); err != nil {
				return err
			}
		}
		elapsed := time.Since(start)
		s := c.Client().Stats()
		c.Close()
		fmt.Printf("| %s | %.3f | %.3f | %s | %s | %.2f |\n", p.name, float64(hotHits)/float64(max(hotReads, 1)),
			float64(s.Hits)/float64(max(s.Hits+s.Misses, 1)), harness.MiB(s.BytesWritten), harness.MiB(s.BytesFetched), elapsed.Seconds())
	}
	return nil
}
