// Package cell is bench's parts that run a cell of several servers: the
// location database (cell), moving a volume (move) and releasing one to
// read-only sites (release).
package cell

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/admin"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/vldb"
)

// Run measures the location database: lookups cold (a Locate RPC)
// and cached (none), and, at doubling cell sizes up to 100,000 volumes
// and 1,000 servers, etcd's database size, the time a server takes to
// load its copy, a lookup's latency against that copy and the server's
// memory.
func Run(e *harness.Env) error {
	scratch := e.Scratch
	addr, pid, etcd, stop, err := startCellServer(e.Bin, filepath.Join(scratch, "cell"))
	if err != nil {
		return err
	}
	defer stop()
	c, err := pathfs.Dial(client.Options{Server: addr, CacheSize: 64 << 20})
	if err != nil {
		return err
	}
	defer c.Close()
	db, err := vldb.Open(vldb.Config{Endpoints: []string{etcd}})
	if err != nil {
		return err
	}
	defer db.Close()

	fmt.Printf("\n## The cell's location database\n\n")
	fmt.Println("A server with an embedded etcd member, on loopback; the cell filled with servers and volumes written straight into etcd (`vldb.Import`), as a cell of that size would hold. Locate: a client's lookup of a volume it has not resolved (one RPC, answered from the server's copy); cached: crossing a mount point already resolved (`Stat` of the volume's root).")
	fmt.Println()
	fmt.Println("| volumes | servers | etcd db (MB) | import (s) | copy load (ms) | server RSS (MB) | Locate p50 (µs) | Locate p99 (µs) | cached p50 (µs) | RPCs per cached lookup |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	have := 0
	ctx := context.Background()
	for _, n := range []int{12500, 25000, 50000, 100000} {
		servers := make([]vldb.Server, 0, n/100)
		for i := range n / 100 {
			servers = append(servers, vldb.Server{Name: fmt.Sprintf("sim%04d", i), Addr: fmt.Sprintf("10.%d.%d.%d:7100", i>>16&255, i>>8&255, i&255), Capacity: 8 << 40, Free: 4 << 40})
		}
		var vols []vldb.Volume
		for i := have; i < n; i++ {
			vols = append(vols, vldb.Volume{ID: uint64(1000 + i), Name: fmt.Sprintf("user.%06d", i), RW: servers[i%len(servers)].Name, Created: time.Now()})
		}
		start := time.Now()
		if err := db.Import(ctx, servers, vols); err != nil {
			return err
		}
		imported := time.Since(start)
		have = n
		last := fmt.Sprintf("user.%06d", n-1)
		// The server's copy has the last one once its watch delivered it.
		for {
			if _, err := c.Admin().Locate(last); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		start = time.Now()
		fresh, err := vldb.Open(vldb.Config{Endpoints: []string{etcd}})
		if err != nil {
			return err
		}
		load := time.Since(start)
		fresh.Close()
		var locs []time.Duration
		for i := range 2000 {
			name := fmt.Sprintf("user.%06d", (i*7919)%n)
			t0 := time.Now()
			if _, err := c.Admin().Locate(name); err != nil {
				return err
			}
			locs = append(locs, time.Since(t0))
		}
		// Cached: a mount point resolved once is crossed without an RPC.
		// (The simulated volumes' servers do not run: a volume of the
		// running one.)
		mp := fmt.Sprintf("/m%d", n)
		vname := fmt.Sprintf("real%d", n)
		if _, err := c.Admin().CreateVolume(vname); err != nil {
			return err
		}
		if err := c.Admin().MountVolume(mp, vname); err != nil {
			return err
		}
		if _, err := c.Stat(mp); err != nil {
			return err
		}
		var cached []time.Duration
		rpcs := c.Client().Stats().RPCs
		for range 2000 {
			t0 := time.Now()
			if _, err := c.Stat(mp); err != nil {
				return err
			}
			cached = append(cached, time.Since(t0))
		}
		perCached := float64(c.Client().Stats().RPCs-rpcs) / 2000
		dbSize := dirSize(filepath.Join(scratch, "cell", "etcd", "member", "snap", "db"))
		fmt.Printf("| %d | %d | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f | %.1f | %.2f |\n", n, len(servers), float64(dbSize)/1e6, imported.Seconds(),
			ms(load), float64(rss(pid))/1e6, harness.Micros(harness.Pct(locs, 50)), harness.Micros(harness.Pct(locs, 99)), harness.Micros(harness.Pct(cached, 50)), perCached)
	}
	return nil
}

// ms is d in ms.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func dirSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// rss is a process's resident memory in bytes.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// startCellServer starts an insecure server with its embedded etcd
// member and returns its address, pid, the member's client URL and how
// to stop it.
func startCellServer(bin, data string) (addr string, pid int, etcd string, stop func(), err error) {
	if addr, err = harness.FreePort(); err != nil {
		return "", 0, "", nil, err
	}
	cmd := exec.Command(bin, "server", "--insecure", "--data", data, "--listen", addr)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return "", 0, "", nil, err
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, "join with --etcd "); i >= 0 && strings.Contains(line, "serving") {
			etcd = strings.TrimSuffix(line[i+len("join with --etcd "):], ")")
			break
		}
	}
	if etcd == "" {
		cmd.Process.Kill()
		cmd.Wait()
		return "", 0, "", nil, fmt.Errorf("hoard server did not start with an etcd member of its own")
	}
	go io.Copy(io.Discard, stderr)
	return addr, cmd.Process.Pid, etcd, func() { cmd.Process.Kill(); cmd.Wait() }, nil
}

// Move moves a volume of one large file and many small ones between
// two servers of a cell, with a writer at work, and back: the time, the
// freeze, and the rate against raw loopback TCP of the same bytes.
func Move(e *harness.Env) error {
	bin, scratch := e.Bin, e.Scratch
	a, _, etcd, stopA, err := startCellServer(bin, filepath.Join(scratch, "move-a"))
	if err != nil {
		return err
	}
	defer stopA()
	_, _, stopB, err := harness.StartHoard(bin, "server", "--insecure", "--data", filepath.Join(scratch, "move-b"), "--etcd", etcd, "--name", "b")
	if err != nil {
		return err
	}
	defer stopB()
	c, err := pathfs.Dial(client.Options{Server: a, CacheSize: 64 << 20})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Admin().CreateVolumeOn("mv", a); err != nil {
		return err
	}
	if err := c.Admin().MountVolume("/mv", "mv"); err != nil {
		return err
	}
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	if err := harness.WriteRemote(c, "/mv/big", data, e.Size); err != nil {
		return err
	}
	if err := c.Mkdir("/mv/small", 0o755); err != nil {
		return err
	}
	small := data[:e.Small]
	for i := range e.Files {
		if err := harness.WriteRemote(c, fmt.Sprintf("/mv/small/%05d", i), small, int64(len(small))); err != nil {
			return err
		}
	}
	local := filepath.Join(scratch, "move.local")
	if err := harness.WriteLocal(local, data, e.Size); err != nil {
		return err
	}
	tcp, err := e.RawTCP(local, e.Size, "")
	if err != nil {
		return err
	}
	// A move ends with the bytes on the target's disk, synced.
	tcpDisk, err := e.RawTCP(local, e.Size, filepath.Join(scratch, "move.tcp"))
	if err != nil {
		return err
	}
	// A writer rewrites small files throughout.
	stop := make(chan struct{})
	done := make(chan [2]int)
	go func() {
		w, err := pathfs.Dial(client.Options{Server: a, CacheSize: 64 << 20, NoDelegations: true})
		if err != nil {
			done <- [2]int{0, -1}
			return
		}
		defer w.Close()
		var n [2]int // written, failed
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			if harness.WriteRemote(w, fmt.Sprintf("/mv/small/%05d", n[0]%e.Files), small, int64(len(small))) == nil {
				n[0]++
			} else {
				n[1]++
			}
		}
	}()
	time.Sleep(time.Second)
	there, err := c.Admin().MoveVolume("mv", "b")
	if err != nil {
		return err
	}
	time.Sleep(time.Second)
	close(stop)
	writes := <-done
	// Back, 1% of the small files rewritten first.
	for i := 0; i < e.Files/100; i++ {
		if err := harness.WriteRemote(c, fmt.Sprintf("/mv/small/%05d", i*100), small, int64(len(small))); err != nil {
			return err
		}
	}
	back, err := c.Admin().MoveVolume("mv", a)
	if err != nil {
		return err
	}
	fmt.Printf("\n## Moving a volume\n\n")
	fmt.Printf("Two servers of one cell on loopback (`--insecure`); a volume of one %s file and %d files of %s. A writer rewrote small files through the first move: %d writes, %d failed.\n\n",
		harness.Human(e.Size), e.Files, harness.Human(int64(e.Small)), writes[0], writes[1])
	fmt.Println("| move | bytes copied | passes | took (s) | changes held back (ms) | MB/s | × raw TCP into memory | × raw TCP into a file |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, r := range []struct {
		name string
		rep  admin.MoveReport
	}{{"there, with a writer", there}, {"back, 1% rewritten", back}} {
		rate := harness.MBps(r.rep.Bytes, r.rep.Took)
		fmt.Printf("| %s | %s | %d | %.2f | %.0f | %.0f | %.2f× (%.0f MB/s) | %.2f× (%.0f MB/s) |\n", r.name, harness.Human(r.rep.Bytes), r.rep.Passes, r.rep.Took.Seconds(),
			ms(r.rep.Freeze), rate, rate/harness.MBps(e.Size, tcp), harness.MBps(e.Size, tcp), rate/harness.MBps(e.Size, tcpDisk), harness.MBps(e.Size, tcpDisk))
	}
	return nil
}
