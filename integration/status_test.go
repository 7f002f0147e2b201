package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/status"
)

// needChromium finds a Chromium to drive, or skips (under
// HOARD_REQUIRE_FUSE=1, as in CI, fails) saying why.
func needChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("HOARD_REQUIRE_FUSE") == "1" {
		t.Fatal("Chromium required (HOARD_REQUIRE_FUSE=1) but not found: apt-get install chromium")
	}
	t.Skip("SKIP: no Chromium (chromium, chromium-browser, google-chrome) on the PATH")
	return ""
}

// page is a headless Chromium tab that resolves no host name (so it
// reaches nothing but the loopback addresses it is given) and records
// every request it makes and every error its pages report.
type page struct {
	ctx context.Context

	mu       sync.Mutex
	requests []string
	errors   []string
}

func openBrowser(t *testing.T, bin string) *page {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox, // tests run as root
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1800),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	p := &page{ctx: ctx}
	// The first call starts the browser, which lives as long as its
	// context: no timeout on it.
	err := chromedp.Listen(ctx, func(ev any) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			p.requests = append(p.requests, ev.Request.URL)
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			if d.Exception != nil {
				p.errors = append(p.errors, d.Exception.Description)
			} else {
				p.errors = append(p.errors, d.Text)
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				p.errors = append(p.errors, fmt.Sprintf("console.error %v", ev.Args))
			}
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.EntryLevelError {
				p.errors = append(p.errors, ev.Entry.Text+" "+ev.Entry.URL)
			}
		}
	})
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return p
}

// open loads url in the tab.
func (p *page) open(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
}

// wait polls expr in the page until it is truthy, and returns it.
func (p *page) wait(t *testing.T, what, expr string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 15*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Poll[float64](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(10*time.Second)))
	if err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("page never showed %s: %v\npage text:\n%s", what, err, text)
	}
	return v
}

// eval evaluates expr in the page.
func (p *page) eval(t *testing.T, expr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// screenshot saves the page to $HOARD_STATUS_SCREENSHOT (if set), with
// suffix before its .png.
func (p *page) screenshot(suffix string) {
	shot := os.Getenv("HOARD_STATUS_SCREENSHOT")
	if shot == "" {
		return
	}
	// The body, not the window: none of the blank below the page.
	if png, err := chromedp.Run(p.ctx, chromedp.Screenshot("body")); err == nil {
		os.WriteFile(strings.TrimSuffix(shot, ".png")+suffix+".png", png, 0o644)
	}
}

// check fails the test if the pages reported errors or made a request
// outside origins.
func (p *page) check(t *testing.T, origins ...string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.errors {
		t.Errorf("page error: %s", e)
	}
	if len(p.requests) < 4 {
		t.Errorf("the pages made %d requests: %q", len(p.requests), p.requests)
	}
	for _, r := range p.requests {
		u, err := url.Parse(r)
		if u != nil && u.Scheme == "data" {
			continue
		}
		ok := false
		for _, o := range origins {
			ok = ok || err == nil && u.Scheme+"://"+u.Host == o
		}
		if !ok {
			t.Errorf("a page requested %s, outside its own origin", r)
		}
	}
}

// cardAtLeast is an expression: card id's value once it is at least min
// and every chart on the page is drawn (a uPlot canvas with a size).
func cardAtLeast(id string, min float64) string {
	return fmt.Sprintf(`(() => {
		const charts = document.querySelectorAll('.chart');
		const canvases = [...document.querySelectorAll('.chart .uplot canvas')];
		if (charts.length < 4 || canvases.length !== charts.length ||
		    !canvases.every(c => c.width > 0 && c.height > 0 && c.getBoundingClientRect().width > 0)) return 0;
		const v = document.getElementById('v-%s');
		const n = v ? Number(v.dataset.value) : NaN;
		return n >= %v && v.textContent !== '–' ? Math.max(n, 1e-9) : 0;
	})()`, id, min)
}

// tableHas is an expression: true once table id lists text.
func tableHas(id, text string) string {
	return fmt.Sprintf(`(document.querySelector('#table-%s tbody')?.textContent || '').includes(%q) ? 1 : 0`, id, text)
}

// rowOf is an expression: the cells of table id's row whose first cell
// is name, joined by " | " ("" until there is one).
func rowOf(id, name string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('#table-%s tbody tr')].map(tr => [...tr.cells].map(td => td.textContent)).filter(r => r[0] === %q).map(r => r.join(' | '))[0] || ''`, id, name)
}

// waitRow waits until table id has a row for name that contains each of
// want, and returns it.
func (p *page) waitRow(t *testing.T, what, id, name string, want ...string) string {
	t.Helper()
	var conds []string
	for _, w := range want {
		conds = append(conds, fmt.Sprintf("r.includes(%q)", w))
	}
	p.wait(t, what, fmt.Sprintf(`((r) => %s ? 1 : 0)(%s)`, strings.Join(conds, " && "), rowOf(id, name)))
	return p.eval(t, rowOf(id, name))
}

// waitHistory waits until the history the process at addr keeps holds
// what ok wants.
func waitHistory(t *testing.T, addr, what string, ok func([]status.Status) bool) {
	t.Helper()
	var h []status.Status
	if !poll.Until(15*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/history.json")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		h = nil
		return json.NewDecoder(resp.Body).Decode(&h) == nil && ok(h)
	}) {
		t.Fatalf("the history at %s never held %s: %d samples", addr, what, len(h))
	}
}

// A mount's, a server's and a proxy's status pages, in a browser that reaches
// nothing but them, draw their charts and show the traffic the test
// makes, live; a page opened after traffic charts it from the history
// the process kept.
func TestStatusPage(t *testing.T) {
	needFuse(t)
	bin := needChromium(t)
	saddr, maddr := freeAddr(t), freeAddr(t)
	srv := startServer(t, t.TempDir(), "--http", saddr)
	m := startMount(t, srv, t.TempDir(), "--http", maddr, "--metrics", maddr)
	put := func(name string, data []byte) {
		w := dial(t, srv.addr, "mem", 64<<20)
		testkit.WriteFile(t, w, name, data)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string, want int) {
		if b, err := os.ReadFile(m.path(name)); err != nil || len(b) != want {
			t.Fatalf("read %s: %d bytes, %v", name, len(b), err)
		}
	}
	// The history starts with the mount: a sample before the traffic.
	waitHistory(t, maddr, "a sample", func(h []status.Status) bool { return len(h) > 0 })
	first := testkit.Pattern(3<<20, 1)
	put("/m", first)
	read("m", len(first))
	waitHistory(t, maddr, "two samples after the read", func(h []status.Status) bool {
		n := 0
		for _, s := range h {
			if s.Client != nil && s.Client.CacheBytes >= int64(len(first)) {
				n++
			}
		}
		return n >= 2
	})

	// --http and --metrics at one address: one listener serves both.
	if v, ok := sum(scrape(t, maddr), "hoard_cache_fetched_bytes_total"); !ok || v < float64(len(first)) {
		t.Errorf("metrics beside the page: fetched %v (found %v)", v, ok)
	}

	// --http alone serves /metrics too.
	if _, ok := sum(scrape(t, saddr), "hoard_server_sessions"); !ok {
		t.Error("no hoard_server_sessions at the server's --http address")
	}

	p := openBrowser(t, bin)
	mountPage, serverPage := "http://"+maddr+"/", "http://"+saddr+"/"
	opened := time.Now()
	p.open(t, mountPage)
	// The charts start before the page opened, with the read: its bytes
	// cached, and fetched at a rate (between the samples around it).
	p.wait(t, "the traffic before the page opened, charted", fmt.Sprintf(`(() => {
		const tp = document.getElementById('chart-throughput'), cache = document.getElementById('chart-cache');
		return Number(document.body.dataset.history) >= 3 && tp && Number(tp.dataset.first) * 1000 < %d &&
			Number(tp.dataset.peak) >= %d && Number(cache.dataset.peak) >= %d ? 1 : 0;
	})()`, opened.UnixMilli(), len(first)/10, len(first)))
	fetched := p.wait(t, "the bytes the mount fetched", cardAtLeast("fetched-bytes", float64(len(first))))
	p.wait(t, "the bytes the mount caches", cardAtLeast("cache-bytes", float64(len(first))))
	p.wait(t, "the cached file by its path", tableHas("largest", m.path("m")))

	// More traffic: a new file read, and the first one changed under the
	// mount's promise. The open page shows both without a reload.
	second := testkit.Pattern(2<<20, 2)
	put("/n", second)
	read("n", len(second))
	put("/m", testkit.Pattern(4096, 3))
	more := p.wait(t, "the fetched bytes grow", cardAtLeast("fetched-bytes", fetched+float64(len(second))))
	p.wait(t, "a callback break", cardAtLeast("breaks", 1))
	p.wait(t, "the broken file by its path", tableHas("broken", m.path("m")))
	p.wait(t, "charts with several samples", `Number(document.body.dataset.samples) >= 3 ? 1 : 0`)
	if text := p.eval(t, `document.getElementById('v-fetched-bytes').textContent`); !strings.HasSuffix(text, " MiB") {
		t.Errorf("fetched bytes (%v) shown as %q", more, text)
	}
	p.screenshot("")

	p.open(t, serverPage)
	p.wait(t, "a client connected to the server", cardAtLeast("sessions", 1))
	p.wait(t, "requests the server handled", `/^[1-9]/.test(document.querySelector('#card-rpc-rate .sub')?.textContent || '') ? 1 : 0`)
	p.wait(t, "the server's root volume", tableHas("volumes", "root"))
	p.wait(t, "the server's lease in the location database", `document.getElementById('v-lease')?.textContent === 'lease held' ? 1 : 0`)
	p.wait(t, "the server's free disk", cardAtLeast("disk", 1))
	p.screenshot("-server")

	// A proxy's page: what it served, and fetched from its origin.
	paddr := freeAddr(t)
	px := startProxy(t, srv, filepath.Join(t.TempDir(), "proxy"), "--http", paddr)
	r := dial(t, px.addr, "mem", 64<<20)
	if b := testkit.ReadFile(t, r, "/n"); len(b) != len(second) {
		t.Fatalf("read /n through the proxy: %d bytes", len(b))
	}
	proxyPage := "http://" + paddr + "/"
	p.open(t, proxyPage)
	p.wait(t, "the bytes the proxy served", cardAtLeast("served-bytes", float64(len(second))))
	p.wait(t, "the bytes the proxy fetched from its origin", cardAtLeast("origin-bytes", float64(len(second))))
	p.wait(t, "a client connected to the proxy", cardAtLeast("sessions", 1))
	// Its metrics, on the same listener, say the same.
	ps := scrape(t, paddr)
	for _, name := range []string{"hoard_proxy_served_bytes_total", "hoard_proxy_origin_bytes_total"} {
		if v, _ := sum(ps, name); v < float64(len(second)) {
			t.Errorf("the proxy's %s = %v, want at least %d", name, v, len(second))
		}
	}
	p.screenshot("-proxy")
	p.check(t, strings.TrimSuffix(mountPage, "/"), strings.TrimSuffix(serverPage, "/"), strings.TrimSuffix(proxyPage, "/"))
}

// --http beside --metrics at another address: each has its listener,
// serving both.
func TestStatusBesideMetrics(t *testing.T) {
	maddr, haddr := freeAddr(t), freeAddr(t)
	srv := startServer(t, t.TempDir(), "--metrics", maddr, "--http", haddr)
	if !strings.Contains(srv.logs.String(), "metrics at http://"+maddr+"/metrics, status page at http://"+haddr+"/") {
		t.Errorf("the server does not say where it serves what:\n%s", srv.logs)
	}
	for _, addr := range []string{maddr, haddr} {
		if _, ok := sum(scrape(t, addr), "hoard_server_sessions"); !ok {
			t.Errorf("no metrics at %s", addr)
		}
		resp, err := http.Get("http://" + addr + "/status.json")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Kind   string
			Server *struct{ Volumes []struct{ Name string } }
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil || st.Kind != "server" || st.Server == nil || len(st.Server.Volumes) == 0 || st.Server.Volumes[0].Name != "root" {
			t.Errorf("status.json at %s: %+v, %v", addr, st, err)
		}
	}
}

// A server's page in a cell of two: the volumes it holds, read-write or
// a read-only copy of a release, with their read-only sites, and the
// moves and releases under way there, phase by phase as the steps are
// taken (each held until the next: --move-hold is long), passes at the
// source and at the target included.
func TestStatusPageCell(t *testing.T) {
	bin := needChromium(t)
	etcd := startEtcd(t, 1)
	var srvs []*serverProc
	var pages []string
	for i := range 2 {
		addr := freeAddr(t)
		srvs = append(srvs, startServer(t, t.TempDir(), "--etcd", etcd[0].client, "--name", fmt.Sprintf("s%d", i+1),
			"--move-hold", "5m", "--http", addr))
		pages = append(pages, "http://"+addr+"/")
	}
	admin := dial(t, srvs[0].addr, "mem", 16<<20)
	waitAlive(t, admin, 2)
	for _, v := range []string{"sw", "mv"} {
		if _, err := admin.Admin().CreateVolumeOn(v, "s1"); err != nil {
			t.Fatal(err)
		}
	}
	for _, mp := range [][2]string{{"/sw-rw", "%sw"}, {"/mv", "mv"}} {
		if err := admin.Admin().MountVolume(mp[0], mp[1]); err != nil {
			t.Fatal(err)
		}
	}
	w := dial(t, srvs[0].addr, "mem", 128<<20)
	testkit.WriteFile(t, w, "/sw-rw/f", testkit.Pattern(1<<20, 1))
	// More than gRPC's flow control lets a dump send unread.
	testkit.WriteFile(t, w, "/mv/f", testkit.Pattern(48<<20, 2))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, site := range []string{"s1", "s2"} {
		if err := admin.Admin().AddSite("sw", site); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Admin().Release("sw"); err != nil {
		t.Fatal(err)
	}

	p := openBrowser(t, bin)
	p.open(t, pages[1])
	p.waitRow(t, "s2's read-only copy of release 1, and its sites", "volumes", "sw.readonly", "read-only copy | 1 | ", "s1", "s2")
	p.open(t, pages[0])
	p.waitRow(t, "s1's read-write volume, released once to s1 and s2", "volumes", "sw", "read-write | 1 made | ", "s1", "s2")
	p.waitRow(t, "s1's read-only copy beside it", "volumes", "sw.readonly", "read-only copy | 1 | ")
	p.waitRow(t, "s1's volume with no sites", "volumes", "mv", "read-write |  | none |")
	p.waitRow(t, "s1's root", "volumes", "root", "read-write |  | none |")
	p.wait(t, "no move under way", tableHas("moves", "none"))

	// A move of mv to s2, step by step, and a release of sw.
	rpc := pb.NewFileServerClient(cellGRPC(t, srvs[0].addr))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	move := func(step pb.MoveVolumeRequest_Step) {
		t.Helper()
		if _, err := rpc.MoveVolume(ctx, &pb.MoveVolumeRequest{Name: "mv", To: "s2", Step: step}); err != nil {
			t.Fatalf("move step %v: %v", step, err)
		}
	}
	move(pb.MoveVolumeRequest_BEGIN)
	p.waitRow(t, "the move begun", "moves", "mv", "move | begun |  | to s2")
	// A pass: a dump from s1 the test does not read on, and a restore at
	// s2 it sends no more than the dump's first piece to.
	pctx, endPasses := context.WithCancel(ctx)
	dump, err := rpc.DumpVolume(pctx, &pb.DumpVolumeRequest{Name: "mv"})
	if err != nil {
		t.Fatal(err)
	}
	piece, err := dump.Recv()
	if err != nil {
		t.Fatal(err)
	}
	p.waitRow(t, "the move copying", "moves", "mv", "move | copying | ", " s ago | to s2")
	restore, err := pb.NewFileServerClient(cellGRPC(t, srvs[1].addr)).RestoreVolume(pctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := restore.Send(&pb.DumpPiece{Volume: piece.Volume, Name: piece.Name}); err != nil {
		t.Fatal(err)
	}
	p.open(t, pages[1])
	p.waitRow(t, "the move received at s2", "moves", "mv", "move | receiving | ", " s ago | from s1")
	endPasses()
	p.wait(t, "nothing under way at s2 once its pass ends", tableHas("moves", "none"))
	p.open(t, pages[0])
	p.waitRow(t, "the move between passes", "moves", "mv", "move | begun |  | to s2")
	move(pb.MoveVolumeRequest_QUIESCE)
	p.waitRow(t, "the move quiet", "moves", "mv", "move | quiet | ", " s ago | to s2")
	move(pb.MoveVolumeRequest_FREEZE)
	p.waitRow(t, "the move frozen", "moves", "mv", "move | frozen | ", " s ago | to s2")
	if _, err := rpc.ReleaseVolume(ctx, &pb.ReleaseVolumeRequest{Name: "sw", Step: pb.ReleaseVolumeRequest_QUIESCE}); err != nil {
		t.Fatal(err)
	}
	p.waitRow(t, "the release quiet", "moves", "sw", "release | quiet | ", " s ago | to ", "s1", "s2")
	p.screenshot("-cell")
	move(pb.MoveVolumeRequest_ABORT)
	if _, err := rpc.ReleaseVolume(ctx, &pb.ReleaseVolumeRequest{Name: "sw", Step: pb.ReleaseVolumeRequest_ABORT}); err != nil {
		t.Fatal(err)
	}
	p.wait(t, "nothing under way once both are undone", tableHas("moves", "none"))
	p.check(t, strings.TrimSuffix(pages[0], "/"), strings.TrimSuffix(pages[1], "/"))
}

// A cache warmed before its mount started (hoard cache warmup --server
// on the cache directory) holds files no kernel has an inode of: the
// mount's page names them by their paths, not by their FIDs.
func TestStatusNamesWarmedFiles(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	c := dial(t, srv.addr, "mem", 64<<20)
	if err := c.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, c, "/d/big", testkit.Pattern(3<<20, 5))
	testkit.WriteFile(t, c, "/d/small", testkit.Pattern(1<<20, 6))
	c.Close()
	cacheDir := t.TempDir()
	if out, code := run(t, "cache", "warmup", "--server", srv.addr, "--cache", cacheDir, "-r", "/d"); code != 0 {
		t.Fatalf("warmup of the cache directory: exit %d\n%s", code, out)
	}
	addr := freeAddr(t)
	m := startMount(t, srv, cacheDir, "--http", addr)
	var st struct {
		Client struct {
			Largest []struct{ Path, FID string }
		}
	}
	resp, err := http.Get("http://" + addr + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	got := st.Client.Largest
	if len(got) != 2 || got[0].Path != m.path("d/big") || got[1].Path != m.path("d/small") {
		t.Fatalf("the page's largest files: %+v, want %s and %s", got, m.path("d/big"), m.path("d/small"))
	}
}
