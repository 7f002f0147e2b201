package status

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/vldb"
)

func get(t *testing.T, h http.Handler, path string, header ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

// The page and every file it names are served, with their content
// types and cache headers; the vendored library is cached for good, the
// rest revalidated by ETag.
func TestAssets(t *testing.T) {
	p := New()
	resp := get(t, p, "/")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("/: %s, %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("/: Content-Security-Policy %q", csp)
	}
	var body strings.Builder
	b := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(b)
		body.Write(b[:n])
		if err != nil {
			break
		}
	}
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(body.String(), -1)
	want := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
	seen := 0
	for _, r := range refs {
		ref := r[1]
		if strings.HasPrefix(ref, "data:") || ref == "status.json" || ref == "metrics" {
			continue
		}
		if strings.Contains(ref, "//") {
			t.Errorf("the page loads %s from elsewhere", ref)
			continue
		}
		seen++
		resp := get(t, p, "/"+ref)
		ext := ref[strings.LastIndexByte(ref, '.'):]
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != want[ext] || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %s, %q", ref, resp.Status, resp.Header.Get("Content-Type"))
		}
		cc, etag := resp.Header.Get("Cache-Control"), resp.Header.Get("ETag")
		if vendored := strings.HasPrefix(ref, "assets/uplot-"+UPlotVersion+"/"); vendored != strings.Contains(cc, "immutable") || etag == "" {
			t.Errorf("%s: Cache-Control %q, ETag %q", ref, cc, etag)
		}
		if again := get(t, p, "/"+ref, "If-None-Match", etag); again.StatusCode != http.StatusNotModified {
			t.Errorf("%s with its ETag: %s", ref, again.Status)
		}
	}
	if seen != 4 {
		t.Errorf("the page names %d files of its own, want 4 (uPlot's script and style, app.js, style.css)", seen)
	}
	for _, path := range []string{"/nothing", "/assets/LICENSE", "/web/app.js"} {
		if resp := get(t, p, path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %s", path, resp.Status)
		}
	}
	req := httptest.NewRequest(http.MethodPost, "/status.json", nil)
	w := httptest.NewRecorder()
	p.ServeHTTP(w, req)
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", w.Code)
	}
}

// status.json is a sample of the parts, never cached; the breaks list
// keeps the latest, with the paths they had when they came.
func TestSample(t *testing.T) {
	p := New()
	p.SetKind("mount")
	p.SetName("/mnt")
	var b Breaks
	var heard int
	on := b.Wrap(func(f []node.FID) { heard += len(f) }, func(f node.FID) (string, bool) {
		return "/mnt/f" + f.String(), f.Vnode%2 == 0
	})
	for i := range 25 {
		on([]node.FID{{Volume: 1, Vnode: uint64(i), Unique: 1}})
	}
	on(nil)
	if heard != 25 {
		t.Fatalf("the wrapped func heard of %d files, want 25", heard)
	}
	got := b.recent()
	if len(got) != keptBreaks || got[0].fid.Vnode != 24 || got[keptBreaks-1].fid.Vnode != 15 || got[0].path != "/mnt/f1.24.1" || got[1].path != "" {
		t.Fatalf("recent breaks: %+v", got)
	}
	p.Add(func(st *Status) { st.Server = &Server{Sessions: 3} }, VolumesPart(func() ([]node.Volume, error) {
		return []node.Volume{{ID: 1, Name: "root"}}, nil
	}, nil, ""))
	resp := get(t, p, "/status.json")
	if resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("status.json: %q, %q", resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"))
	}
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Kind != "mount" || st.Name != "/mnt" || st.Time == 0 || st.Server == nil || st.Server.Sessions != 3 || len(st.Server.Volumes) != 1 || st.Server.Volumes[0].Name != "root" {
		t.Errorf("status.json: %+v", st)
	}
}

// The history keeps the last historyKeep samples, oldest first, each
// brief: the parts skip what the page does not chart (the largest files
// visit the whole cache). /history.json serves them.
func TestHistory(t *testing.T) {
	p := New()
	p.SetKind("mount")
	clock := time.Unix(1_700_000_000, 0)
	p.now = func() time.Time { return clock }
	var fetched int64
	largest := 0
	p.Add(MountPart(func() client.Stats { return client.Stats{Stats: cache.Stats{BytesFetched: fetched}} },
		func(int) []cache.Usage { largest++; return nil }, func(node.FID) (string, bool) { return "", false }, nil, nil))
	if got := get(t, p, "/history.json"); got.StatusCode != http.StatusOK {
		t.Fatalf("empty history: %s", got.Status)
	}
	for i := range historyKeep + 5 {
		fetched = int64(i) << 20
		p.keep()
		clock = clock.Add(historyEvery)
	}
	if largest != 0 {
		t.Errorf("the history's samples listed the largest files %d times", largest)
	}
	resp := get(t, p, "/history.json")
	if resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("history.json: %q, %q", resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"))
	}
	var h []Status
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	if len(h) != historyKeep {
		t.Fatalf("history of %d samples, want the last %d", len(h), historyKeep)
	}
	start := time.Unix(1_700_000_000, 0).Add(5 * historyEvery).UnixMilli()
	for i, st := range h {
		if st.Time != start+int64(i)*historyEvery.Milliseconds() || st.Client == nil || st.Client.FetchedBytes != int64(i+5)<<20 || st.Kind != "mount" {
			t.Fatalf("sample %d of the history: %+v %+v", i, st, st.Client)
		}
	}
	// A poll's sample is whole.
	if st := p.Sample(); st.Client.Largest == nil || largest != 1 {
		t.Errorf("a poll's sample: largest %v, listed %d times", st.Client.Largest, largest)
	}
}

// locations is a location database of a few volumes.
type locations map[uint64]vldb.Volume

func (l locations) Volume(id uint64) (vldb.Volume, bool) { v, ok := l[id]; return v, ok }

func (l locations) ByROID(id uint64) (vldb.Volume, bool) {
	for _, v := range l {
		if v.ROID == id {
			return v, true
		}
	}
	return vldb.Volume{}, false
}

// A server's volumes say which are read-only copies, of which release,
// and where the cell has each; its moves and releases under way are
// listed as the server has them.
func TestVolumesAndMoves(t *testing.T) {
	db := locations{
		1: {ID: 1, Name: "root", RW: "s2"},
		2: {ID: 2, Name: "sw", RW: "s1", RO: []string{"s2", "s3"}, Pending: []string{"s4"}, Released: 3, ROID: 5},
		3: {ID: 3, Name: "docs", RW: "s1", RO: []string{"s3"}, Pending: []string{"s2"}, Released: 1, ROID: 6},
	}
	since := time.UnixMilli(1_700_000_000_000)
	p := New()
	p.Add(VolumesPart(func() ([]node.Volume, error) {
		return []node.Volume{{ID: 1, Name: "root"}, {ID: 5, Name: "sw.readonly"}, {ID: 6, Name: "docs.readonly"}, {ID: 9, Name: "lost"}}, nil
	}, db, "s2"), MovesPart(func() []server.Underway {
		return []server.Underway{{Volume: 1, Name: "root", Kind: "move", Phase: "frozen", Since: since, Peers: []string{"s3"}},
			{Volume: 3, Name: "docs", Kind: "release", Phase: "receiving", Peers: []string{"s1"}}}
	}))
	var st Status
	if err := json.NewDecoder(get(t, p, "/status.json").Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	want := []Volume{
		{ID: 1, Name: "root", RW: "s2"},
		{ID: 5, Name: "sw.readonly", ReadOnly: true, Release: 3, RW: "s1", Sites: []string{"s2", "s3"}, Pending: []string{"s4"}, Released: 3},
		{ID: 6, Name: "docs.readonly", ReadOnly: true, RW: "s1", Sites: []string{"s3"}, Pending: []string{"s2"}, Released: 1},
		{ID: 9, Name: "lost"},
	}
	if st.Server == nil || !slices.EqualFunc(st.Server.Volumes, want, func(a, b Volume) bool {
		return a.ID == b.ID && a.Name == b.Name && a.ReadOnly == b.ReadOnly && a.Release == b.Release && a.RW == b.RW &&
			slices.Equal(a.Sites, b.Sites) && slices.Equal(a.Pending, b.Pending) && a.Released == b.Released
	}) {
		t.Fatalf("volumes: %+v", st.Server)
	}
	moves := st.Server.Moves
	if len(moves) != 2 || moves[0].Volume != "root" || moves[0].Since != since.UnixMilli() || moves[0].Phase != "frozen" || moves[0].Peers[0] != "s3" ||
		moves[1].Kind != "release" || moves[1].Since != 0 || moves[1].Peers[0] != "s1" {
		t.Fatalf("moves: %+v", moves)
	}
}

// The largest files are named by the kernel's paths, else by the path
// their cache entry keeps, else by the name they had last time.
func TestLargestNamed(t *testing.T) {
	f := func(v uint64) node.FID { return node.FID{Volume: 1, Vnode: v, Unique: 1} }
	inKernel, kept, unknown := f(1), f(2), f(3)
	keptPath := "/w"
	inKernelNow := true
	part := MountPart(func() client.Stats { return client.Stats{} },
		func(int) []cache.Usage {
			return []cache.Usage{{FID: inKernel, Path: "/old"}, {FID: kept, Path: keptPath}, {FID: unknown}}
		},
		func(fid node.FID) (string, bool) { return "/mnt/k", fid == inKernel && inKernelNow },
		func(p string) string { return "/mnt" + p }, nil)
	var st Status
	part(&st)
	got := st.Client.Largest
	if len(got) != 3 || got[0].Path != "/mnt/k" || got[1].Path != "/mnt/w" || got[2].Path != "" {
		t.Fatalf("largest: %+v", got)
	}
	// The kernel forgets the first: its last name outlives the entry's.
	inKernelNow = false
	st = Status{}
	part(&st)
	if got := st.Client.Largest; got[0].Path != "/mnt/k" || got[1].Path != "/mnt/w" {
		t.Fatalf("second sample: %+v", got)
	}
}
