package integration

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client"
)

// proxyStats waits for the proxy to publish statistics written after
// since, and returns them.
func proxyStats(t *testing.T, dir string, since time.Time) cache.Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := cache.ReadStats(filepath.Join(dir, "cache"))
		if err == nil && s.Updated.After(since) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy statistics not updated since %v: %v", since, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
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
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"))
	px := startProxy(t, origin, filepath.Join(tmp, "proxy"))
	direct := dial(t, origin.addr, "mem", 64<<20)
	data := randomBytes(1, 3<<20+12345)
	writeFile(t, direct, "/big", data)

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
	s := proxyStats(t, px.data, time.Now())
	if s.BytesFetched != int64(len(data)) {
		t.Fatalf("the proxy fetched %d bytes from the origin for %d readers of a %d-byte file; want the file once", s.BytesFetched, readers, len(data))
	}

	// A late reader, and a listing and a stat through the proxy.
	late := dial(t, px.addr, "mem", 64<<20)
	if got := readFile(t, late, "/big"); !bytes.Equal(got, data) {
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
	if s := proxyStats(t, px.data, time.Now()); s.BytesFetched != int64(len(data)) {
		t.Fatalf("the proxy fetched %d bytes from the origin after a late reader; want %d", s.BytesFetched, len(data))
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

	writeFile(t, direct, "/f", []byte("one"))
	for _, c := range []*client.Client{a, b, direct} {
		if got := string(readFile(t, c, "/f")); got != "one" {
			t.Fatalf("read %q, want one", got)
		}
	}
	// Every client now holds a promise on /f: each change below must
	// break them before its close returns.
	steps := []struct {
		who  *client.Client
		name string
		data string
	}{{direct, "origin client", "two"}, {a, "proxy client a", "three, longer"}, {b, "proxy client b", "4"}}
	for _, step := range steps {
		writeFile(t, step.who, "/f", []byte(step.data))
		for _, c := range []*client.Client{a, b, direct} {
			if got := string(readFile(t, c, "/f")); got != step.data {
				t.Fatalf("after a write by the %s, a client read %q, want %q", step.name, got, step.data)
			}
		}
	}
	// Names too: a file made at the origin shows in the proxy clients'
	// cached listings, one made through the proxy at the origin.
	if _, err := a.ReadDir("/"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, direct, "/g", []byte("g"))
	if err := b.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := a.Rename("/g", "/d/g"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client.Client{a, b, direct} {
		ents, err := c.ReadDir("/d")
		if err != nil || len(ents) != 1 || ents[0].Name != "g" {
			t.Fatalf("listing of /d: %v %v, want g", ents, err)
		}
		if got := string(readFile(t, c, "/d/g")); got != "g" {
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

// With the origin away, what the proxy holds a promise on is still served;
// anything else fails after the proxy's timeout, with a clear error; once
// the origin is back, everything works again without a restart.
func TestProxyOriginAway(t *testing.T) {
	tmp := t.TempDir()
	origin := startServer(t, filepath.Join(tmp, "origin"))
	px := startProxy(t, origin, filepath.Join(tmp, "proxy"), "--timeout", "2s")
	direct := dial(t, origin.addr, "mem", 64<<20)
	cached := randomBytes(2, 700<<10)
	writeFile(t, direct, "/cached", cached)
	writeFile(t, direct, "/cold", []byte("cold"))
	direct.Close()
	warm := dial(t, px.addr, "mem", 64<<20)
	if !bytes.Equal(readFile(t, warm, "/cached"), cached) {
		t.Fatal("first read through the proxy")
	}

	origin.kill9()
	// A new client has nothing cached: every byte it reads comes from
	// the proxy.
	fresh := dial(t, px.addr, "mem", 64<<20)
	if !bytes.Equal(readFile(t, fresh, "/cached"), cached) {
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
	deadline := time.Now().Add(15 * time.Second)
	for {
		f, err := fresh.Open("/cold", os.O_RDONLY, 0)
		if err == nil {
			buf := make([]byte, 10)
			n, _ := f.Read(buf)
			f.Close()
			if string(buf[:n]) != "cold" {
				t.Fatalf("read %q after the origin came back", buf[:n])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not recover after the origin came back: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// And a change through the proxy reaches the restarted origin.
	writeFile(t, fresh, "/after", []byte("after"))
	again := dial(t, origin.addr, "mem", 64<<20)
	if got := string(readFile(t, again, "/after")); got != "after" {
		t.Fatalf("origin has %q for a file written through the proxy", got)
	}
}
