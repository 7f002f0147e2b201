package client_test

import (
	"bytes"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
)

// wantPolicy fails unless name's policy bypasses (or not), for a reason
// that contains why.
func wantPolicy(t testing.TB, c *pathfs.FS, name string, bypass bool, why string) {
	t.Helper()
	d, err := c.Policy(name)
	if err != nil {
		t.Fatalf("policy of %s: %v", name, err)
	}
	if d.Bypass != bypass || !strings.Contains(d.Why, why) {
		t.Fatalf("policy of %s: %v, want bypass %v because of %q", name, d, bypass, why)
	}
}

// The rules of the caching policy, first that speaks wins: an override on
// the file, then on its directory, the name, the volume, the size
// threshold.
func TestPolicyRules(t *testing.T) {
	s := servertest.Start(t)
	c := s.Dial(t, func(o *client.Options) { o.BypassThreshold = 1 << 20 })
	w := s.Dial(t, servertest.MemCache())
	small, big := testkit.Pattern(100, 1), testkit.Pattern(2<<20, 2)
	testkit.WriteFile(t, w, "/small", small)
	testkit.WriteFile(t, w, "/big", big)
	testkit.WriteFile(t, w, "/++big", big)
	testkit.WriteFile(t, w, "/__small", small)
	wantPolicy(t, c, "/small", false, "< threshold")
	wantPolicy(t, c, "/big", true, "≥ threshold")
	wantPolicy(t, c, "/++big", false, "++")
	wantPolicy(t, c, "/__small", true, "__")
	wantPolicy(t, c, "/", false, "no override on the directory")

	// A bypassed read fetches the bytes but writes nothing into the cache.
	written := c.Client().Stats().BytesWritten
	f, err := c.Open("/big", os.O_RDONLY, 0)
	testkit.Must(t, err)
	if !f.Bypassed() || !f.Policy().Bypass {
		t.Fatalf("a file over the threshold: bypassed %v, policy %v", f.Bypassed(), f.Policy())
	}
	got, err := io.ReadAll(f)
	testkit.Must(t, err)
	testkit.Must(t, f.Close())
	if !bytes.Equal(got, big) {
		t.Fatal("a bypassed read returned other bytes")
	}
	if st := c.Client().Stats(); st.BytesWritten != written {
		t.Fatalf("a bypassed read wrote %d bytes into the cache", st.BytesWritten-written)
	}

	// Overrides on a file, and on a directory, recursively.
	testkit.Must(t, c.SetPolicy("/big", policy.Cache, false))
	wantPolicy(t, c, "/big", false, "override on the file")
	testkit.WantFile(t, c, "/big", big)
	if st := c.Client().Stats(); st.BytesWritten < written+int64(len(big)) {
		t.Fatal("a file with a cache override was not cached")
	}
	testkit.Must(t, c.SetPolicy("/big", policy.Auto, false))
	wantPolicy(t, c, "/big", true, "≥ threshold")
	testkit.Must(t, c.SetPolicy("/small", policy.Bypass, false))
	wantPolicy(t, c, "/small", true, "override on the file")
	testkit.WantFile(t, c, "/small", small)

	testkit.Must(t, w.Mkdir("/d", 0o755))
	testkit.Must(t, w.Mkdir("/d/sub", 0o755))
	testkit.WriteFile(t, w, "/d/a", small)
	testkit.WriteFile(t, w, "/d/sub/b", small)
	testkit.Must(t, w.Symlink("a", "/d/link"))
	testkit.Must(t, c.SetPolicy("/d", policy.Bypass, true))
	wantPolicy(t, c, "/d", true, "override on the directory")
	wantPolicy(t, c, "/d/a", true, "override on the file")
	wantPolicy(t, c, "/d/sub/b", true, "override on the file")
	testkit.Must(t, c.SetPolicy("/d", policy.Auto, true))
	wantPolicy(t, c, "/d/a", false, "< threshold")
	testkit.Must(t, c.SetPolicy("/d", policy.Cache, false))
	wantPolicy(t, c, "/d", false, "override on the directory")
	testkit.WriteFile(t, w, "/d/big", big)
	wantPolicy(t, c, "/d/big", false, "override on its directory")

	if err := c.SetPolicy("/d", "sometimes", false); err == nil {
		t.Fatal("a policy that is none was set")
	}
	_, err = c.Policy("/none")
	testkit.WantErrno(t, "policy of a missing file", err, syscall.ENOENT)
	testkit.WantErrno(t, "set policy of a missing file", c.SetPolicy("/none", policy.Cache, false), syscall.ENOENT)

	// A volume named __something bypasses.
	_, err = w.Admin().CreateVolume("__scratch")
	testkit.Must(t, err)
	testkit.Must(t, w.Admin().MountVolume("/scratch", "__scratch"))
	testkit.WriteFile(t, w, "/scratch/f", small)
	wantPolicy(t, c, "/scratch/f", true, "volume __scratch")
	testkit.WantFile(t, c, "/scratch/f", small)
}

// Bypassed writes are staged at the server and published at once by
// Sync or Close: another client sees the old contents until then. A
// read of the same file elsewhere in the writer publishes them first.
func TestBypassWrites(t *testing.T) {
	s := servertest.Start(t)
	c := s.Dial(t)
	r := s.Dial(t, servertest.MemCache())
	old := []byte("old contents")
	testkit.WriteFile(t, r, "/__w", old)
	f, err := c.Open("/__w", os.O_RDWR|os.O_TRUNC, 0)
	testkit.Must(t, err)
	if !f.Bypassed() {
		t.Fatal("a __ file is not bypassed")
	}
	data := testkit.Pattern(9<<20+3, 7)
	for off := 0; off < len(data); off += 1 << 20 {
		end := min(off+1<<20, len(data))
		if _, err := f.Write(data[off:end]); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := f.Stat(); err != nil || st.Size != uint64(len(data)) {
		t.Fatalf("stat of a file with unpublished writes: %d %v", st.Size, err)
	}
	if pos, err := f.Seek(0, io.SeekEnd); err != nil || pos != int64(len(data)) {
		t.Fatalf("seek to the end of unpublished writes: %d %v", pos, err)
	}
	testkit.WantFile(t, r, "/__w", old)
	testkit.Must(t, f.Sync())
	testkit.WantFile(t, r, "/__w", data)

	// Another open here reads this one's unpublished writes.
	_, err = f.WriteAt([]byte("HEAD"), 0)
	testkit.Must(t, err)
	g, err := c.Open("/__w", os.O_RDONLY, 0)
	testkit.Must(t, err)
	p := make([]byte, 4)
	if _, err := g.ReadAt(p, 0); err != nil || string(p) != "HEAD" {
		t.Fatalf("another open read %q %v", p, err)
	}
	testkit.Must(t, g.Close())

	// A truncation after writes publishes them, and is published itself.
	testkit.Must(t, f.Truncate(5))
	if st, _ := f.Stat(); st.Size != 5 {
		t.Fatalf("size after a bypassed truncate: %d", st.Size)
	}
	_, err = f.WriteAt([]byte("++"), 7)
	testkit.Must(t, err)
	testkit.Must(t, f.Close())
	want := append(append([]byte("HEAD"), data[4]), 0, 0, '+', '+')
	testkit.WantFile(t, r, "/__w", want)

	// O_APPEND on a bypassed file.
	h, err := c.Open("/__w", os.O_WRONLY|os.O_APPEND, 0)
	testkit.Must(t, err)
	_, err = h.Write([]byte("!"))
	testkit.Must(t, err)
	testkit.Must(t, h.Flush())
	testkit.Must(t, h.Close())
	testkit.WantFile(t, r, "/__w", append(want, '!'))

	// A new bypassed file.
	testkit.WriteFile(t, c, "/__new", []byte("fresh"))
	testkit.WantFile(t, r, "/__new", []byte("fresh"))
	if err := c.Truncate("/__new", 2); err != nil {
		t.Fatal(err)
	}
	testkit.WantFile(t, r, "/__new", []byte("fr"))
}

// A file that turns to bypass first stores its local writes; an open that
// bypasses a file with local writes stores them first too.
func TestPolicySwitchKeepsWrites(t *testing.T) {
	s := servertest.Start(t)
	c := s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour })
	r := s.Dial(t, servertest.MemCache())
	testkit.Must(t, c.Mkdir("/d", 0o755))
	testkit.WriteFile(t, c, "/d/f", []byte("written here"))
	testkit.WriteFile(t, c, "/d/g", []byte("also here"))
	if c.Client().Stats().DirtyBytes == 0 {
		t.Fatal("nothing dirty")
	}
	testkit.Must(t, c.SetPolicy("/d/f", policy.Bypass, false))
	testkit.WantFile(t, r, "/d/f", []byte("written here"))
	testkit.Must(t, c.SetPolicy("/d", policy.Bypass, false))
	f, err := c.Open("/d/g", os.O_RDWR, 0)
	testkit.Must(t, err)
	if !f.Bypassed() {
		t.Fatal("a file in a bypassed directory is cached")
	}
	testkit.Must(t, f.Close())
	testkit.WantFile(t, r, "/d/g", []byte("also here"))
}

// Auto: a large file seen for the first time is read around the cache
// while it is read sequentially; a random read admits it; a second use
// within the window caches it.
func TestPolicyAuto(t *testing.T) {
	s := servertest.Start(t)
	w := s.Dial(t, servertest.MemCache())
	data := testkit.Pattern(6<<20, 9)
	testkit.WriteFile(t, w, "/large", data)
	testkit.WriteFile(t, w, "/large2", data)
	c := s.Dial(t, func(o *client.Options) {
		o.CacheSize = 4 << 20
		o.AutoMin = 1 << 20
	})
	wantPolicy(t, c, "/large", true, "first use")
	f, err := c.Open("/large", os.O_RDONLY, 0)
	testkit.Must(t, err)
	if !f.Bypassed() || !f.Policy().Probation {
		t.Fatalf("first use: bypassed %v, policy %v", f.Bypassed(), f.Policy())
	}
	written := c.Client().Stats().BytesWritten
	var got []byte
	p := make([]byte, 200<<10)
	for {
		n, err := f.Read(p)
		got = append(got, p[:n]...)
		if err == io.EOF {
			break
		}
		testkit.Must(t, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("a sequential bypassed read returned other bytes")
	}
	if !f.Bypassed() || c.Client().Stats().BytesWritten != written {
		t.Fatal("a sequential read on probation was cached")
	}
	testkit.Must(t, f.Close())
	wantPolicy(t, c, "/large", false, "used again")

	// A random read ends the probation: the file is cached from then on.
	g, err := c.Open("/large2", os.O_RDONLY, 0)
	testkit.Must(t, err)
	if !g.Bypassed() {
		t.Fatal("the second large file is not on probation")
	}
	q := make([]byte, 1000)
	if _, err := g.ReadAt(q, 3<<20); err != nil || !bytes.Equal(q, data[3<<20:3<<20+1000]) {
		t.Fatalf("random read: %v", err)
	}
	if g.Bypassed() {
		t.Fatal("a random read did not end the probation")
	}
	if _, err := g.ReadAt(q, 1<<20); err != nil || !bytes.Equal(q, data[1<<20:1<<20+1000]) {
		t.Fatalf("second random read: %v", err)
	}
	testkit.Must(t, g.Close())

	// A large file that fits in the free space is cached at once.
	big := s.Dial(t, func(o *client.Options) { o.AutoMin = 1 << 20 })
	wantPolicy(t, big, "/large", false, "fits without evicting")
	mem := s.Dial(t, servertest.MemCache(), func(o *client.Options) { o.AutoMin = 1 << 20 })
	wantPolicy(t, mem, "/large", false, "fits without evicting")
	// Under AutoMin a file is small, whatever the cache.
	wantPolicy(t, s.Dial(t, servertest.MemCache()), "/large", false, "small file")
}

// Bypassed writes staged at the server are lost with the session they
// were staged in (a server restart): Close says EIO and the file keeps
// its contents from before them, for everyone.
func TestBypassStageLostOnRestart(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t, servertest.WithConfig(restartConfig))
	c := s.Dial(t)
	r := s.Dial(t, servertest.MemCache())
	old := []byte("before the stage")
	testkit.WriteFile(t, r, "/__s", old)
	f, err := c.Open("/__s", os.O_RDWR, 0)
	testkit.Must(t, err)
	// More than one write-behind run (4 MiB): the first goes out staged.
	data := testkit.Pattern(5<<20, 3)
	for off := 0; off < len(data); off += 1 << 20 {
		if _, err := f.WriteAt(data[off:off+1<<20], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	s.Restart()
	if err := f.Close(); errnoOf(err) != syscall.EIO {
		t.Fatalf("close of a bypassed file whose stage was lost: %v, want EIO", err)
	}
	testkit.WantFile(t, r, "/__s", old)
	// The next open writes again.
	testkit.WriteFile(t, c, "/__s", []byte("new"))
	testkit.WantFile(t, r, "/__s", []byte("new"))
}
