package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// proxyStats asks the proxy at addr for its counters, as hoard proxy
// stats does.
func proxyStats(t *testing.T, addr string) *pb.ProxyStatsReply {
	t.Helper()
	conn := cellGRPC(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := pb.NewProxyClient(conn).Stats(ctx, &pb.ProxyStatsRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("proxy stats from %s: %v", addr, err)
	}
	return r
}

// proxied starts an origin and a proxy of it in a new temporary
// directory, and dials a client of the origin with a memory cache.
func proxied(t *testing.T) (tmp string, origin, px *serverProc, direct *pathfs.FS) {
	t.Helper()
	tmp = t.TempDir()
	origin = startServer(t, filepath.Join(tmp, "origin"))
	px = startProxy(t, origin, filepath.Join(tmp, "proxy"))
	return tmp, origin, px, dial(t, origin.addr, "mem", 64<<20)
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Clients of a proxy read the origin's files through it; clients reading
// the same cold file at once cause one fetch from the origin, and later
// readers are served from the proxy's cache.
func TestProxyReadThrough(t *testing.T) {
	tmp, _, px, direct := proxied(t)
	data := randomBytes(1, 3<<20+12345)
	testkit.WriteFile(t, direct, "/big", data)

	const readers = 4
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for i := range readers {
		c := dial(t, px.addr, filepath.Join(tmp, "c", string(rune('a'+i))), 64<<20)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := c.Open("/big", os.O_RDONLY, 0)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			got := make([]byte, len(data)+1)
			n, _ := f.ReadAt(got, 0)
			if !bytes.Equal(got[:n], data) {
				errs <- errors.New("a client of the proxy read other bytes than were written")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := proxyStats(t, px.addr)
	if s.BytesFetched != int64(len(data)) {
		t.Fatalf("the proxy fetched %d bytes from the origin for %d readers of a %d-byte file; want the file once", s.BytesFetched, readers, len(data))
	}
	// The pooled store keeps the file's chunks together: one run.
	if s.Layout != "pooled" || s.Files != 1 || s.Runs != 1 || s.Chunks != 13 {
		t.Fatalf("store after one 13-chunk file: %v, want pooled, 1 file, 13 chunks in 1 run", s)
	}

	// A late reader, and a listing and a stat through the proxy.
	late := dial(t, px.addr, "mem", 64<<20)
	if got := testkit.ReadFile(t, late, "/big"); !bytes.Equal(got, data) {
		t.Fatal("a late client of the proxy read other bytes")
	}
	ents, err := late.ReadDir("/")
	if err != nil || len(ents) != 1 || ents[0].Name != "big" {
		t.Fatalf("listing through the proxy: %v %v", ents, err)
	}
	st, err := late.Stat("/big")
	if err != nil || st.Size != uint64(len(data)) {
		t.Fatalf("stat through the proxy: %+v %v", st, err)
	}
	if s := proxyStats(t, px.addr); s.BytesFetched != int64(len(data)) || s.Hits < 13 || s.BytesServed < 2*int64(len(data)) {
		t.Fatalf("after a late reader the proxy fetched %d bytes from the origin (want %d), served %d from %d store hits", s.BytesFetched, len(data), s.BytesServed, s.Hits)
	}
	// Every lookup and store read is part of some client read's time.
	if s := proxyStats(t, px.addr); s.MapNanos <= 0 || s.ReadNanos <= 0 || s.ServeNanos < s.MapNanos+s.ReadNanos {
		t.Fatalf("time spent: map %d ns, store read %d ns, serving %d ns in all", s.MapNanos, s.ReadNanos, s.ServeNanos)
	}
	if _, err := late.Stat("/nothing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat of a missing file through the proxy: %v, want not exist", err)
	}
}

// Callbacks chain: a change at the origin reaches the proxy's clients
// before it is acknowledged, a change through the proxy reaches the
// origin (and its clients) before it is acknowledged, and the proxy's
// clients see each other's changes as a server's clients would.
func TestProxyChainedBreaks(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"))
	px := startProxy(t, origin, filepath.Join(tmp, "proxy"))
	direct := dial(t, origin.addr, filepath.Join(tmp, "direct"), 64<<20)
	a := dial(t, px.addr, filepath.Join(tmp, "a"), 64<<20)
	b := dial(t, px.addr, filepath.Join(tmp, "b"), 64<<20)

	testkit.WriteFile(t, direct, "/f", []byte("one"))
	for _, c := range []*pathfs.FS{a, b, direct} {
		if got := string(testkit.ReadFile(t, c, "/f")); got != "one" {
			t.Fatalf("read %q, want one", got)
		}
	}
	// Every client now holds a promise on /f: each change below must
	// break them before its close returns.
	steps := []struct {
		who  *pathfs.FS
		name string
		data string
	}{{direct, "origin client", "two"}, {a, "proxy client a", "three, longer"}, {b, "proxy client b", "4"}}
	for _, step := range steps {
		testkit.WriteFile(t, step.who, "/f", []byte(step.data))
		for _, c := range []*pathfs.FS{a, b, direct} {
			if got := string(testkit.ReadFile(t, c, "/f")); got != step.data {
				t.Fatalf("after a write by the %s, a client read %q, want %q", step.name, got, step.data)
			}
		}
	}
	// Names too: a file made at the origin shows in the proxy clients'
	// cached listings, one made through the proxy at the origin.
	if _, err := a.ReadDir("/"); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, direct, "/g", []byte("g"))
	if err := b.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := a.Rename("/g", "/d/g"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pathfs.FS{a, b, direct} {
		ents, err := c.ReadDir("/d")
		if err != nil || len(ents) != 1 || ents[0].Name != "g" {
			t.Fatalf("listing of /d: %v %v, want g", ents, err)
		}
		if got := string(testkit.ReadFile(t, c, "/d/g")); got != "g" {
			t.Fatalf("read /d/g: %q", got)
		}
	}
	if err := b.Remove("/d/g"); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Stat("/d/g"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat at the origin of a file removed through the proxy: %v", err)
	}
	if _, err := a.Stat("/d/g"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat through the proxy of a removed file: %v", err)
	}
}

// Breaks from the origin that queue up at a proxy go on to its clients
// side by side: each is acknowledged within one wait for a slow client
// (the proxy's break timeout), not after the waits of the breaks before
// it, which would add up past the origin's timeout and make it reset the
// proxy, voiding every promise and delegation its clients hold.
func TestProxyBreaksSideBySide(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"), "--break-timeout", "2s")
	px := startProxy(t, origin, filepath.Join(tmp, "proxy"), "--break-timeout", "1300ms")
	direct := dial(t, origin.addr, "mem", 64<<20)
	names := []string{"/a", "/b"}
	var links []*testkit.Relay
	for i, name := range names {
		testkit.WriteFile(t, direct, name, []byte(name))
		link := testkit.StartRelay(t, px.addr)
		links = append(links, link)
		// Each slow client holds a promise on one file, through the proxy.
		testkit.ReadFile(t, dial(t, link.Addr(), filepath.Join(tmp, fmt.Sprint("slow", i)), 64<<20), name)
	}
	for _, l := range links {
		l.Pause(true)
	}
	errs := make(chan error, len(names))
	for _, name := range names {
		go func() {
			f, err := direct.Create(name)
			if err == nil {
				_, err = f.Write([]byte("changed"))
				err = errors.Join(err, f.Close())
			}
			errs <- err
		}()
	}
	for range names {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range links {
		l.Pause(false)
	}
	if r := proxyStats(t, px.addr).OriginResets; r != 0 {
		t.Fatalf("the origin reset the proxy %d times: its two breaks were acknowledged one wait after the other", r)
	}
}

// Delegations chain through the proxy (Nache): its clients get them from
// the proxy, which holds the origin's on their behalf. Conflicts between
// two of its clients are sorted out at the proxy, without the origin; a
// conflicting read at the origin recalls the proxy's delegation, which
// first recalls its client's, whose dirty data reaches the origin before
// the read is answered. A file made and removed under a delegation never
// reaches the origin at all.
func TestProxyDelegations(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"))
	px := startProxy(t, origin, filepath.Join(tmp, "proxy"))
	writeBack := func(addr, name string) *pathfs.FS {
		c, err := cellDial(client.Options{Server: addr, CacheDir: filepath.Join(tmp, name), CacheSize: 64 << 20,
			FlushAge: time.Hour, RPCTimeout: 10 * time.Second, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b, direct := writeBack(px.addr, "a"), writeBack(px.addr, "b"), writeBack(origin.addr, "direct")

	testkit.WriteFile(t, a, "/f", []byte("from a"))
	if st := a.Client().Stats(); st.WriteDelegations != 1 || st.DirtyBytes == 0 {
		t.Fatalf("a holds %d write delegations and %d dirty bytes: want the file's, its writes not stored yet", st.WriteDelegations, st.DirtyBytes)
	}
	if ps := proxyStats(t, px.addr); ps.OriginWriteDelegations != 1 || ps.Delegations != 1 {
		t.Fatalf("the proxy holds %d write delegations from the origin and gave %d: want 1 and 1", ps.OriginWriteDelegations, ps.Delegations)
	}
	// b conflicts with a only: the proxy recalls a's delegation.
	if got := string(testkit.ReadFile(t, b, "/f")); got != "from a" {
		t.Fatalf("b read %q through the proxy, want a's unstored %q", got, "from a")
	}
	if a.Client().Stats().Recalls != 1 {
		t.Fatalf("a got %d recalls, want 1", a.Client().Stats().Recalls)
	}
	if ps := proxyStats(t, px.addr); ps.OriginRecalls != 0 || ps.OriginWriteDelegations != 1 {
		t.Fatalf("a conflict between two proxy clients reached the origin: %d recalls of the proxy, %d write delegations held", ps.OriginRecalls, ps.OriginWriteDelegations)
	}
	// b writes under a delegation of its own; the origin's client reads.
	testkit.WriteFile(t, b, "/f", []byte("from b, longer"))
	if st := b.Client().Stats(); st.WriteDelegations != 1 || st.DirtyBytes == 0 {
		t.Fatalf("b holds %d write delegations and %d dirty bytes", st.WriteDelegations, st.DirtyBytes)
	}
	if got := string(testkit.ReadFile(t, direct, "/f")); got != "from b, longer" {
		t.Fatalf("the origin's client read %q, want b's unstored %q", got, "from b, longer")
	}
	if ps := proxyStats(t, px.addr); ps.OriginRecalls != 1 || ps.OriginWriteDelegations != 0 {
		t.Fatalf("after a read at the origin: %d recalls of the proxy, %d write delegations held; want 1, 0", ps.OriginRecalls, ps.OriginWriteDelegations)
	}
	if st := b.Client().Stats(); st.Recalls != 1 || st.DirtyBytes != 0 {
		t.Fatalf("b: %d recalls, %d dirty bytes left; want 1, 0", st.Recalls, st.DirtyBytes)
	}
	// A short-lived file: made, written, closed and removed under a's
	// delegation, it is never stored.
	stores := a.Client().Stats().Stores
	testkit.WriteFile(t, a, "/tmp", randomBytes(1, 1<<20))
	if err := a.Remove("/tmp"); err != nil {
		t.Fatal(err)
	}
	if n := a.Client().Stats().Stores - stores; n != 0 {
		t.Fatalf("a sent %d stores of a file it made and removed under its delegation, want none", n)
	}
	if _, err := direct.Stat("/tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat at the origin of a removed file: %v", err)
	}
}

// A read open of a file the client holds a promise on asks nobody, not
// even through a proxy: no other client can hold a write delegation on it
// meanwhile. An open that does reach a proxy holding no delegation on the
// file (a client without a promise) is not kept waiting for the origin:
// it gets none, and the proxy asks for a read delegation meanwhile, which
// the next such open is given. A write at the origin then recalls it
// through the proxy, and the reader sees the write.
func TestProxyReadDelegationLater(t *testing.T) {
	tmp, origin, px, direct := proxied(t)
	testkit.WriteFile(t, direct, "/r", []byte("first"))
	// The writer's delegation would have to be recalled first.
	if err := direct.Close(); err != nil {
		t.Fatal(err)
	}
	a := dial(t, px.addr, filepath.Join(tmp, "a"), 64<<20)
	for range 2 {
		before := a.Client().Stats()
		if got := string(testkit.ReadFile(t, a, "/r")); got != "first" {
			t.Fatalf("read %q through the proxy", got)
		}
		if st := a.Client().Stats(); st.LocalOpens != before.LocalOpens+1 || st.ReadDelegations != 0 {
			t.Fatalf("a read open under a promise: %d local opens, %d read delegations; want 1 and none",
				st.LocalOpens-before.LocalOpens, st.ReadDelegations)
		}
	}
	if n := proxyStats(t, px.addr).OriginReadDelegations; n != 0 {
		t.Fatalf("the proxy holds %d read delegations from the origin after opens that asked nobody", n)
	}

	raw := dialRaw(t, px.addr)
	vol, err := raw.rpc.GetVolume(raw.ctx, &pb.GetVolumeRequest{Name: "root"})
	if err != nil {
		t.Fatal(err)
	}
	lr, err := raw.rpc.Lookup(raw.ctx, &pb.LookupRequest{Dir: vol.Root, Name: "r"})
	if err != nil {
		t.Fatal(err)
	}
	open := func() *pb.OpenReply {
		t.Helper()
		r, err := raw.rpc.Open(raw.ctx, &pb.OpenRequest{Fid: lr.Status.Fid})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := open(); r.Kind != pb.DelegKind_DELEG_NONE {
		t.Fatalf("the first open through a proxy without a delegation got %v: it waited for the origin", r.Kind)
	}
	poll.Wait(t, 5*time.Second, "the proxy's read delegation from the origin after its client's open",
		func() bool { return proxyStats(t, px.addr).OriginReadDelegations == 1 })
	if r := open(); r.Kind != pb.DelegKind_DELEG_READ {
		t.Fatalf("the second open got %v, want the proxy's read delegation passed on", r.Kind)
	}

	w := dial(t, origin.addr, "mem", 64<<20)
	testkit.WriteFile(t, w, "/r", []byte("second"))
	if got := string(testkit.ReadFile(t, a, "/r")); got != "second" {
		t.Fatalf("after a write at the origin the proxy's client read %q", got)
	}
	if ps := proxyStats(t, px.addr); ps.OriginRecalls != 1 {
		t.Fatalf("the write recalled %d of the proxy's delegations; want 1", ps.OriginRecalls)
	}
}

// A proxy cut off from the origin for longer than the origin's lease loses
// the write delegation its client's writes were made under, while that
// client, still talking to the proxy, keeps its own. The origin's client
// goes on after the lease and writes; when the link is back, the proxy
// recalls its client, whose store goes to the origin under the lost
// delegation and is refused: fsync says EIO, the data is kept in lost/
// with its path, and it never lands over what the origin's client wrote.
func TestProxyLostLease(t *testing.T) {
	const lease = 2 * time.Second
	tmp := t.TempDir()
	// File data on the control connection too: the relay is the only
	// way from the proxy to the origin.
	origin := startServer(t, filepath.Join(tmp, "origin"), "--lease", lease.String(), "--data-listen", "none")
	link := testkit.StartRelay(t, origin.addr)
	px := startProxy(t, &serverProc{addr: link.Addr()}, filepath.Join(tmp, "proxy"))
	cacheDir := filepath.Join(tmp, "a")
	a, err := cellDial(client.Options{Server: px.addr, CacheDir: cacheDir, CacheSize: 64 << 20, FlushAge: time.Hour, RPCTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	direct := dial(t, origin.addr, "mem", 64<<20)
	f, err := a.Create("/w")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(testkit.Pattern(1<<20, 3)); err != nil {
		t.Fatal(err)
	}
	if st := a.Client().Stats(); st.WriteDelegations != 1 || st.DirtyBytes != 1<<20 {
		t.Fatalf("a holds %d write delegations, %d dirty bytes", st.WriteDelegations, st.DirtyBytes)
	}
	link.Pause(true)
	start := time.Now()
	testkit.WriteFile(t, direct, "/w", []byte("from the origin's client"))
	took := time.Since(start)
	link.Pause(false)
	if took > lease+2*time.Second {
		t.Fatalf("the origin's writer waited %v for a proxy cut off (lease %v)", took, lease)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync after the proxy lost its delegation: %v, want EIO", err)
	}
	kept, err := lost.List(cacheDir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/w" || kept[0].Size != 1<<20 {
		t.Fatalf("lost data: %+v %v", kept, err)
	}
	if got := string(testkit.ReadFile(t, direct, "/w")); got != "from the origin's client" {
		t.Fatalf("the origin has %d bytes, not what its client wrote after the lease", len(got))
	}
}

// With --data-listen the proxy serves its clients' file bytes on a data
// channel of its own, as a server does (read from its store through a
// buffer, not sendfile), and takes their stores on it; by default they go
// on gRPC.
func TestProxyDataChannel(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"))
	px, rl, dataAddr := relayedDataProxy(t, origin, filepath.Join(tmp, "proxy"))
	if !strings.Contains(px.logs.String(), "data channel "+dataAddr+" advertised as "+rl.Addr()) {
		t.Fatalf("the proxy did not say where its data channel is: %s", px.logs)
	}
	direct := dial(t, origin.addr, "mem", 64<<20)
	content := randomBytes(7, 3<<20+12345)
	testkit.WriteFile(t, direct, "/f", content)
	c := dial(t, px.addr, "mem", 64<<20)
	if !bytes.Equal(testkit.ReadFile(t, c, "/f"), content) {
		t.Fatal("a read through the proxy's data channel returned other bytes")
	}
	if rl.Conns() == 0 {
		t.Fatal("the proxy's client did not use its data channel")
	}
	up := randomBytes(8, 1<<20)
	f, err := c.Create("/g")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(up)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !bytes.Equal(testkit.ReadFile(t, direct, "/g"), up) {
		t.Fatal("a store through the proxy's data channel reached the origin changed")
	}

	plain := startProxy(t, origin, filepath.Join(tmp, "plain"))
	if strings.Contains(plain.logs.String(), "data channel") {
		t.Fatalf("a proxy opened a data channel without --data-listen: %s", plain.logs)
	}
	if !bytes.Equal(testkit.ReadFile(t, dial(t, plain.addr, "mem", 64<<20), "/f"), content) {
		t.Fatal("a read through the proxy over gRPC returned other bytes")
	}
}

// A proxy asks its clients for as many data connections as it uses to the
// origin (16, not a client's default 4): each carries one request at a
// time, and on a cold proxy each waits for the origin, so 4 held a client
// reading many files at once to 4 fetches from a distant origin.
func TestProxyAsksForDataStreams(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"))
	px, rl, _ := relayedDataProxy(t, origin, filepath.Join(tmp, "proxy"))
	direct := dial(t, origin.addr, "mem", 64<<20)
	const files = 12
	for i := range files {
		testkit.WriteFile(t, direct, fmt.Sprintf("/f%d", i), testkit.Pattern(100<<10, byte(i)))
	}
	c := dial(t, px.addr, "mem", 64<<20)
	rl.Pause(true)
	got := make([][]byte, files)
	errs := make([]error, files)
	var wg sync.WaitGroup
	for i := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = testkit.TryRead(c, fmt.Sprintf("/f%d", i))
		}()
	}
	poll.Until(2*time.Second, func() bool { return rl.Conns() >= files })
	conns := rl.Conns()
	rl.Pause(false)
	wg.Wait()
	for i := range files {
		if errs[i] != nil || !bytes.Equal(got[i], testkit.Pattern(100<<10, byte(i))) {
			t.Fatalf("/f%d through the proxy: %d bytes, %v", i, len(got[i]), errs[i])
		}
	}
	if conns <= 4 {
		t.Fatalf("%d reads at once through the proxy's data channel used %d connections, want more than a client's own 4", files, conns)
	}
	t.Logf("%d reads at once: %d data connections", files, conns)
}

// With the origin away, what the proxy holds a promise on is still served;
// anything else fails after the proxy's timeout, with a clear error; once
// the origin is back, everything works again without a restart.
func TestProxyOriginAway(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"))
	px := startProxy(t, origin, filepath.Join(tmp, "proxy"), "--timeout", "2s")
	direct := dial(t, origin.addr, "mem", 64<<20)
	cached := randomBytes(2, 700<<10)
	testkit.WriteFile(t, direct, "/cached", cached)
	testkit.WriteFile(t, direct, "/cold", []byte("cold"))
	direct.Close()
	warm := dial(t, px.addr, "mem", 64<<20)
	if !bytes.Equal(testkit.ReadFile(t, warm, "/cached"), cached) {
		t.Fatal("first read through the proxy")
	}

	origin.kill9()
	// A new client has nothing cached: every byte it reads comes from
	// the proxy.
	fresh := dial(t, px.addr, "mem", 64<<20)
	if !bytes.Equal(testkit.ReadFile(t, fresh, "/cached"), cached) {
		t.Fatal("a file the proxy holds a promise on was not served with the origin away")
	}
	start := time.Now()
	_, err := fresh.Open("/cold", os.O_RDONLY, 0)
	took := time.Since(start)
	if err == nil {
		t.Fatal("a file the proxy never saw was opened with the origin away")
	}
	if took > 12*time.Second {
		t.Fatalf("the failure took %v; the proxy's timeout is 2s", took)
	}
	if msg := err.Error(); !strings.Contains(msg, "/cold") {
		t.Fatalf("error %q does not name the file", msg)
	}

	origin.restart()
	var got []byte
	if !poll.Until(15*time.Second, func() bool { got, err = testkit.TryRead(fresh, "/cold"); return err == nil }) {
		t.Fatalf("the proxy did not recover after the origin came back: %v", err)
	}
	if string(got) != "cold" {
		t.Fatalf("read %q after the origin came back", got)
	}
	// And a change through the proxy reaches the restarted origin.
	testkit.WriteFile(t, fresh, "/after", []byte("after"))
	again := dial(t, origin.addr, "mem", 64<<20)
	if got := string(testkit.ReadFile(t, again, "/after")); got != "after" {
		t.Fatalf("origin has %q for a file written through the proxy", got)
	}
}

// A proxy killed with kill -9 while fetching serves, once restarted, the
// right bytes of every file: what it had stored is kept, and a chunk
// whose bytes did not reach its disk (torn here on purpose, in the pool
// file) is found by its checksum and fetched again, never served.
func TestProxyKilledMidFetch(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"))
	pdir := filepath.Join(tmp, "proxy")
	px := startProxy(t, origin, pdir)
	direct := dial(t, origin.addr, "mem", 64<<20)
	small := randomBytes(3, 1<<20)
	big := randomBytes(4, 64<<20)
	testkit.WriteFile(t, direct, "/small", small)
	testkit.WriteFile(t, direct, "/big", big)

	if !bytes.Equal(testkit.ReadFile(t, dial(t, px.addr, "mem", 64<<20), "/small"), small) {
		t.Fatal("first read of /small through the proxy")
	}
	// What the restart finds of /small is what the store's index held at
	// the kill: kill once it holds all of /small.
	waitIndexed(t, filepath.Join(pdir, "store"), time.Now())

	c, err := cellDial(client.Options{Server: px.addr, CacheSize: 128 << 20, RPCTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if f, err := c.Open("/big", os.O_RDONLY, 0); err == nil {
			f.ReadAt(make([]byte, len(big)), 0)
			f.Close()
		}
	}()
	var at int64
	poll.Wait(t, 10*time.Second, "the proxy fetching /big", func() bool {
		at = proxyStats(t, px.addr).BytesFetched - int64(len(small))
		return at > 0
	})
	px.kill9()
	c.Close()
	<-done
	if at >= int64(len(big)) {
		t.Logf("the read of /big ended before the kill could catch it")
	}

	// Tear chunk 1 of /small: its second half never reached the disk.
	const cs = 256 << 10
	tear(t, filepath.Join(pdir, "store"), small[cs:cs+4096], cs)

	px.restart()
	before := proxyStats(t, px.addr)
	r := dial(t, px.addr, "mem", 128<<20)
	if !bytes.Equal(testkit.ReadFile(t, r, "/small"), small) {
		t.Fatal("after a crash and a torn chunk, /small read wrong through the proxy")
	}
	if !bytes.Equal(testkit.ReadFile(t, r, "/big"), big) {
		t.Fatal("after a crash mid-fetch, /big read wrong through the proxy")
	}
	after := proxyStats(t, px.addr)
	if after.Torn != before.Torn+1 {
		t.Fatalf("torn chunks found: %d, want 1", after.Torn-before.Torn)
	}
	if got := after.BytesFetched - before.BytesFetched; got < cs || got > int64(len(big))+cs {
		t.Fatalf("after the restart the proxy fetched %d bytes: want the torn chunk and what /big lacked", got)
	}
}

// tear finds the chunk that starts with head in a pool file of the store
// in dir, and zeroes its second half.
func tear(t *testing.T, dir string, head []byte, cs int) {
	t.Helper()
	pools, _ := filepath.Glob(filepath.Join(dir, "pool-*"))
	buf := make([]byte, len(head))
	for _, p := range pools {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		for off := int64(0); off < fi.Size(); off += 4096 {
			if _, err := f.ReadAt(buf, off); err == nil && bytes.Equal(buf, head) {
				_, err := f.WriteAt(make([]byte, cs/2), off+int64(cs/2))
				f.Close()
				if err != nil {
					t.Fatal(err)
				}
				return
			}
		}
		f.Close()
	}
	t.Fatalf("no chunk starting with the bytes given in %v", pools)
}

// A client of the proxy asking for a file that does not exist, or in a
// volume the origin does not have, gets an error saying so; the proxy
// goes on serving.
func TestProxyUnknownFID(t *testing.T) {
	_, _, px, direct := proxied(t)
	testkit.WriteFile(t, direct, "/f", []byte("here"))
	c := dial(t, px.addr, "mem", 64<<20)
	st, err := c.Stat("/f")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		fid  node.FID
	}{
		{"a removed vnode", node.FID{Volume: st.FID.Volume, Vnode: st.FID.Vnode, Unique: st.FID.Unique + 1}},
		{"a vnode never made", node.FID{Volume: st.FID.Volume, Vnode: 1 << 40, Unique: 1}},
		{"a volume the origin does not have", node.FID{Volume: 4242, Vnode: 1, Unique: 1}},
	} {
		n := c.Client().FIDs().Node(tc.fid)
		if _, err := c.Client().FIDs().Status(n); !errors.Is(err, syscall.ESTALE) && !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("status of %s (%v) through the proxy: %v, want ESTALE or ENOENT", tc.what, tc.fid, err)
		}
		if _, _, err := c.Client().FIDs().FetchChunk(n, 0); err == nil {
			t.Fatalf("fetch of %s (%v) through the proxy succeeded", tc.what, tc.fid)
		}
	}
	if _, err := c.Client().FIDs().Volume("", 4242); pb.Errno(err) != syscall.ENOENT {
		t.Fatalf("volume 4242 through the proxy: %v, want ENOENT", err)
	}
	if got := string(testkit.ReadFile(t, c, "/f")); got != "here" {
		t.Fatalf("after the bad requests the proxy served %q", got)
	}
	// A file removed at the origin: asked for again, the proxy finds it
	// gone and drops its chunks.
	if s := proxyStats(t, px.addr); s.Files != 1 {
		t.Fatalf("store holds %d files after /f was read, want 1", s.Files)
	}
	if err := direct.Remove("/f"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Client().FIDs().FetchChunk(c.Client().FIDs().Node(st.FID), 0); err == nil {
		t.Fatal("a fetch of a removed file through the proxy succeeded")
	}
	if s := proxyStats(t, px.addr); s.Files != 0 || s.BytesUsed != 0 {
		t.Fatalf("store holds %d files, %d bytes after the only one was removed at the origin", s.Files, s.BytesUsed)
	}
}

// With the proxy's disk full: a pooled store that does not fit is refused
// at start with a clear error; a store that finds the disk full while
// running serves reads all the same, from memory; a write through the
// proxy that cannot be staged fails at the writer, and works again once
// there is room.
func TestProxyDiskFull(t *testing.T) {
	tmp := t.TempDir()
	disk := filepath.Join(tmp, "disk")
	if err := os.Mkdir(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", disk, "tmpfs", 0, "size=24m"); err != nil {
		if os.Getenv("HOARD_REQUIRE_FUSE") != "" {
			t.Fatalf("mounting a small tmpfs for a full disk: %v", err)
		}
		t.Skipf("SKIP: cannot mount a small tmpfs for a full disk: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(disk, syscall.MNT_DETACH) })
	origin := startServer(t, filepath.Join(tmp, "origin"))
	direct := dial(t, origin.addr, "mem", 64<<20)

	out, code := run(t, "proxy", "--cell", testCell.proxyDir, "--origin", origin.addr, "--cache", filepath.Join(disk, "big"), "--cache-size", "64M", "--listen", freeAddr(t))
	if code != 2 || !strings.Contains(out, "no room") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("a pooled store larger than the disk: exit %d, %q; want exit 2 and one line saying there is no room", code, out)
	}
	if _, err := os.Stat(filepath.Join(disk, "big")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the refused proxy left its directory behind")
	}

	// A per-chunk store takes room as it goes: told it has 64M on a 24M
	// disk, it finds the disk full halfway through this file.
	px := startProxy(t, origin, filepath.Join(disk, "pc"), "--layout", "per-chunk", "--cache-size", "64M")
	data := randomBytes(5, 40<<20)
	testkit.WriteFile(t, direct, "/f", data)
	c := dial(t, px.addr, "mem", 128<<20)
	if !bytes.Equal(testkit.ReadFile(t, c, "/f"), data) {
		t.Fatal("with the proxy's disk full, a read through it returned other bytes")
	}
	if s := proxyStats(t, px.addr); s.BytesUsed >= 24<<20 || s.BytesServed < int64(len(data)) {
		t.Fatalf("store %d bytes used on a 24M disk, %d served", s.BytesUsed, s.BytesServed)
	}

	// Fill what is left; a write through the proxy cannot be staged.
	pad, err := os.Create(filepath.Join(disk, "pad"))
	if err != nil {
		t.Fatal(err)
	}
	for _, err = pad.Write(make([]byte, 1<<20)); err == nil; _, err = pad.Write(make([]byte, 1<<20)) {
	}
	pad.Close()
	w := dial(t, px.addr, "mem", 64<<20)
	f, err := w.Create("/g")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(randomBytes(6, 4<<20))
	// fsync, not close: under the proxy's write delegation a close is
	// local, and the write-back that follows reports its failure later.
	if err := f.Sync(); err == nil {
		t.Fatal("a write through a proxy whose disk is full was acknowledged by fsync")
	}
	f.Close()
	if !bytes.Equal(testkit.ReadFile(t, dial(t, px.addr, "mem", 128<<20), "/f"), data) {
		t.Fatal("after a failed write, a read through the proxy returned other bytes")
	}
	os.Remove(filepath.Join(disk, "pad"))
	testkit.WriteFile(t, w, "/h", []byte("room again"))
	if got := string(testkit.ReadFile(t, direct, "/h")); got != "room again" {
		t.Fatalf("the origin has %q for a write through the proxy once there was room", got)
	}
}

// relayedDataProxy starts a proxy of origin in dir whose data channel
// listens at dataAddr, behind a relay that counts the connections.
func relayedDataProxy(t *testing.T, origin *serverProc, dir string) (px *serverProc, rl *testkit.Relay, dataAddr string) {
	t.Helper()
	dataAddr = freeAddr(t)
	rl = testkit.StartRelay(t, dataAddr)
	px = startProxy(t, origin, dir, "--data-listen", dataAddr, "--data-advertise", rl.Addr())
	return px, rl, dataAddr
}

// A proxy killed and back at once loses none of its clients' write-back:
// a client's reclaim at the restarted proxy reaches the origin, where the
// proxy continues its last session (its token kept with its cache) and
// takes over what that session held, without waiting out its lease. The
// writes are stored, and the origin's client reads them.
func TestProxyRestartKeepsWriteBack(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"), "--log-level", "debug")
	px := startProxy(t, origin, filepath.Join(tmp, "proxy"), "--log-level", "debug")
	a, err := cellDial(client.Options{Server: px.addr, CacheDir: filepath.Join(tmp, "a"), CacheSize: 64 << 20,
		FlushAge: time.Hour, RPCTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	direct := dial(t, origin.addr, "mem", 64<<20)
	for i := range 3 {
		name := fmt.Sprintf("/f%d", i)
		testkit.WriteFile(t, a, name, []byte("unstored "+name))
	}
	if st := a.Client().Stats(); st.WriteDelegations != 3 || st.DirtyBytes == 0 {
		t.Fatalf("a holds %d write delegations and %d dirty bytes: want its writes unstored", st.WriteDelegations, st.DirtyBytes)
	}
	px.kill9()
	px.restart()
	start := time.Now()
	for i := range 3 {
		name := fmt.Sprintf("/f%d", i)
		if got := string(testkit.ReadFile(t, direct, name)); got != "unstored "+name {
			t.Fatalf("the origin's client read %q from %s after the proxy's restart, want a's writes", got, name)
		}
	}
	if kept, _ := lost.List(filepath.Join(tmp, "a")); len(kept) != 0 {
		t.Fatalf("a kept %d files in lost/", len(kept))
	}
	t.Logf("read at the origin %v after the proxy's restart", time.Since(start))
}
