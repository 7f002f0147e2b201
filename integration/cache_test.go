package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// lsEntry is a line of hoard cache ls --json.
type lsEntry struct {
	Path string `json:"path"`
	client.FileCache
}

// cacheLs runs hoard cache ls --json and returns its files by base name.
func cacheLs(t *testing.T, args ...string) map[string]lsEntry {
	t.Helper()
	out, code := run(t, append([]string{"cache", "ls", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("hoard cache ls %v: exit %d\n%s", args, code, out)
	}
	m := map[string]lsEntry{}
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var e lsEntry
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("hoard cache ls: %v\n%s", err, out)
		}
		m[filepath.Base(e.Path)] = e
	}
	return m
}

// The cache commands through a mount: ls tells what is cached and why,
// warmup fetches whole files (and resumes), a bypassed file is reported
// unless forced, evict drops what is clean, flush stores what is dirty.
func TestCacheCommands(t *testing.T) {
	srv := startServer(t, t.TempDir())
	c := dial(t, srv.addr, "mem", 64<<20)
	for _, dir := range []string{"/d", "/d/sub", "/big"} {
		if err := c.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 {
		testkit.WriteFile(t, c, fmt.Sprintf("/d/f%02d", i), testkit.Pattern(300<<10, byte(i)))
	}
	testkit.WriteFile(t, c, "/d/sub/deep", testkit.Pattern(1<<20, 99))
	testkit.WriteFile(t, c, "/d/__scratch", testkit.Pattern(600<<10, 7)) // bypassed by its name
	c.Close()
	m := startMount(t, srv, t.TempDir(), "--cache-size", "8M")
	d := m.path("d")

	ls := cacheLs(t, "-r", d)
	if len(ls) != 14 || ls["f00"].Cached != 0 || ls["f00"].Size != 300<<10 || ls["f00"].ChunksTotal == 0 || ls["f00"].Policy != "cache" {
		t.Fatalf("cold ls: %+v", ls)
	}
	if e := ls["__scratch"]; e.Policy != "bypass" || !strings.Contains(e.Why, "__") {
		t.Fatalf("ls of a bypassed file: %+v", e)
	}
	if e := cacheLs(t, d); len(e) != 13 {
		t.Fatalf("ls without -r lists %d files, want the 13 of d itself", len(e))
	}

	// warmup: everything but the bypassed file, reported.
	out, code := run(t, "cache", "warmup", "-r", "--json", d)
	var rep struct {
		Files    int      `json:"files"`
		Bytes    int64    `json:"bytes"`
		Already  int      `json:"already_cached"`
		Bypassed []string `json:"bypassed"`
	}
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil {
		t.Fatalf("warmup: exit %d %v\n%s", code, err, out)
	}
	if rep.Files != 13 || rep.Bytes != 12*300<<10+1<<20 || len(rep.Bypassed) != 1 || !strings.HasSuffix(rep.Bypassed[0], "__scratch") {
		t.Fatalf("warmup report: %+v", rep)
	}
	ls = cacheLs(t, "-r", d)
	for name, e := range ls {
		want := e.Size
		if name == "__scratch" {
			want = 0
		}
		if e.Cached != want || (want > 0 && e.Chunks != e.ChunksTotal) {
			t.Fatalf("after warmup, %s: %+v", name, e)
		}
		if want > 0 && e.PromiseMs <= 0 {
			t.Fatalf("after warmup, %s holds no promise: %+v", name, e)
		}
	}
	// The bytes read are the file's, and come from the cache.
	if got, err := os.ReadFile(filepath.Join(d, "sub/deep")); err != nil || !bytes.Equal(got, testkit.Pattern(1<<20, 99)) {
		t.Fatalf("read after warmup: %v", err)
	}
	// Again: nothing to fetch (resumes where a first run stopped).
	out, code = run(t, "cache", "warmup", "-r", d)
	if code != 0 || !strings.Contains(out, "warmed 0 files") || !strings.Contains(out, "13 were cached already") || !strings.Contains(out, "1 bypassed") {
		t.Fatalf("second warmup: exit %d\n%s", code, out)
	}
	// --force caches the bypassed file, its policy set to cache.
	out, code = run(t, "cache", "warmup", "--force", filepath.Join(d, "__scratch"))
	if e := cacheLs(t, filepath.Join(d, "__scratch"))["__scratch"]; code != 0 || e.Cached != e.Size || e.Policy != "cache" || !strings.Contains(e.Why, "override") {
		t.Fatalf("forced warmup: exit %d %+v\n%s", code, e, out)
	}

	// evict: clean bytes go.
	out, code = run(t, "cache", "evict", "-r", filepath.Join(d, "sub"), filepath.Join(d, "f00"))
	if code != 0 || !strings.Contains(out, "evicted 1.3M from 2 files") {
		t.Fatalf("evict: exit %d\n%s", code, out)
	}
	if ls = cacheLs(t, "-r", d); ls["deep"].Cached != 0 || ls["f00"].Cached != 0 || ls["f01"].Cached != ls["f01"].Size {
		t.Fatalf("after evict: %+v %+v %+v", ls["deep"], ls["f00"], ls["f01"])
	}

	// A file written under a write delegation is dirty until flushed.
	w := testkit.Pattern(2<<20, 3)
	if err := os.WriteFile(filepath.Join(d, "new"), w, 0o644); err != nil {
		t.Fatal(err)
	}
	if e := cacheLs(t, filepath.Join(d, "new"))["new"]; e.Dirty != 2<<20 {
		t.Fatalf("a file just written: %+v", e)
	}
	// An existing file written here: its write delegation shows.
	if err := os.WriteFile(filepath.Join(d, "f01"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e := cacheLs(t, filepath.Join(d, "f01"))["f01"]; e.Delegation != "write" || e.Dirty == 0 {
		t.Fatalf("a file rewritten: %+v", e)
	}
	out, code = run(t, "cache", "evict", filepath.Join(d, "new"))
	if code != 0 || !strings.Contains(out, "kept 2M of writes not yet stored") {
		t.Fatalf("evict of a dirty file: exit %d\n%s", code, out)
	}
	out, code = run(t, "cache", "flush", m.dir)
	if code != 0 || !strings.Contains(out, "of 2 files") || !strings.Contains(out, "stored 2M  /d/new") || !strings.Contains(out, "/d/f01") {
		t.Fatalf("flush: exit %d\n%s", code, out)
	}
	if e := cacheLs(t, filepath.Join(d, "new"))["new"]; e.Dirty != 0 {
		t.Fatalf("after flush: %+v", e)
	}
	other := dial(t, srv.addr, "mem", 64<<20)
	if got := testkit.ReadFile(t, other, "/d/new"); !bytes.Equal(got, w) {
		t.Fatal("the server does not have the flushed bytes")
	}
	// More dirty files than the mount lists: the count is of them all.
	os.Mkdir(filepath.Join(d, "many"), 0o755)
	for i := range 250 {
		if err := os.WriteFile(filepath.Join(d, "many", fmt.Sprint(i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, code = run(t, "cache", "flush", m.dir)
	if code != 0 || !strings.Contains(out, "(and 50 smaller files)") || !strings.Contains(out, "of 250 files") {
		t.Fatalf("flush of 250 files: exit %d\n%s", code, out)
	}

	// stats: the counters as JSON, and live rates with --watch.
	poll.Wait(t, 10*time.Second, "stats.json counting the warmup", func() bool {
		out, code := run(t, "cache", "stats", "--cache", m.cache, "--json")
		var st struct {
			BytesFetched int64 `json:"bytes_fetched"`
		}
		return code == 0 && json.Unmarshal([]byte(out), &st) == nil && st.BytesFetched >= rep.Bytes
	})
	watch := exec.Command(hoardBin, "cache", "stats", "--cache", m.cache, "--watch", "100ms", "--json")
	pipe, _ := watch.StdoutPipe()
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(pipe)
	for i := range 2 {
		var line struct {
			Hits  *float64 `json:"hits_per_s"`
			Stats any      `json:"stats"`
		}
		if !sc.Scan() || json.Unmarshal(sc.Bytes(), &line) != nil || line.Hits == nil || line.Stats == nil {
			t.Fatalf("stats --watch line %d: %q", i, sc.Text())
		}
	}
	watch.Process.Signal(os.Interrupt)
	if err := watch.Wait(); err != nil {
		t.Fatalf("stats --watch on an interrupt: %v", err)
	}

	// Bad input: a path off any mount, one that does not exist, a warmup
	// larger than the cache. Each is named, with a count, exit 1.
	off := filepath.Join(t.TempDir(), "plain")
	os.WriteFile(off, []byte("x"), 0o644)
	out, code = run(t, "cache", "warmup", off, filepath.Join(d, "missing"))
	if code != 1 || !strings.Contains(out, off+": not on a hoard mount") || !strings.Contains(out, "missing: no such file or directory") || !strings.Contains(out, "hoard: 2 files failed") {
		t.Fatalf("warmup of bad paths: exit %d\n%s", code, out)
	}
	for i := range 3 {
		testkit.WriteFile(t, other, fmt.Sprintf("/big/b%d", i), testkit.Pattern(3<<20, byte(i)))
	}
	out, code = run(t, "cache", "warmup", "-r", m.path("big"))
	if code != 1 || !strings.Contains(out, "warmed 2 files") || !strings.Contains(out, "outgrow the cache") {
		t.Fatalf("warmup past the cache's size: exit %d\n%s", code, out)
	}
	if out, code = run(t, "cache", "flush", off); code != 1 || !strings.Contains(out, "not on a hoard mount") {
		t.Fatalf("flush off a mount: exit %d\n%s", code, out)
	}
	if out, code = run(t, "cache", "warmup", "--parallel", "0", d); code != 2 {
		t.Fatalf("--parallel 0: exit %d\n%s", code, out)
	}
}

// The cache commands on a cache directory no mount holds (--server, paths
// in the cell): a warmup fills it before its mount starts, and the mount
// then reads the files from it without fetching; a cache a mount holds
// is refused with what to do instead; evict empties it.
func TestCacheCommandsOffMount(t *testing.T) {
	srv := startServer(t, t.TempDir())
	c := dial(t, srv.addr, "mem", 64<<20)
	for _, dir := range []string{"/w", "/w/sub"} {
		if err := c.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string][]byte{"sub/deep": testkit.Pattern(2<<20, 9)}
	for i := range 5 {
		want[fmt.Sprintf("f%d", i)] = testkit.Pattern(400<<10, byte(i))
	}
	for name, b := range want {
		testkit.WriteFile(t, c, "/w/"+name, b)
	}
	c.Close()
	cacheDir := t.TempDir()
	at := []string{"--server", srv.addr, "--cache", cacheDir, "--cache-size", "64M"}
	cmd := func(args ...string) (string, int) { return run(t, append(append(args[:2:2], at...), args[2:]...)...) }

	if ls := cacheLs(t, append(at, "-r", "/w")...); len(ls) != 6 || ls["f0"].Cached != 0 || ls["deep"].Size != 2<<20 {
		t.Fatalf("ls of a cold cache directory: %+v", ls)
	}
	out, code := cmd("cache", "warmup", "-r", "--json", "/w")
	var rep struct {
		Files int   `json:"files"`
		Bytes int64 `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil || rep.Files != 6 || rep.Bytes != 5*400<<10+2<<20 {
		t.Fatalf("warmup off a mount: exit %d %v %+v\n%s", code, err, rep, out)
	}
	for name, e := range cacheLs(t, append(at, "-r", "/w")...) {
		if e.Cached != e.Size || e.Chunks != e.ChunksTotal {
			t.Fatalf("after warmup, %s: %+v", name, e)
		}
	}
	warmed, err := cache.ReadStats(cacheDir)
	if err != nil {
		t.Fatal(err)
	}

	// A mount on the warmed cache has the files before any read, and
	// reads them without a fetch.
	m := startMount(t, srv, cacheDir)
	for name, e := range cacheLs(t, "-r", m.path("w")) {
		if e.Cached != e.Size {
			t.Fatalf("the mount on the warmed cache, %s: %+v", name, e)
		}
	}
	for name, b := range want {
		if got, err := os.ReadFile(m.path("w/" + name)); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("read %s through the mount: %v", name, err)
		}
	}
	if out, code := cmd("cache", "ls", "/w"); code == 0 || !strings.Contains(out, "a mount holds it") {
		t.Fatalf("ls of a cache a mount holds: exit %d\n%s", code, out)
	}
	m.stop()
	if s, err := cache.ReadStats(cacheDir); err != nil || s.BytesFetched != warmed.BytesFetched {
		t.Fatalf("the mount fetched %d bytes of warmed files (%v)", s.BytesFetched-warmed.BytesFetched, err)
	}

	out, code = cmd("cache", "evict", "-r", "/w")
	if code != 0 || !strings.Contains(out, "from 6 files") {
		t.Fatalf("evict off a mount: exit %d\n%s", code, out)
	}
	for name, e := range cacheLs(t, append(at, "-r", "/w")...) {
		if e.Cached != 0 {
			t.Fatalf("after evict, %s: %+v", name, e)
		}
	}

	// Bad input: a path not in the cell; a memory cache, which would end
	// with the command.
	out, code = cmd("cache", "warmup", "/w/missing", "/w/f0")
	if code != 1 || !strings.Contains(out, "/w/missing: no such file in the cell") || !strings.Contains(out, "1 files failed") {
		t.Fatalf("warmup of a missing path: exit %d\n%s", code, out)
	}
	if out, code = run(t, "cache", "ls", "--server", srv.addr, "--cache", "", "/w"); code != 2 || !strings.Contains(out, "--cache") {
		t.Fatalf("--server with a memory cache: exit %d\n%s", code, out)
	}
}
