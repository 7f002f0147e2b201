package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// The fault campaign (docs/reliability.md, "Fault campaign"): a mixed
// workload through library clients, FUSE mounts and a proxy while a
// driver kills, cuts, pauses, fills disks and sends hostile requests,
// one fault a round, checking after every round that nothing
// acknowledged was lost, every process is up and within its bounds, and
// the consistency checker's history holds.

// fcLease is the server's: a dead mount's delegations hold others'
// opens up for that long, so shorter than the default; longer than any
// outage a fault makes (a pause, a restart), since a holder cut off past
// its lease loses its write-back, as documented.
const fcLease = 6 * time.Second

// Bounds of the server's resources, checked after every round.
const (
	fcMaxRSS = 512 << 20
	fcMaxFDs = 4096
)

var fcKinds = []string{"kill-server", "kill-mount", "kill-proxy", "pause", "cut", "disk-full", "cache-full", "hostile"}

type campaign struct {
	t    *testing.T
	rng  *rand.Rand
	seed uint64
	// gate is held shared while the test has files open on a mount, and
	// exclusively while the driver starts a process (fcMount).
	gate sync.RWMutex

	srv, proxy *serverProc
	srvDisk    string // a tmpfs; the server's data is in it
	cacheDisk  string // a tmpfs holding the first mount's cache
	dataAddr   string // the server's real data channel
	ctl, data  *testkit.Relay
	probe      *pathfs.FS
	mounts     []*mountProc
	mountTo    []*serverProc
	workers    []*fcWorker
	driver     *fcWorker // the driver's own files (cache-full)
	cons       []*pathfs.FS
	consVia    []*serverProc
	caches     []string // cache directories whose lost/ is counted
	lostSeen   map[string]bool

	// The figures of the summary.
	rounds                      int
	kills                       map[string]int
	faults                      map[string]int
	bytesVerified, filesRead    int64
	lostFiles, lostBytes        int64
	lostAcked                   int64
	peakRSS                     int64
	peakFDs                     int
	consOps, consRounds, probes int
	// consUndecided counts histories porcupine could not decide in its
	// time (many operations of unknown outcome, after a kill).
	consUndecided int
}

func TestFaultCampaign(t *testing.T) {
	needFuse(t)
	if os.Geteuid() != 0 {
		t.Skip("SKIP: the campaign mounts small tmpfs file systems (disk-full faults): needs root")
	}
	soak, _ := envDuration(t, "HOARD_SOAK")
	seed := envSeed(t, "HOARD_SOAK_SEED")
	t.Logf("fault campaign: HOARD_SOAK_SEED=%d HOARD_SOAK=%v (replay with these)", seed, soak)
	c := &campaign{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5eed)), lostSeen: map[string]bool{},
		kills: map[string]int{}, faults: map[string]int{}}
	kinds := fcKinds
	if s := os.Getenv("HOARD_FAULT_KINDS"); s != "" {
		kinds = strings.Split(s, ",")
		for _, k := range kinds {
			if !slices.Contains(fcKinds, k) {
				t.Fatalf("HOARD_FAULT_KINDS: no fault %q (%s)", k, strings.Join(fcKinds, ","))
			}
		}
	}
	c.setup()
	began := time.Now()
	var order []string
	for {
		if len(order) == 0 {
			if soak == 0 && c.rounds >= 2*len(kinds) {
				break // short: each kind of fault twice
			}
			if soak > 0 && time.Since(began) >= soak {
				break
			}
			order = slices.Clone(kinds)
			c.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		kind := order[0]
		order = order[1:]
		c.runRound(kind)
		if t.Failed() {
			t.Errorf("the campaign failed in round %d (%s); replay with HOARD_SOAK_SEED=%d HOARD_SOAK=%v", c.rounds, kind, seed, soak)
			break
		}
	}
	summary := c.summary(time.Since(began))
	t.Log("\n" + summary)
	if soak > 0 {
		fmt.Print(summary)
	}
}

// setup starts the server on a tmpfs, a proxy, the relays, two mounts
// (one direct with its cache on a tmpfs, one through the proxy), the
// workers' clients and the consistency clients.
func (c *campaign) setup() {
	t := c.t
	c.srvDisk = c.tmpfs("192m")
	c.cacheDisk = c.tmpfs("40m")
	c.dataAddr = freeAddr(t)
	c.data = testkit.StartRelay(t, c.dataAddr)
	// A dead mount's delegations hold others' opens up for a lease: keep
	// it short. The grace is the consistency checker's (consGrace).
	c.srv = startServer(t, filepath.Join(c.srvDisk, "data"), "--grace", consGrace.String(), "--lease", fcLease.String(),
		"--data-listen", c.dataAddr, "--data-advertise", c.data.Addr())
	c.ctl = testkit.StartRelay(t, c.srv.addr)
	c.proxy = startProxy(t, c.srv, t.TempDir(), "--grace", consGrace.String())
	c.probe = c.dial("fc-probe", c.srv.addr, client.Options{NoDelegations: true, NoDirDelegations: true})
	for _, d := range []string{"/w0", "/w1", "/w2", "/w3", "/wd"} {
		if err := c.probe.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WriteFile(t, c.probe, "/hostile", []byte("target of hostile requests"))

	m1cache := filepath.Join(c.cacheDisk, "cache")
	m1args := []string{"--timeout", "5s", "--cache-size", "16M"}
	if why := useURing(t); why == "" {
		m1args = append(m1args, "--io-uring") // its kills, cache and disk faults over the rings
	} else {
		t.Logf("the first mount over /dev/fuse: %s", why)
	}
	m1 := startMount(t, c.srv, m1cache, m1args...)
	m2cache := t.TempDir()
	m2 := startMount(t, c.proxy, m2cache, "--timeout", "5s", "--cache-size", "64M")
	c.mounts, c.mountTo = []*mountProc{m1, m2}, []*serverProc{c.srv, c.proxy}

	l1cache, l2cache := t.TempDir(), t.TempDir()
	l1 := c.dialCache("fc-l1", c.ctl.Addr(), l1cache, client.Options{})
	l2 := c.dialCache("fc-l2", c.proxy.addr, l2cache, client.Options{NoDelegations: true})
	c.caches = []string{l1cache, l2cache, m1cache, m2cache}
	mk := func(i int, fs fcFS, through bool) *fcWorker {
		return &fcWorker{name: fmt.Sprintf("w%d", i), fs: fs, through: through,
			rng: rand.New(rand.NewPCG(c.seed, uint64(i+1))), report: func(s string) { t.Error(s) }}
	}
	c.workers = []*fcWorker{
		mk(0, fcLib{l1, "/w0"}, false),                // library, through the cut relay
		mk(1, fcLib{l2, "/w1"}, true),                 // library through the proxy, no delegations
		mk(2, fcMount{m1.path("w2"), &c.gate}, false), // mount
		mk(3, fcMount{m2.path("w3"), &c.gate}, false), // mount through the proxy
	}
	c.driver = mk(9, fcMount{m1.path("wd"), &c.gate}, false)
	c.driver.name = "wd"

	// The consistency checker's clients: direct with delegations, through
	// the cut relay without, through the proxy with.
	for i, to := range []string{c.srv.addr, c.ctl.Addr(), c.proxy.addr} {
		cache := t.TempDir()
		cl := c.dialCache(fmt.Sprintf("fc-cons%d", i), to, cache, client.Options{NoDelegations: i == 1, DirBackoff: time.Millisecond})
		c.cons = append(c.cons, cl)
		c.caches = append(c.caches, cache)
	}
	c.consVia = []*serverProc{c.srv, c.srv, c.proxy}
}

// tmpfs mounts a tmpfs of size on a new directory, unmounted at cleanup
// (after the processes using it are stopped: cleanups run in reverse).
func (c *campaign) tmpfs(size string) string {
	dir := c.t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		c.t.Skipf("SKIP: cannot mount a tmpfs: %v %s", err, out)
	}
	c.t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

func (c *campaign) dial(name, addr string, o client.Options) *pathfs.FS {
	return c.dialCache(name, addr, c.t.TempDir(), o)
}

func (c *campaign) dialCache(name, addr, cache string, o client.Options) *pathfs.FS {
	c.t.Helper()
	o.Server, o.CacheDir, o.CacheSize, o.Name = addr, cache, 64<<20, name
	o.DialTimeout, o.RPCTimeout, o.Logger = 5*time.Second, 10*time.Second, slog.New(slog.DiscardHandler)
	cl, err := cellDial(o)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// runRound runs the workload, strikes with one fault once every worker
// got going, waits until every worker succeeded again, stops the workload
// and checks.
func (c *campaign) runRound(kind string) {
	t := c.t
	c.rounds++
	c.faults[kind]++
	began := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range c.workers {
		wg.Go(func() { w.run(stop) })
	}
	// Not in a disk-full round: a close under a write delegation leaves
	// data the server may then never take, kept in lost/, which a history
	// of the checker cannot explain (documented, docs/consistency.md).
	var cons *fcCons
	if kind != "disk-full" {
		cons = c.startCons()
	}
	c.waitWorkers("before the fault", func(w *fcWorker) int64 { return w.done.Load() }, 5)
	struck := time.Now()
	detail := c.inject(kind)
	healed := time.Now()
	c.waitWorkers("after the fault", func(w *fcWorker) int64 { return w.ok.Load() }, 5)
	close(stop)
	wg.Wait()
	stopped := time.Now()
	lostF, lostB, revoked := c.scanLost()
	if cons != nil {
		c.checkCons(cons, kind, revoked)
	}
	c.checkProcs()
	verified := c.verify()
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	t.Logf("round %d: %s%s; %d bytes verified; lost/ +%d files +%d bytes; %v: fault %v, recovery %v, checks %v",
		c.rounds, kind, detail, verified, lostF, lostB, ms(time.Since(began)), ms(healed.Sub(struck)), ms(stopped.Sub(healed)), ms(time.Since(stopped)))
}

// waitWorkers waits until every worker's count grew by n.
func (c *campaign) waitWorkers(when string, count func(*fcWorker) int64, n int64) {
	base := map[*fcWorker]int64{}
	for _, w := range c.workers {
		base[w] = count(w)
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, w := range c.workers {
		if !poll.Until(time.Until(deadline), func() bool { return count(w)-base[w] >= n }) {
			c.t.Errorf("round %d, %s: worker %s (/%s) made %d of %d operations in 90 s; last error: %v",
				c.rounds, when, w.name, w.name, count(w)-base[w], n, w.lastErr.Load())
			return
		}
	}
}

// inject strikes with one fault and heals it; it returns what it did.
func (c *campaign) inject(kind string) string {
	t := c.t
	switch kind {
	case "kill-server":
		c.kills["server"]++
		c.restart(c.srv)
		t0 := time.Now()
		c.probeUntilOK("after the server's kill -9")
		return fmt.Sprintf(" (storing again after %v)", time.Since(t0).Round(time.Millisecond))
	case "kill-proxy":
		c.kills["proxy"]++
		c.restart(c.proxy)
	case "kill-mount":
		c.kills["mount"]++
		i := c.rng.IntN(len(c.mounts))
		m := c.mounts[i]
		m.cmd.Process.Kill()
		m.cmd.Wait()
		m.cmd = nil
		c.gate.Lock()
		out, code := run(t, "umount", m.dir)
		if code != 0 {
			t.Errorf("hoard umount of a dead mount: exit %d: %s", code, out)
		}
		m.start(c.mountTo[i])
		c.gate.Unlock()
		return fmt.Sprintf(" (mount %d)", i)
	case "pause":
		d := time.Duration(500+c.rng.IntN(2500)) * time.Millisecond
		c.ctl.Pause(true)
		c.data.Pause(true)
		time.Sleep(d) // the fault itself
		c.ctl.Pause(false)
		c.data.Pause(false)
		return fmt.Sprintf(" (%v)", d)
	case "cut":
		n := 0
		for range 1 + c.rng.IntN(3) {
			n += c.ctl.Cut() + c.data.Cut()
			time.Sleep(time.Duration(c.rng.IntN(300)) * time.Millisecond) // between cuts
		}
		return fmt.Sprintf(" (%d connections)", n)
	case "disk-full":
		return c.diskFull()
	case "cache-full":
		return c.cacheFull()
	case "hostile":
		c.hostile()
	}
	return ""
}

// restart kills p with -9 and starts it again. Its next process is
// forked first, under the gate, so that the mounts' operations go on
// across the outage.
func (c *campaign) restart(p *serverProc) {
	c.gate.Lock()
	p.prepare()
	c.gate.Unlock()
	p.kill9()
	p.restart()
}

// fill writes to path until its file system is full.
func (c *campaign) fill(path string) int64 {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				c.t.Fatalf("filling %s: %v", path, err)
			}
			return n
		}
	}
}

func (c *campaign) nospace() int64 {
	var n int64
	for _, w := range c.workers {
		n += w.nospace.Load()
	}
	return n
}

// diskFull fills the server's disk: a synced store must fail, the server
// must stay up, and serve stores again once the space is back.
func (c *campaign) diskFull() string {
	t := c.t
	ballast := filepath.Join(c.srvDisk, "ballast")
	seen := c.nospace()
	var n int64
	// The workers' failed stores free the space they had staged: fill
	// again what they gave back before each try.
	for try := 1; ; try++ {
		n += c.fill(ballast)
		c.probes++
		err := c.probeWrite(fmt.Sprintf("/probe-full-%d", c.probes), 256<<10)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EIO) {
				t.Errorf("round %d: a synced store on a full disk: %v, want ENOSPC or EIO", c.rounds, err)
			}
			break
		}
		if try == 5 {
			t.Errorf("round %d: synced stores succeeded on the server's full disk, %d times", c.rounds, try)
			break
		}
	}
	// Held until a worker hit it too, or for a while: the fault itself.
	poll.Until(3*time.Second, func() bool { return c.nospace() != seen })
	if err := procAlive(c.srv.cmd); err != nil {
		t.Errorf("round %d: the server died on a full disk: %v", c.rounds, err)
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	c.probeUntilOK("after the server's disk had space again")
	return fmt.Sprintf(" (%d MiB of ballast, %d ENOSPC seen by workers)", n>>20, c.nospace()-seen)
}

// cacheFull writes a file larger than the first mount's cache, then
// fills the file system its cache is on: the mount must stay up and
// store again once the space is back.
func (c *campaign) cacheFull() string {
	t := c.t
	m := c.mounts[0]
	d := c.driver
	if len(d.files) == 0 {
		d.files = []*fcFile{{name: "big"}, {name: "full"}, {name: "after"}}
	}
	bigErr := d.writeSized(d.files[0], 24<<20, true) // the cache holds 16M
	ballast := filepath.Join(c.cacheDisk, "ballast")
	n := c.fill(ballast)
	fullErr := d.writeSized(d.files[1], 1<<20, true)
	if err := procAlive(m.cmd); err != nil {
		t.Errorf("round %d: the mount died with its cache's disk full: %v", c.rounds, err)
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	var err error
	if !poll.Until(60*time.Second, func() bool { err = d.writeSized(d.files[2], 64<<10, true); return err == nil }) {
		t.Errorf("round %d: the mount does not store again after its cache's disk had space: %v", c.rounds, err)
	}
	return fmt.Sprintf(" (24 MiB file: %v; %d MiB of ballast; a write on the full cache: %v)", errText(bigErr), n>>20, errText(fullErr))
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// hostile sends what hostile_test.go and datachan_test.go send:
// malformed and oversized requests, huge names, garbage on the data
// channel, a flood of connections. Each must be refused, and the server
// serve on.
func (c *campaign) hostile() {
	t := c.t
	fail := func(f string, a ...any) { t.Errorf("round %d, hostile: "+f, append([]any{c.rounds}, a...)...) }
	rpc := pb.NewFileServerClient(cellGRPC(t, c.srv.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vol, err := rpc.GetVolume(ctx, &pb.GetVolumeRequest{Name: "root"})
	if err != nil {
		fail("GetVolume: %v", err)
		return
	}
	for _, name := range []string{strings.Repeat("n", 1<<20), strings.Repeat("x", 300), "a/b", "..", "a\x00b"} {
		if _, err := rpc.Create(ctx, &pb.CreateRequest{Dir: vol.Root, Name: name, Type: pb.FileType_FILE_TYPE_FILE}); err == nil {
			fail("a create of a %d-byte bad name succeeded", len(name))
		}
	}
	huge := strings.Repeat("h", 1<<20)
	for i := range 20 {
		stream, err := rpc.Connect(ctx)
		if err != nil {
			fail("connect: %v", err)
			return
		}
		stream.Send(&pb.ClientMsg{Msg: &pb.ClientMsg_Hello{Hello: &pb.Hello{Version: pb.Version, Name: huge}}})
		if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
			fail("hello %d with a name of 1 MiB: %v, want InvalidArgument", i, err)
		}
	}
	st, err := c.probe.Stat("/hostile")
	if err != nil {
		fail("stat /hostile: %v", err)
		return
	}
	fid := pb.FromFID(st.FID)
	// Past what any file system takes (tmpfs takes 2^63-1).
	for _, size := range []uint64{1 << 63, 1<<64 - 1} {
		if _, err := rpc.SetAttr(ctx, &pb.SetAttrRequest{Fid: fid, Mask: node.SetSize, Size: size}); pb.Errno(err) != syscall.EFBIG {
			fail("setattr to %d bytes: %v, want EFBIG", size, err)
		}
	}
	// One message past gRPC's 4 MiB.
	if s, err := rpc.Store(ctx); err == nil {
		s.Send(&pb.StoreRequest{Fid: fid, Data: make([]byte, 8<<20), Sync: true})
		if _, err := s.CloseAndRecv(); err == nil {
			fail("a store of one 8 MiB message succeeded")
		}
	}
	// Garbage on the data channel.
	g, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", c.dataAddr, dataTLS(t))
	if err != nil {
		fail("data channel: %v", err)
		return
	}
	g.SetDeadline(time.Now().Add(10 * time.Second))
	g.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	if rep, err := datapath.ReadReply(bufio.NewReader(g)); err != nil || rep.Errno != datapath.ErrProtocol {
		fail("garbage on the data channel: %+v %v, want a protocol error", rep, err)
	}
	g.Close()
	// A flood from one address past its bound on the data channel, and
	// silent control connections.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}, Timeout: 5 * time.Second}
	var flood []net.Conn
	for i := range 600 {
		to := c.dataAddr
		if i%2 == 1 {
			to = c.srv.addr
		}
		fc, err := d.Dial("tcp", to)
		if err != nil {
			continue // refused at accept is an answer too
		}
		if to == c.dataAddr {
			fc.Write([]byte("HDF"))
		}
		flood = append(flood, fc)
	}
	for _, fc := range flood {
		fc.Close()
	}
	if v, err := c.probe.Stat("/hostile"); err != nil || v.Size != st.Size {
		fail("/hostile after the requests: %+v %v", v, err)
	}
	c.probeUntilOK("after hostile requests")
}

// probeWrite stores a file of size bytes with the probe client, synced.
func (c *campaign) probeWrite(name string, size int) error {
	f, err := c.probe.Create(name)
	if err != nil {
		return err
	}
	_, err = f.Write(testkit.Pattern(size, 3))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// probeUntilOK waits until the server takes a synced store again.
func (c *campaign) probeUntilOK(when string) {
	var err error
	if !poll.Until(60*time.Second, func() bool { err = c.probeWrite("/probe", 4096); return err == nil }) {
		c.t.Errorf("round %d: the server takes no store %s: %v", c.rounds, when, err)
	}
}

// procAlive says why the process of cmd is not running (nil: it is).
func procAlive(cmd *exec.Cmd) error {
	if cmd == nil || cmd.Process == nil {
		return errors.New("not started")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return err
	}
	if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
		return fmt.Errorf("pid %d exited", cmd.Process.Pid)
	}
	return nil
}

// checkProcs checks that every process is up and answers, and the
// server's memory and descriptors.
func (c *campaign) checkProcs() {
	t := c.t
	for what, p := range map[string]*serverProc{"server": c.srv, "proxy": c.proxy} {
		if err := procAlive(p.cmd); err != nil {
			t.Errorf("round %d: the %s is down: %v", c.rounds, what, err)
		} else if cn, err := net.DialTimeout("tcp", p.addr, 5*time.Second); err != nil {
			t.Errorf("round %d: the %s does not accept: %v", c.rounds, what, err)
		} else {
			cn.Close()
		}
	}
	for i, m := range c.mounts {
		if err := procAlive(m.cmd); err != nil {
			t.Errorf("round %d: mount %d is down: %v", c.rounds, i, err)
			continue
		}
		c.gate.RLock()
		_, err := os.ReadDir(m.dir)
		c.gate.RUnlock()
		if err != nil {
			t.Errorf("round %d: mount %d does not answer: %v", c.rounds, i, err)
		}
	}
	if c.srv.cmd == nil {
		return
	}
	pid := c.srv.cmd.Process.Pid
	rss := vmRSS(t, pid)
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	c.peakRSS, c.peakFDs = max(c.peakRSS, rss), max(c.peakFDs, len(fds))
	if rss > fcMaxRSS {
		t.Errorf("round %d: the server's RSS is %d MiB, past the bound of %d MiB", c.rounds, rss>>20, fcMaxRSS>>20)
	}
	if len(fds) > fcMaxFDs {
		t.Errorf("round %d: the server has %d descriptors open, past the bound of %d", c.rounds, len(fds), fcMaxFDs)
	}
}

// scanLost counts what the clients kept in lost/ since the last round:
// writes they could not deliver. Only unacknowledged writes may be
// there; verify finds acknowledged ones missing.
func (c *campaign) scanLost() (files, bytes int64, revoked []string) {
	for _, dir := range c.caches {
		kept, err := lost.List(dir)
		if err != nil {
			c.t.Errorf("listing %s: %v", lost.Dir(dir), err)
			continue
		}
		for _, l := range kept {
			if c.lostSeen[l.Data] {
				continue
			}
			c.lostSeen[l.Data] = true
			c.t.Logf("round %d: in %s: %s, %d bytes: %s", c.rounds, lost.Dir(dir), l.Path, l.Size, l.Error)
			if slices.Index(c.caches, dir) >= 4 && strings.Contains(l.Error, "revoked") {
				revoked = append(revoked, l.Path+": "+l.Error)
			}
			files++
			for _, r := range l.Ranges {
				bytes += r[1]
			}
		}
	}
	c.lostFiles += files
	c.lostBytes += bytes
	return files, bytes, revoked
}

// verify reads every file the workers made with a new client straight
// from the server, and judges it. A version read back whole is at the
// server: from then on it is acknowledged.
func (c *campaign) verify() int64 {
	t := c.t
	v := c.dial("fc-verify", c.srv.addr, client.Options{NoDelegations: true, NoDirDelegations: true})
	defer v.Close()
	var verified int64
	for _, w := range append(slices.Clone(c.workers), c.driver) {
		var kept []*fcFile
		for _, f := range w.files {
			names := []string{f.name}
			if f.alt != "" {
				names = append(names, f.alt)
			}
			var found []string
			var data []byte
			for _, name := range names {
				b, err := c.readRetry(v, "/"+w.name+"/"+name)
				if err == nil {
					found, data = append(found, name), b
				}
			}
			floor := f.floor()
			switch len(found) {
			case 0:
				if floor >= 0 {
					c.lostAcked += int64(f.vers[floor].size)
					t.Errorf("round %d: /%s/%s (or %q) is missing, with %d bytes acknowledged", c.rounds, w.name, f.name, f.alt, f.vers[floor].size)
					kept = append(kept, f)
				}
				continue // never made, or lost with its unacknowledged data
			case 2:
				t.Errorf("round %d: /%s/%s and /%s/%s both exist after one rename", c.rounds, w.name, f.name, w.name, f.alt)
				kept = append(kept, f)
				continue
			}
			f.name, f.alt = found[0], ""
			kept = append(kept, f)
			c.filesRead++
			if why := f.judge(data); why != "" {
				if floor >= 0 {
					c.lostAcked += int64(f.vers[floor].size)
				}
				t.Errorf("round %d: the server's /%s/%s: %s", c.rounds, w.name, f.name, why)
				continue
			}
			verified += int64(len(data))
			f.settle(data)
		}
		w.files = kept
	}
	c.bytesVerified += verified
	return verified
}

// settle records that the server holds data: the version it is becomes
// the floor, and older ones are forgotten.
func (f *fcFile) settle(data []byte) {
	floor := max(f.floor(), 0)
	sum := sha256.Sum256(data)
	for i := len(f.vers) - 1; i >= floor; i-- {
		if f.vers[i].sum == sum {
			f.vers[i].durable = true
			floor = i
			break
		}
	}
	f.vers = slices.Clone(f.vers[floor:])
}

// readRetry reads name, retrying what is neither data nor ENOENT for a
// while (a lease of a killed client may hold the file up).
func (c *campaign) readRetry(v *pathfs.FS, name string) ([]byte, error) {
	var b []byte
	var err error
	if !poll.Until(60*time.Second, func() bool {
		b, err = testkit.TryRead(v, name)
		return err == nil || errors.Is(err, syscall.ENOENT)
	}) {
		c.t.Errorf("round %d: the server does not serve %s: %v", c.rounds, name, err)
		return nil, err
	}
	return b, err
}

// fcCons is one round's run of the consistency checker's workers, in a
// directory of their own (an empty initial state).
type fcCons struct {
	h       *consHistory
	workers []*consWorker
	halt    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

// fcConsMax bounds a round's history: porcupine takes too long on many
// thousands of operations.
const fcConsMax = 1000

func (r *fcCons) stop() {
	r.once.Do(func() { close(r.halt) })
	r.wg.Wait()
}

func (c *campaign) startCons() *fcCons {
	dir := fmt.Sprintf("/c%d", c.rounds)
	if err := c.probe.Mkdir(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	r := &fcCons{h: &consHistory{start: time.Now()}, halt: make(chan struct{})}
	for i, cl := range c.cons {
		w := &consWorker{id: i, fs: libFS{cl, dir, c.consVia[i]}, h: r.h, rng: rand.New(rand.NewPCG(c.seed+uint64(c.rounds), uint64(i)))}
		r.workers = append(r.workers, w)
		r.wg.Go(func() { w.run(r.halt) })
	}
	go func() {
		for {
			select {
			case <-r.halt:
				return
			case <-time.After(50 * time.Millisecond):
			}
			r.h.mu.Lock()
			n := len(r.h.ops)
			r.h.mu.Unlock()
			if n >= fcConsMax {
				r.once.Do(func() { close(r.halt) })
				return
			}
		}
	}()
	return r
}

func (c *campaign) checkCons(r *fcCons, kind string, revoked []string) {
	r.stop()
	for _, w := range r.workers {
		for name := range consNames {
			w.readSession(name)
		}
	}
	c.consRounds++
	c.consOps += len(r.h.ops)
	failed := c.t.Failed()
	// A history the checker cannot decide in its time is counted, not
	// failed: a kill leaves many operations of unknown outcome, and the
	// search grows with each. An illegal one fails the round.
	if consVerify(c.t, r.h.ops, c.t.Logf, c.t.Errorf) == porcupine.Unknown {
		c.consUndecided++
	}
	if !failed && c.t.Failed() && len(revoked) > 0 {
		c.t.Logf("round %d: a checker client's delegation was revoked (an outage past the lease loses write-back, as documented): %s",
			c.rounds, strings.Join(revoked, "; "))
	}
	for _, slow := range r.h.slow {
		c.t.Errorf("round %d: %s", c.rounds, slow)
	}
}

// summary is the block of figures docs/reliability.md asks of a soak.
func (c *campaign) summary(took time.Duration) string {
	var b strings.Builder
	kills := c.kills["server"] + c.kills["mount"] + c.kills["proxy"]
	var faults []string
	total := 0
	for _, k := range fcKinds {
		faults = append(faults, fmt.Sprintf("%s %d", k, c.faults[k]))
		total += c.faults[k]
	}
	var writes, syncs, reads, renames, fails int64
	for _, w := range c.workers {
		writes += w.writes.Load()
		syncs += w.syncs.Load()
		reads += w.reads.Load()
		renames += w.renames.Load()
		fails += w.fails.Load()
	}
	fmt.Fprintf(&b, "=== fault campaign summary ===\n")
	fmt.Fprintf(&b, "duration:        %v (HOARD_SOAK_SEED=%d)\n", took.Round(time.Second), c.seed)
	fmt.Fprintf(&b, "rounds:          %d\n", c.rounds)
	fmt.Fprintf(&b, "kills (-9):      %d (server %d, mount %d, proxy %d)\n", kills, c.kills["server"], c.kills["mount"], c.kills["proxy"])
	fmt.Fprintf(&b, "faults injected: %d (%s)\n", total, strings.Join(faults, ", "))
	fmt.Fprintf(&b, "workload:        %d write sessions (%d fsynced), %d reads, %d renames, %d failed; %d checker operations in %d histories\n",
		writes, syncs, reads, renames, fails, c.consOps, c.consRounds)
	fmt.Fprintf(&b, "histories:       %d checked, %d undecided in the checker's time\n", c.consRounds, c.consUndecided)
	fmt.Fprintf(&b, "bytes verified:  %d (%d file reads at the server)\n", c.bytesVerified, c.filesRead)
	fmt.Fprintf(&b, "lost bytes:      %d acknowledged; %d unacknowledged kept in lost/ (%d files)\n", c.lostAcked, c.lostBytes, c.lostFiles)
	fmt.Fprintf(&b, "peak server RSS: %.1f MiB (bound %d MiB)\n", float64(c.peakRSS)/(1<<20), fcMaxRSS>>20)
	fmt.Fprintf(&b, "peak server fds: %d (bound %d)\n", c.peakFDs, fcMaxFDs)
	fmt.Fprintf(&b, "=== end of summary ===\n")
	return b.String()
}
