package integration

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

func dialOpts(t *testing.T, o client.Options) *pathfs.FS {
	t.Helper()
	o.DialTimeout, o.RPCTimeout = 5*time.Second, 10*time.Second
	c, err := cellDial(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readSeq reads a file front to back in 64 KiB reads.
func readSeq(t *testing.T, c *pathfs.FS, name string) []byte {
	t.Helper()
	f, err := c.Open(name, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// The policy rules, in their order, and what each does to the cache.
func TestPolicyRules(t *testing.T) {
	srv := startServer(t, t.TempDir())
	w := dial(t, srv.addr, "mem", 64<<20)
	if _, err := w.Admin().CreateVolume("__stream"); err != nil {
		t.Fatal(err)
	}
	if err := w.Admin().MountVolume("/stream", "__stream"); err != nil {
		t.Fatal(err)
	}
	small := testkit.Pattern(600<<10, 1)
	for _, name := range []string{"/plain", "/__skip", "/stream/data", "/stream/++keep"} {
		testkit.WriteFile(t, w, name, small)
	}
	c := dialOpts(t, client.Options{Server: srv.addr, CacheDir: t.TempDir(), CacheSize: 64 << 20})
	cases := []struct {
		name   string
		bypass bool
		why    string
	}{
		{"/plain", false, "small file"},
		{"/__skip", true, "name starts with __"},
		{"/stream/data", true, "volume __stream"},
		{"/stream/++keep", false, "name starts with ++"},
	}
	for _, tc := range cases {
		d, err := c.Policy(tc.name)
		if err != nil || d.Bypass != tc.bypass || !strings.Contains(d.Why, tc.why) {
			t.Errorf("%s: %v %v, want bypass=%v because %q", tc.name, d, err, tc.bypass, tc.why)
		}
		before := c.Client().Stats().BytesCached
		if got := readSeq(t, c, tc.name); !bytes.Equal(got, small) {
			t.Fatalf("%s read back wrong", tc.name)
		}
		grew := c.Client().Stats().BytesCached > before
		if grew == tc.bypass {
			t.Errorf("%s: bypass=%v but the cache grew=%v", tc.name, tc.bypass, grew)
		}
	}

	// An override beats the name, survives a restart of the client, and
	// a directory's override is inherited by its files.
	dir := t.TempDir()
	o := dialOpts(t, client.Options{Server: srv.addr, CacheDir: dir, CacheSize: 64 << 20})
	if err := o.SetPolicy("/__skip", policy.Cache, false); err != nil {
		t.Fatal(err)
	}
	if err := o.SetPolicy("/stream", policy.Cache, false); err != nil {
		t.Fatal(err)
	}
	o.Close()
	o2 := dialOpts(t, client.Options{Server: srv.addr, CacheDir: dir, CacheSize: 64 << 20})
	for _, name := range []string{"/__skip", "/stream/data"} {
		if d, _ := o2.Policy(name); d.Bypass || !strings.Contains(d.Why, "override") {
			t.Errorf("%s after a restart: %v", name, d)
		}
	}
	if err := o2.SetPolicy("/stream", "sometimes", false); err == nil {
		t.Error("a bad policy was accepted")
	}

	// The size threshold.
	th := dialOpts(t, client.Options{Server: srv.addr, CacheDir: t.TempDir(), CacheSize: 64 << 20, BypassThreshold: 512 << 10})
	if d, _ := th.Policy("/plain"); !d.Bypass || !strings.Contains(d.Why, "threshold") {
		t.Errorf("threshold: %v", d)
	}
}

// auto: a large file that fits in the cache's free space is cached on its
// first read. One that would evict: read once, sequentially, it is not
// admitted; a second use is; a random read admits at once.
func TestPolicyAuto(t *testing.T) {
	srv := startServer(t, t.TempDir())
	w := dial(t, srv.addr, "mem", 64<<20)
	big := testkit.Pattern(3<<20, 2)
	filler := testkit.Pattern(6<<20, 3)
	testkit.WriteFile(t, w, "/big", big)
	testkit.WriteFile(t, w, "/big2", big)
	testkit.WriteFile(t, w, "/filler", filler)

	roomy := dialOpts(t, client.Options{Server: srv.addr, CacheDir: t.TempDir(), CacheSize: 64 << 20, AutoMin: 1 << 20})
	for range 2 {
		if got := readSeq(t, roomy, "/big"); !bytes.Equal(got, big) {
			t.Fatal("read wrong")
		}
	}
	if st := roomy.Client().Stats(); st.BytesCached != int64(len(big)) || st.BytesFetched != int64(len(big)) {
		t.Fatalf("two reads of a file with room to spare: %d bytes cached, %d fetched; want it cached once", st.BytesCached, st.BytesFetched)
	}

	// 8 MiB, 6 of them taken: the 3 MiB file would evict.
	c := dialOpts(t, client.Options{Server: srv.addr, CacheDir: t.TempDir(), CacheSize: 8 << 20, AutoMin: 1 << 20})
	if got := readSeq(t, c, "/filler"); !bytes.Equal(got, filler) {
		t.Fatal("filler read wrong")
	}
	if got := readSeq(t, c, "/big"); !bytes.Equal(got, big) {
		t.Fatal("first read wrong")
	}
	if cached := c.Client().Stats().BytesCached; cached != int64(len(filler)) {
		t.Fatalf("a first sequential read that would evict cached %d bytes", cached-int64(len(filler)))
	}
	fetched := c.Client().Stats().BytesFetched
	if got := readSeq(t, c, "/big"); !bytes.Equal(got, big) {
		t.Fatal("second read wrong")
	}
	if c.Client().Stats().BytesCached < int64(len(big)) {
		t.Fatalf("a second use was not admitted: %d bytes cached", c.Client().Stats().BytesCached)
	}
	if got := readSeq(t, c, "/big"); !bytes.Equal(got, big) || c.Client().Stats().BytesFetched-fetched != int64(len(big)) {
		t.Fatalf("third read fetched again: %d bytes since the first", c.Client().Stats().BytesFetched-fetched)
	}

	// A random read admits on the first use.
	f, _ := c.Open("/big2", os.O_RDONLY, 0)
	p := make([]byte, 100)
	f.ReadAt(p, 2<<20)
	if !bytes.Equal(p, big[2<<20:2<<20+100]) {
		t.Fatal("random read wrong")
	}
	if f.Bypassed() {
		t.Fatal("still bypassing after a random read")
	}
	f.Close()
}

// Writes to a bypassed file go through to the server; the writer reads its
// own writes; other clients see them after close.
func TestBypassWrites(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dialOpts(t, client.Options{Server: srv.addr, CacheDir: t.TempDir(), CacheSize: 64 << 20})
	b := dial(t, srv.addr, "mem", 64<<20)
	f, err := a.Open("/__log", os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Bypassed() {
		t.Fatal("__log is not bypassed")
	}
	want := testkit.Pattern(9<<20+123, 4)
	for off := 0; off < len(want); off += 100000 {
		if _, err := f.Write(want[off:min(off+100000, len(want))]); err != nil {
			t.Fatal(err)
		}
	}
	f.WriteAt([]byte("PATCH"), 1000)
	copy(want[1000:], "PATCH")
	got := make([]byte, 5)
	if _, err := f.ReadAt(got, 1000); err != nil || string(got) != "PATCH" {
		t.Fatalf("read own write: %q %v", got, err)
	}
	if st, _ := f.Stat(); st.Size != uint64(len(want)) {
		t.Fatalf("size %d", st.Size)
	}
	// One read across many chunks.
	across := make([]byte, 3<<20)
	if n, err := f.ReadAt(across, 100); err != nil || n != len(across) || !bytes.Equal(across, want[100:100+len(across)]) {
		t.Fatalf("read across chunks: %d %v", n, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testkit.ReadFile(t, b, "/__log"); !bytes.Equal(got, want) {
		t.Fatal("another client reads different bytes")
	}
	if cached := a.Client().Stats().BytesCached; cached != 0 {
		t.Fatalf("bypassed writes put %d bytes in the cache", cached)
	}
	// Truncate and append through a bypassed handle.
	g, _ := a.Open("/__log", os.O_RDWR|os.O_APPEND, 0)
	g.Truncate(10)
	g.Write([]byte("end"))
	g.Close()
	if got := testkit.ReadFile(t, b, "/__log"); !bytes.Equal(got, append(want[:10:10], "end"...)) {
		t.Fatalf("after truncate and append: %q", got)
	}
}

// A file switched to bypass while it has unstored writes stores them first.
func TestPolicySwitchKeepsWrites(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dialOpts(t, client.Options{Server: srv.addr, CacheDir: t.TempDir(), CacheSize: 64 << 20})
	b := dial(t, srv.addr, "mem", 64<<20)
	f, _ := a.Create("/f")
	f.Write([]byte("written before the switch"))
	if err := a.SetPolicy("/f", policy.Bypass, false); err != nil {
		t.Fatal(err)
	}
	if got := testkit.ReadFile(t, b, "/f"); string(got) != "written before the switch" {
		t.Fatalf("after the switch the server has %q", got)
	}
	f.Write([]byte(" and after"))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testkit.ReadFile(t, b, "/f"); string(got) != "written before the switch and after" {
		t.Fatalf("final %q", got)
	}
	g, _ := a.Open("/f", os.O_RDONLY, 0)
	if !g.Bypassed() || !strings.Contains(g.Policy().Why, "override") {
		t.Fatalf("reopened: bypass=%v %v", g.Bypassed(), g.Policy())
	}
	g.Close()
}

// hoard cache policy: on a remote path with --server, and on a mount.
func TestPolicyCLI(t *testing.T) {
	srv := startServer(t, t.TempDir())
	w := dial(t, srv.addr, "mem", 16<<20)
	testkit.WriteFile(t, w, "/__x", []byte("x"))
	cacheDir := t.TempDir()
	out, code := run(t, "cache", "policy", "/__x", "--server", srv.addr, "--cache", cacheDir)
	if code != 0 || !strings.Contains(out, "bypass (name starts with __)") {
		t.Fatalf("policy of /__x: %d %q", code, out)
	}
	if out, code := run(t, "cache", "policy", "/__x", "cache", "--server", srv.addr, "--cache", cacheDir); code != 0 {
		t.Fatalf("set: %d %q", code, out)
	}
	out, _ = run(t, "cache", "policy", "/__x", "--server", srv.addr, "--cache", cacheDir)
	if !strings.Contains(out, "cache (override on the file)") {
		t.Fatalf("after set: %q", out)
	}
	if out, code := run(t, "cache", "policy", "/__x", "never", "--server", srv.addr, "--cache", cacheDir); code != 2 {
		t.Fatalf("bad mode: %d %q", code, out)
	}

	needFuse(t)
	m := startMount(t, srv, t.TempDir())
	out, code = run(t, "cache", "policy", m.path("__x"))
	if code != 0 || !strings.Contains(out, "bypass (name starts with __)") {
		t.Fatalf("policy on the mount: %d %q", code, out)
	}
	if out, code := run(t, "cache", "policy", m.path("__x"), "cache"); code != 0 {
		t.Fatalf("set on the mount: %d %q", code, out)
	}
	if out, _ := run(t, "cache", "policy", m.path("__x")); !strings.Contains(out, "override on the file") {
		t.Fatalf("after set on the mount: %q", out)
	}
	// A bypassed file reads and writes correctly through the mount.
	data := testkit.Pattern(2<<20, 6)
	if err := os.WriteFile(m.path("__big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(m.path("__big")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("bypassed file through the mount: %v", err)
	}
}

// Another client truncates and rewrites a file while this one reads it
// sequentially, bypassed, with read-ahead buffered: once the change is
// acknowledged (after this client took the break) the reader sees the new
// size and the new bytes, never the old ones it had buffered.
func TestBypassReadAcrossTruncate(t *testing.T) {
	srv := startServer(t, t.TempDir())
	w := dial(t, srv.addr, "mem", 64<<20)
	old := testkit.Pattern(8<<20, 1)
	testkit.WriteFile(t, w, "/__big", old)
	r := dial(t, srv.addr, t.TempDir(), 64<<20)
	f, err := r.Open("/__big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !f.Bypassed() {
		t.Fatal("__big is not bypassed")
	}
	buf := make([]byte, 64<<10)
	var got []byte
	for len(got) < 1<<20 { // far enough for read-ahead to buffer chunks beyond 2 MiB
		n, err := f.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, old[:1<<20]) {
		t.Fatal("first MiB read wrong")
	}
	// The read-ahead window reaches the end of the file: wait until it
	// has all landed, beyond 2 MiB too.
	poll.Wait(t, 10*time.Second, "the read-ahead of the whole file", func() bool { return r.Client().Stats().BytesFetched >= int64(len(old)) })
	fresh := testkit.Pattern(2<<20, 2)
	g, err := w.Open("/__big", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAt(fresh, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rest, fresh[1<<20:]) {
		t.Fatalf("after the truncate the reader got %d bytes (want the new file's last %d), equal to the old bytes: %v",
			len(rest), 1<<20, len(rest) <= len(old)-(1<<20) && bytes.Equal(rest, old[1<<20:1<<20+len(rest)]))
	}
	if st, err := f.Stat(); err != nil || st.Size != 2<<20 {
		t.Fatalf("stat after the truncate: %+v %v", st, err)
	}
}

// Several bypassed readers at once on one client, two of them on each
// handle (as the kernel sends concurrent reads of one open file): one
// reads through in order, the other at random, which moves the handle's
// read-ahead window under the first. Chunk buffers are recycled between
// them all, and each read must still get exactly its own bytes.
func TestBypassConcurrentReaders(t *testing.T) {
	srv := startServer(t, t.TempDir())
	w := dial(t, srv.addr, "mem", 64<<20)
	const files = 3
	want := make([][]byte, files)
	for i := range want {
		want[i] = testkit.Pattern(6<<20, byte(10+i))
		testkit.WriteFile(t, w, fmt.Sprintf("/__f%d", i), want[i])
	}
	r := dial(t, srv.addr, t.TempDir(), 64<<20)
	errs := make(chan error, 2*files)
	check := func(f *client.File, i int, p []byte, off int64) error {
		n, err := f.ReadAt(p, off)
		if err != nil && err != io.EOF {
			return err
		}
		if !bytes.Equal(p[:n], want[i][off:off+int64(n)]) {
			return fmt.Errorf("file %d: wrong bytes at %d+%d", i, off, n)
		}
		return nil
	}
	for i := 0; i < files; i++ {
		f, err := r.Open(fmt.Sprintf("/__f%d", i), os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		go func() {
			p := make([]byte, 128<<10)
			for round := 0; round < 3; round++ {
				for off := int64(0); off < int64(len(want[i])); off += int64(len(p)) {
					if err := check(f, i, p, off); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		}()
		go func() {
			p := make([]byte, 100<<10)
			for k := 0; k < 150; k++ {
				off := int64(k*7919*1024) % (int64(len(want[i])) - int64(len(p)))
				if err := check(f, i, p, off); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for i := 0; i < 2*files; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if r.Client().Stats().BytesWritten != 0 {
		t.Fatalf("bypassed reads wrote %d bytes to the cache", r.Client().Stats().BytesWritten)
	}
}
