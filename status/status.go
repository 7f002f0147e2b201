// Package status is a hoard process's live status page: a page at / that
// charts what the process does, and the JSON it polls, /status.json. The
// page and its charting library (uPlot, vendored in assets/) are built
// into the binary: it loads nothing from elsewhere, and works with no
// network beyond the process's own address.
//
// The JSON is one sample of the process's state now; counters are
// totals since the process started (the page turns successive samples
// into rates), gauges are values now. /history.json is the samples of
// the last minutes (Page.Record), which a page charts when it opens.
package status

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path"
	"sync"
	"time"
)

// Status is one sample: what /status.json answers. Only the sections of
// the process's kind are present.
type Status struct {
	// Kind is mount, server or proxy; Name what it serves: a mount
	// point, a listen address.
	Kind string `json:"kind"`
	Name string `json:"name"`
	PID  int    `json:"pid"`
	// Time is when the sample was taken, in Unix milliseconds; Uptime
	// the seconds since the page was set up (the process's start).
	Time   int64   `json:"time"`
	Uptime float64 `json:"uptime"`
	// Brief: a sample for the history, which keeps what the page charts;
	// parts leave out the rest (lists of files, volumes, moves), which
	// cost more to gather.
	Brief  bool    `json:"-"`
	Client *Client `json:"client,omitempty"`
	Server *Server `json:"server,omitempty"`
	Proxy  *Proxy  `json:"proxy,omitempty"`
}

// Client is a mount's cache and protocol state.
type Client struct {
	// CacheBytes is the space the cache holds, of CacheLimit, in
	// CacheFiles files.
	CacheBytes int64 `json:"cache_bytes"`
	CacheLimit int64 `json:"cache_limit"`
	CacheFiles int64 `json:"cache_files"`
	// Hits and Misses count reads served from the cache and reads that
	// had to fetch (reads the kernel serves by passthrough are not
	// seen); FetchedBytes the bytes fetched from servers.
	Hits         int64 `json:"hits"`
	Misses       int64 `json:"misses"`
	FetchedBytes int64 `json:"fetched_bytes"`
	Evictions    int64 `json:"evictions"`
	// DirtyBytes are written and not yet stored (the write-back queue);
	// FlushedBytes counts what the write-back flusher stored.
	DirtyBytes   int64 `json:"dirty_bytes"`
	FlushedBytes int64 `json:"flushed_bytes"`
	RPCs         int64 `json:"rpcs"`
	// Promises and delegations held now.
	Promises         int `json:"promises"`
	ReadDelegations  int `json:"read_delegations"`
	WriteDelegations int `json:"write_delegations"`
	// Breaks counts files whose promise a server broke; Resets the
	// times a server voided them all; Recalls the delegations recalled.
	Breaks  int64 `json:"breaks"`
	Resets  int64 `json:"resets"`
	Recalls int64 `json:"recalls"`
	// Largest are the files holding the most cache space, most first.
	Largest []File `json:"largest"`
	// Broken are the files last invalidated, latest first.
	Broken []Break `json:"broken"`
}

// File is a file's share of the cache.
type File struct {
	// Path is where the mount shows it, if the kernel knows it ("" if
	// not); FID its identity.
	Path  string `json:"path,omitempty"`
	FID   string `json:"fid"`
	Bytes int64  `json:"bytes"`
	Dirty int64  `json:"dirty"`
}

// Break is one file invalidated, by a break or a server's reset.
type Break struct {
	Time int64  `json:"time"` // Unix milliseconds
	Path string `json:"path,omitempty"`
	FID  string `json:"fid"`
}

// Server is a server's (or a proxy's, as its clients' server) load.
type Server struct {
	Sessions    int `json:"sessions"`
	Promises    int `json:"promises"`
	Delegations int `json:"delegations"`
	// Breaks counts promises broken (files, per client); Recalls and
	// Revokes delegations recalled and revoked; Resets the reset
	// messages sent.
	Breaks  int64 `json:"breaks"`
	Recalls int64 `json:"recalls"`
	Revokes int64 `json:"revokes"`
	Resets  int64 `json:"resets"`
	// RPCs counts requests handled.
	RPCs int64 `json:"rpcs"`
	// Volumes are those the server holds (a server's, not a proxy's).
	Volumes []Volume `json:"volumes,omitempty"`
	// Cell is the server's standing in its cell (a server's in one).
	Cell *Cell `json:"cell,omitempty"`
	// Moves are the moves and releases under way at the server.
	Moves []Move `json:"moves,omitempty"`
}

// Cell is a server's standing in its cell: whether it holds its lease in
// the location database (without it, it changes no location, and the
// cell may count it dead), and its disk's space.
type Cell struct {
	Name     string `json:"name"`
	Lease    bool   `json:"lease"`
	DiskSize uint64 `json:"disk_size"`
	DiskFree uint64 `json:"disk_free"`
}

// Volume is one volume a server holds.
type Volume struct {
	ID    uint64 `json:"id"`
	Name  string `json:"name"`
	Used  uint64 `json:"used"`
	Quota uint64 `json:"quota"`
	Files uint64 `json:"files"`
	// ReadOnly: a read-only copy (NAME.readonly), holding release
	// Release of the read-write volume (0: none published here yet).
	ReadOnly bool   `json:"read_only,omitempty"`
	Release  uint64 `json:"release,omitempty"`
	// As the location database says (a server's in a cell): RW is the
	// server holding the read-write volume, Sites those holding its
	// read-only copies (of release Released), Pending those the next
	// release adds.
	RW       string   `json:"rw,omitempty"`
	Sites    []string `json:"sites,omitempty"`
	Pending  []string `json:"pending,omitempty"`
	Released uint64   `json:"released,omitempty"`
}

// Move is a move or a release of a volume under way at a server
// (server.Underway).
type Move struct {
	Volume string `json:"volume"`
	ID     uint64 `json:"id"`
	Kind   string `json:"kind"`
	Phase  string `json:"phase"`
	// Since is when the phase began, in Unix milliseconds (0: not known).
	Since int64 `json:"since,omitempty"`
	// Peers are the servers at the other end: the target or the sites,
	// or, receiving, the source.
	Peers []string `json:"peers"`
}

// Proxy is a proxy's store and its traffic with its origin.
type Proxy struct {
	Origin string `json:"origin"`
	// Hits and Misses count chunk reads from the store and from the
	// origin; ServedBytes the bytes served to clients, FetchedBytes
	// those fetched from the origin.
	Hits         int64 `json:"hits"`
	Misses       int64 `json:"misses"`
	ServedBytes  int64 `json:"served_bytes"`
	FetchedBytes int64 `json:"fetched_bytes"`
	StoreBytes   int64 `json:"store_bytes"`
	StoreLimit   int64 `json:"store_limit"`
	StoreFiles   int64 `json:"store_files"`
	Evictions    int64 `json:"evictions"`
	// OriginRPCs counts requests sent to the origin; the delegations are
	// those held from it.
	OriginRPCs             int64 `json:"origin_rpcs"`
	OriginReadDelegations  int   `json:"origin_read_delegations"`
	OriginWriteDelegations int   `json:"origin_write_delegations"`
}

// A Part fills in its section of a sample.
type Part func(*Status)

// Page serves a process's status page and its samples. Set it up with
// SetKind, SetName and Add before it is served or Record starts.
type Page struct {
	start time.Time
	now   func() time.Time
	kind  string
	name  string
	parts []Part

	// mu guards the last sample, handed again to polls that come within
	// reuse of it: many open pages cost what one does.
	mu   sync.Mutex
	last []byte
	at   time.Time

	// hmu guards the history: the last samples Record took, hist[hnext-1]
	// the latest, hn of them.
	hmu   sync.Mutex
	hist  [historyKeep]Status
	hnext int
	hn    int
}

// reuse is how long a sample answers polls.
const reuse = 250 * time.Millisecond

// The history: a sample every two seconds for the last ten minutes (what
// the page charts), taken whether or not anyone looks, so that a page
// opened during trouble shows what led to it. The samples are brief
// (Status.Brief), of a bounded size: nobody looking costs one small
// sample every two seconds, and a few hundred kilobytes.
const (
	historyEvery = 2 * time.Second
	historyKeep  = 300
)

// New is an empty page; its uptime counts from now.
func New() *Page { return &Page{start: time.Now(), now: time.Now} }

// SetKind sets what the process is: mount, server or proxy.
func (p *Page) SetKind(kind string) { p.kind = kind }

// SetName sets what the process serves, as the page titles it.
func (p *Page) SetName(name string) { p.name = name }

// Add adds parts to each sample.
func (p *Page) Add(parts ...Part) { p.parts = append(p.parts, parts...) }

// Sample takes a sample now.
func (p *Page) Sample() Status { return p.sample(false) }

func (p *Page) sample(brief bool) Status {
	now := p.now()
	st := Status{Kind: p.kind, Name: p.name, PID: os.Getpid(), Time: now.UnixMilli(), Uptime: now.Sub(p.start).Seconds(), Brief: brief}
	for _, part := range p.parts {
		part(&st)
	}
	return st
}

// Record keeps the history, until ctx is done.
func (p *Page) Record(ctx context.Context) {
	p.keep()
	t := time.NewTicker(historyEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.keep()
		}
	}
}

// keep adds a brief sample to the history, dropping the oldest past
// historyKeep.
func (p *Page) keep() {
	st := p.sample(true)
	p.hmu.Lock()
	defer p.hmu.Unlock()
	p.hist[p.hnext] = st
	p.hnext = (p.hnext + 1) % historyKeep
	p.hn = min(p.hn+1, historyKeep)
}

// history is the samples kept, oldest first.
func (p *Page) history() []Status {
	p.hmu.Lock()
	defer p.hmu.Unlock()
	out := make([]Status, 0, p.hn)
	for i := p.hn; i > 0; i-- {
		out = append(out, p.hist[(p.hnext-i+historyKeep)%historyKeep])
	}
	return out
}

func (p *Page) sampleJSON() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last != nil && time.Since(p.at) < reuse {
		return p.last
	}
	b, err := json.Marshal(p.Sample())
	if err != nil {
		panic(err) // plain structs: cannot fail
	}
	p.last, p.at = b, time.Now()
	return p.last
}

//go:embed web assets
var files embed.FS

// asset is a file of the page, ready to serve.
type asset struct {
	body  []byte
	ctype string
	etag  string
	// immutable: the vendored library, whose path names its version.
	immutable bool
}

// assets maps a URL path to the file served there: the page's own files
// at the top, uPlot under /assets/uplot-VERSION/.
var assets = func() map[string]*asset {
	out := map[string]*asset{}
	add := func(url, name string, immutable bool) {
		b, err := files.ReadFile(name)
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(b)
		out[url] = &asset{body: b, ctype: ctypes[path.Ext(name)],
			etag: `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`, immutable: immutable}
	}
	add("/", "web/index.html", false)
	add("/app.js", "web/app.js", false)
	add("/style.css", "web/style.css", false)
	ents, err := fs.ReadDir(files, "assets")
	if err != nil {
		panic(err)
	}
	for _, e := range ents {
		if ext := path.Ext(e.Name()); ext == ".js" || ext == ".css" {
			add("/assets/uplot-"+UPlotVersion+"/"+e.Name(), "assets/"+e.Name(), true)
		}
	}
	return out
}()

// ctypes are the content types of the page's files, set here rather than
// taken from the system's MIME table, which varies.
var ctypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
}

// UPlotVersion is the version of uPlot in assets/.
const UPlotVersion = "1.6.32"

// csp lets the page load and fetch only from its own origin: nothing it
// does reaches the network beyond the process.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// ServeHTTP serves the page, its files, /status.json and /history.json.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	if r.URL.Path == "/status.json" {
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		w.Write(p.sampleJSON())
		return
	}
	if r.URL.Path == "/history.json" {
		b, err := json.Marshal(p.history())
		if err != nil {
			panic(err) // plain structs: cannot fail
		}
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		w.Write(b)
		return
	}
	a := assets[r.URL.Path]
	if a == nil {
		http.NotFound(w, r)
		return
	}
	h.Set("Content-Type", a.ctype)
	h.Set("ETag", a.etag)
	if a.immutable {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		// A new binary may serve a new page: check, cheaply, by ETag.
		h.Set("Cache-Control", "no-cache")
	}
	if r.URL.Path == "/" {
		h.Set("Content-Security-Policy", csp)
		h.Set("Referrer-Policy", "no-referrer")
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}
