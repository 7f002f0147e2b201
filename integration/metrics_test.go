package integration

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hoardfs/hoard/internal/testkit"
)

// scrape reads the metrics at addr: each series (name and labels as
// written) and its value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics at %s: %s", addr, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics at %s: bad line %q", addr, line)
		}
		out[line[:i]] = v
	}
	return out
}

// sum adds the series of metric name whose labels contain every one of
// labels.
func sum(series map[string]float64, name string, labels ...string) (total float64, found bool) {
	for s, v := range series {
		n, l, _ := strings.Cut(s, "{")
		if n != name {
			continue
		}
		ok := true
		for _, want := range labels {
			ok = ok && strings.Contains(l, want)
		}
		if ok {
			total, found = total+v, true
		}
	}
	return total, found
}

// A server and a mount serve their metrics with live numbers, and every
// metric the Grafana dashboard in contrib/ queries is among them.
func TestMetrics(t *testing.T) {
	needFuse(t)
	saddr, maddr := freeAddr(t), freeAddr(t)
	srv := startServer(t, t.TempDir(), "--metrics", saddr)
	m := startMount(t, srv, t.TempDir(), "--metrics", maddr)
	// A file another client wrote, read cold through the mount.
	data := testkit.Pattern(3<<20, 5)
	w := dial(t, srv.addr, "mem", 64<<20)
	testkit.WriteFile(t, w, "/m", data)
	w.Close()
	if b, err := os.ReadFile(m.path("m")); err != nil || len(b) != len(data) {
		t.Fatalf("read: %d bytes, %v", len(b), err)
	}
	if b, err := os.ReadFile(m.path("m")); err != nil || len(b) != len(data) { // again, from the cache
		t.Fatalf("read: %d bytes, %v", len(b), err)
	}
	// Another client's change waits for the mount to acknowledge its
	// break; a file named __ bypasses the cache; a file stored by fsync,
	// and one left dirty under the mount's delegations.
	w2 := dial(t, srv.addr, "mem", 64<<20)
	testkit.WriteFile(t, w2, "/m", []byte("changed"))
	testkit.WriteFile(t, w2, "/__skip", data[:1<<20])
	if b, err := os.ReadFile(m.path("__skip")); err != nil || len(b) != 1<<20 {
		t.Fatalf("read of a bypassed file: %d bytes, %v", len(b), err)
	}
	f, err := os.Create(m.path("synced"))
	if err == nil {
		_, err = f.Write(data[:2<<20])
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(m.path("dirty"), []byte("not stored yet"), 0o644); err != nil {
		t.Fatal(err)
	}

	// A proxy's, reading a file for a client of its own.
	paddr := freeAddr(t)
	px := startProxy(t, srv, filepath.Join(t.TempDir(), "proxy"), "--metrics", paddr)
	pc := dial(t, px.addr, "mem", 64<<20)
	if b := testkit.ReadFile(t, pc, "/__skip"); len(b) != 1<<20 {
		t.Fatalf("read through the proxy: %d bytes", len(b))
	}

	ss, ms, ps := scrape(t, saddr), scrape(t, maddr), scrape(t, paddr)
	for _, c := range []struct {
		what   string
		series map[string]float64
		name   string
		labels []string
		min    float64
	}{
		{"lookups the server answered", ss, "grpc_server_handled_total", []string{`grpc_method="Lookup"`, `grpc_code="OK"`}, 1},
		{"server sessions", ss, "hoard_server_sessions", nil, 1},
		{"server promises", ss, "hoard_server_promises", nil, 1},
		{"server goroutines", ss, "go_goroutines", nil, 1},
		{"bytes the mount fetched", ms, "hoard_cache_fetched_bytes_total", nil, float64(len(data))},
		{"the mount's cache misses", ms, "hoard_cache_misses_total", nil, 1},
		{"bytes in the mount's cache", ms, "hoard_cache_bytes", nil, float64(len(data))},
		{"the mount's promises", ms, "hoard_client_promises", nil, 1},
		{"the mount's requests", ms, "hoard_client_rpcs_total", nil, 1},
		{"the mount's timed fetches", ms, "hoard_client_fetch_duration_seconds_count", nil, float64(len(data) / (256 << 10))},
		{"fetches within 10 s", ms, "hoard_client_fetch_duration_seconds_bucket", []string{`le="10"`}, float64(len(data) / (256 << 10))},
		{"the mount's timed stores", ms, "hoard_client_store_duration_seconds_count", nil, 1},
		{"opens bypassed by name", ms, "hoard_client_bypass_opens_total", []string{`rule="name"`}, 1},
		{"the age of the mount's dirty data", ms, "hoard_client_dirty_age_seconds", nil, 1e-9},
		{"the mount's lost writes", ms, "hoard_client_lost_writes_total", nil, 0},
		{"bytes the server sent on its data channel", ss, "hoard_server_data_sent_bytes_total", nil, float64(len(data))},
		{"bytes the server received on its data channel", ss, "hoard_server_data_received_bytes_total", nil, 2 << 20},
		{"data connections the server accepted", ss, "hoard_server_data_connections_total", nil, 1},
		{"changes that waited for a break", ss, "hoard_server_callback_wait_seconds_count", nil, 1},
		{"bytes the proxy served", ps, "hoard_proxy_served_bytes_total", nil, 1 << 20},
		{"bytes the proxy fetched from its origin", ps, "hoard_proxy_origin_bytes_total", nil, 1 << 20},
	} {
		if v, ok := sum(c.series, c.name, c.labels...); !ok || v < c.min {
			t.Errorf("%s: %s%v = %v (found %v), want at least %v", c.what, c.name, c.labels, v, ok, c.min)
		}
	}

	// The dashboard queries only metrics that exist.
	b, err := os.ReadFile(filepath.Join("..", "contrib", "grafana", "hoard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("contrib/grafana/hoard.json: %v", err)
	}
	names, labels := map[string]bool{}, map[string]bool{}
	label := regexp.MustCompile(`([a-z_]+)="`)
	for _, series := range []map[string]float64{ss, ms, ps} {
		for s := range series {
			n, l, _ := strings.Cut(s, "{")
			names[n] = true
			for _, m := range label.FindAllStringSubmatch(l, -1) {
				labels[m[1]] = true
			}
		}
	}
	metric := regexp.MustCompile(`\b(?:hoard|grpc|go|process)_[a-z0-9_]+`)
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range metric.FindAllString(tg.Expr, -1) {
				if labels[n] {
					continue // grpc_method in "by (grpc_method)"
				}
				queried++
				if !names[n] {
					t.Errorf("dashboard panel %q queries %s, which no server, mount or proxy serves", p.Title, n)
				}
			}
		}
	}
	if queried < 10 {
		t.Fatalf("the dashboard queries %d metrics", queried)
	}
}

// --metrics or --http that cannot be served: one line, exit 2, nothing
// started or made.
func TestEndpointBadAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	data := filepath.Join(t.TempDir(), "data")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"server", "--data", data, "--listen", freeAddr(t), "--metrics", busy.Addr().String()}, "in use"},
		{[]string{"server", "--data", data, "--listen", freeAddr(t), "--metrics", "localhost:notaport"}, "--metrics"},
		{[]string{"server", "--data", data, "--listen", freeAddr(t), "--metrics", "a:b:c"}, "HOST:PORT"},
		{[]string{"proxy", "--origin", "127.0.0.1:1", "--cache", data, "--insecure", "--metrics", busy.Addr().String()}, "in use"},
		{[]string{"server", "--data", data, "--listen", freeAddr(t), "--http", busy.Addr().String()}, "--http " + busy.Addr().String() + ": the address is in use"},
		{[]string{"server", "--data", data, "--listen", freeAddr(t), "--metrics", freeAddr(t), "--http", busy.Addr().String()}, "in use"},
		{[]string{"server", "--data", data, "--listen", freeAddr(t), "--http", "a:b:c"}, "--http a:b:c: want HOST:PORT or PORT"},
		{[]string{"proxy", "--origin", "127.0.0.1:1", "--cache", data, "--insecure", "--http", busy.Addr().String()}, "--http"},
	} {
		out, code := run(t, c.args...)
		if code != 2 || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, c.want) {
			t.Errorf("hoard %s: exit %d: %q", strings.Join(c.args, " "), code, out)
		}
	}
	if _, err := os.Stat(data); err == nil {
		t.Error("a data directory was made")
	}
}
