package client_test

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
)

// Writes under a write delegation are stored by the flusher once they
// are older than FlushAge, with nobody asking for them.
func TestFlushAge(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t)
	a := s.Dial(t, func(o *client.Options) { o.FlushAge = 200 * time.Millisecond })
	data := testkit.Pattern(300<<10, 4)
	testkit.WriteFile(t, a, "/aged", data)
	waitFor(t, 10*time.Second, func() bool {
		st := a.Client().Stats()
		return st.DirtyBytes == 0 && st.Flushed >= int64(len(data))
	}, func() string { return fmt.Sprintf("the flusher did not store aged writes: %+v", a.Client().Stats()) })
	// Already stored: the recall another client's open makes stores
	// nothing more.
	stores := a.Client().Stats().Stores
	b := s.Dial(t, servertest.MemCache())
	testkit.WantFile(t, b, "/aged", data)
	if st := a.Client().Stats(); st.Stores != stores {
		t.Fatalf("the recall stored again (%d stores) what the flusher had stored", st.Stores-stores)
	}
}

// Above the midpoint of its thresholds the flusher stores until the dirty
// bytes are under lodirty, whatever their age.
func TestFlusherThreshold(t *testing.T) {
	s := servertest.Start(t)
	// 16 MiB with 256 KiB chunks: hidirty 4 MiB + 20 chunks = 9 MiB,
	// lodirty 4.5 MiB, flushing starts above 6.75 MiB.
	a := s.Dial(t, func(o *client.Options) {
		o.CacheSize = 16 << 20
		o.FlushAge = time.Hour
	})
	for i := range 10 {
		testkit.WriteFile(t, a, fmt.Sprintf("/t%d", i), testkit.Pattern(1<<20, byte(i)))
	}
	waitFor(t, 15*time.Second, func() bool {
		st := a.Client().Stats()
		return st.Flushed > 0 && st.DirtyBytes <= 27<<18
	}, func() string { return fmt.Sprintf("the flusher did not store down: %+v", a.Client().Stats()) })
	if st := a.Client().Stats(); st.DirtyBytes == 0 {
		t.Fatal("the flusher stored everything, not down to lodirty")
	}
	b := s.Dial(t, servertest.MemCache())
	for i := range 10 {
		testkit.WantFile(t, b, fmt.Sprintf("/t%d", i), testkit.Pattern(1<<20, byte(i)))
	}
}

// A cache smaller than what one file's writes take: dirty chunks cannot
// be evicted, so a writer stores its own writes to make room, and every
// byte arrives.
func TestDirtyCacheFull(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t, func(o *client.Options) {
		o.CacheSize = 2 << 20
		o.FlushAge = time.Hour
	})
	data := testkit.Pattern(6<<20, 5)
	f, err := a.Create("/huge")
	testkit.Must(t, err)
	for off := 0; off < len(data); off += 100 << 10 {
		end := min(off+100<<10, len(data))
		if _, err := f.WriteAt(data[off:end], int64(off)); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	testkit.Must(t, f.Close())
	if st := a.Client().Stats(); st.Stores == 0 {
		t.Fatal("nothing stored while writing 6 MiB into a 2 MiB cache")
	}
	b := s.Dial(t, servertest.MemCache())
	testkit.WantFile(t, b, "/huge", data)
	// And a read of it through the small cache, in reads of 128 KiB as a
	// kernel makes them, evicts.
	g := openFile(t, a, "/huge", os.O_RDONLY)
	var got []byte
	p := make([]byte, 128<<10)
	for {
		n, err := g.Read(p)
		got = append(got, p[:n]...)
		if err == io.EOF {
			break
		}
		testkit.Must(t, err)
	}
	testkit.Must(t, g.Close())
	if !bytes.Equal(got, data) {
		t.Fatal("read back through the small cache: wrong data")
	}
	if a.Client().Stats().Evictions == 0 {
		t.Fatal("no evictions reading 6 MiB through a 2 MiB cache")
	}
}

// The cache outlives its client: another client on the same cache
// directory reads what the first one cached without fetching it.
func TestCacheSurvivesRestart(t *testing.T) {
	s := servertest.Start(t)
	data := testkit.Pattern(600<<10, 6)
	w := s.Seed(t, "/kept", data)
	dir := t.TempDir()
	a := s.Dial(t, servertest.InDir(dir))
	testkit.WantFile(t, a, "/kept", data)
	fetched := a.Client().Stats().BytesFetched
	if fetched < int64(len(data)) {
		t.Fatalf("fetched %d bytes reading %d", fetched, len(data))
	}
	testkit.Must(t, a.Close())
	a2 := s.Dial(t, servertest.InDir(dir))
	if st := a2.Client().Stats(); st.BytesFetched != fetched {
		t.Fatalf("the cache's counters were not kept: %d fetched, was %d", st.BytesFetched, fetched)
	}
	testkit.WantFile(t, a2, "/kept", data)
	if st := a2.Client().Stats(); st.BytesFetched != fetched {
		t.Fatalf("re-reading a cached file after a restart fetched %d bytes", st.BytesFetched-fetched)
	}
	// A change made meanwhile is noticed: the old chunks are dropped.
	testkit.Must(t, a2.Close())
	testkit.WriteFile(t, w, "/kept", []byte("new"))
	a3 := s.Dial(t, servertest.InDir(dir))
	testkit.WantFile(t, a3, "/kept", []byte("new"))
	// The cache is in use: a second client on it is refused.
	if _, err := client.Dial(s.Options(t, servertest.InDir(dir))); err == nil {
		t.Fatal("two clients opened one cache directory")
	}
}

// KeepSession keeps the session token in the cache directory, for the
// next process on it.
func TestKeepSession(t *testing.T) {
	s := servertest.Start(t)
	dir := t.TempDir()
	a := s.Dial(t, servertest.InDir(dir), func(o *client.Options) { o.KeepSession = true })
	testkit.WriteFile(t, a, "/ks", []byte("one"))
	testkit.Must(t, a.Close())
	tok, err := os.ReadFile(filepath.Join(dir, "session"))
	if err != nil || len(tok) == 0 {
		t.Fatalf("session token: %q %v", tok, err)
	}
	a2 := s.Dial(t, servertest.InDir(dir), func(o *client.Options) { o.KeepSession = true })
	testkit.WantFile(t, a2, "/ks", []byte("one"))
	testkit.WriteFile(t, a2, "/ks", []byte("two"))
	b := s.Dial(t, servertest.MemCache())
	testkit.WantFile(t, b, "/ks", []byte("two"))
	// Without KeepSession no token is written.
	dir2 := t.TempDir()
	c := s.Dial(t, servertest.InDir(dir2))
	testkit.WriteFile(t, c, "/ks2", []byte("x"))
	if _, err := os.Stat(filepath.Join(dir2, "session")); err == nil {
		t.Fatal("a session token was kept without KeepSession")
	}
}

// copyDir copies a cache directory (its files, not its lock) as it is now.
func copyDir(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o700)
		}
		if !d.Type().IsRegular() || d.Name() == "LOCK" {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(dst)
		if err != nil {
			return err
		}
		defer out.Close()
		_, err = io.Copy(out, in)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A cache a client left with unstored writes (it crashed: here, a copy of
// its cache directory taken while it ran) is not stored blindly by the
// next client on it: the writes are kept in lost/, named by their path.
func TestCrashedClientsWritesKept(t *testing.T) {
	s := servertest.Start(t)
	dir := t.TempDir()
	a := s.Dial(t, servertest.InDir(dir), func(o *client.Options) {
		o.FlushAge = time.Hour
		o.NoDirDelegations = true
	})
	data := testkit.Pattern(50<<10, 8)
	testkit.WriteFile(t, a, "/crash", data)
	if a.Client().Stats().DirtyBytes == 0 {
		t.Fatal("nothing dirty")
	}
	// The index is committed every 100 ms: copy until a copy has it.
	var kept []lost.Record
	waitFor(t, 10*time.Second, func() bool {
		cp := filepath.Join(t.TempDir(), "cache")
		copyDir(t, dir, cp)
		c, err := client.Dial(s.Options(t, servertest.InDir(cp)))
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		kept, err = lost.List(cp)
		return err == nil && len(kept) > 0
	}, func() string { return "the copied cache's dirty writes were not kept in lost/" })
	if len(kept) != 1 || kept[0].Path != "/crash" || !strings.Contains(kept[0].Error, "stopped") {
		t.Fatalf("lost: %+v", kept)
	}
	got, err := os.ReadFile(kept[0].Data)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("kept data: %d bytes, %v", len(got), err)
	}
	// The running client still has them, and stores them.
	b := s.Dial(t, servertest.MemCache())
	testkit.WantFile(t, b, "/crash", data)
}

// A client whose server is gone keeps serving what it has cached under
// promises; requests for anything else fail with EIO within the RPC
// timeout; Close keeps the unstored writes in lost/ and says so.
func TestServerGone(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t)
	dir := t.TempDir()
	a := s.Dial(t, servertest.InDir(dir), func(o *client.Options) {
		o.FlushAge = time.Hour
		o.RPCTimeout = 500 * time.Millisecond
	})
	b := s.Dial(t, servertest.MemCache())
	testkit.WriteFile(t, b, "/cached", []byte("cached before"))
	testkit.WantFile(t, a, "/cached", []byte("cached before"))
	testkit.Must(t, a.Mkdir("/d", 0o755))
	f := testkit.Create(t, a, "/d/unstored", []byte("never reaches the server"))
	s.Stop()
	testkit.WantFile(t, a, "/cached", []byte("cached before"))
	start := time.Now()
	_, err := a.Stat("/elsewhere")
	if errnoOf(err) != syscall.EIO || err.Error() == "" {
		t.Fatalf("stat with the server gone: %v (errno %v), want EIO", err, errnoOf(err))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a request to a gone server took %v", took)
	}
	testkit.Must(t, f.Close()) // under the delegation: stays in the cache
	start = time.Now()
	err = a.Close()
	if err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("close with unstored writes and no server: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("close with the server gone took %v", took)
	}
	kept, err := lost.List(dir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/d/unstored" {
		t.Fatalf("kept: %+v %v", kept, err)
	}
	got, _ := os.ReadFile(kept[0].Data)
	if string(got) != "never reaches the server" {
		t.Fatalf("kept %q", got)
	}
}

// With a memory cache, lost writes go to the system's temporary
// directory, and ListLost of a directory without any finds none.
func TestLostDirs(t *testing.T) {
	if d := lost.Dir(""); !strings.HasPrefix(d, os.TempDir()) {
		t.Fatalf("memory cache's lost directory %s", d)
	}
	if kept, err := lost.List(t.TempDir()); err != nil || len(kept) != 0 {
		t.Fatalf("an empty cache directory lists %v %v", kept, err)
	}
}

// One ReadAt larger than the whole cache: the chunks it fetches evict the
// ones it fetched first, every time; it is served past the cache.
// io.ReadAll of a file larger than the cache makes such reads (its buffer
// grows past the cache size).
func TestReadLargerThanCache(t *testing.T) {
	s := servertest.Start(t)
	data := testkit.Pattern(6<<20, 5)
	s.Seed(t, "/huge", data)
	a := s.Dial(t, func(o *client.Options) { o.CacheSize = 2 << 20 })
	f := openFile(t, a, "/huge", os.O_RDONLY)
	p := make([]byte, 3<<20)
	if n, err := f.ReadAt(p, 0); n != len(p) || err != nil || !bytes.Equal(p, data[:len(p)]) {
		t.Fatalf("a 3 MiB read through a 2 MiB cache: %d bytes, %v", n, err)
	}
	testkit.WantFile(t, a, "/huge", data)
}

// With the cache full of unstored writes, a read of another file is
// served from memory: the chunks it fetches cannot be cached.
func TestReadWithCacheFullOfDirtyData(t *testing.T) {
	s := servertest.Start(t)
	other := testkit.Pattern(700<<10, 2)
	w := s.Seed(t, "/other", other)
	a := s.Dial(t, func(o *client.Options) {
		o.CacheSize = 2 << 20
		o.FlushAge = time.Hour
		o.NoDirDelegations = true
	})
	dirty := testkit.Pattern(2<<20, 1)
	f := testkit.Create(t, a, "/dirty", dirty)
	if st := a.Client().Stats(); st.DirtyBytes != int64(len(dirty)) {
		t.Fatalf("%d dirty bytes, want the whole cache", st.DirtyBytes)
	}
	g := openFile(t, a, "/other", os.O_RDONLY)
	p := make([]byte, len(other)+10)
	n, err := g.ReadAt(p, 0)
	if n != len(other) || err != io.EOF || !bytes.Equal(p[:n], other) {
		t.Fatalf("read with the cache full: %d bytes, %v", n, err)
	}
	if a.Client().Stats().Bypassed == 0 {
		t.Fatal("no chunk was served around the full cache")
	}
	testkit.Must(t, g.Close())
	testkit.Must(t, f.Close())
	testkit.WantFile(t, w, "/dirty", dirty)
}

// A write or truncation inside a chunk that is not cached fetches it
// first: the rest of the chunk keeps the server's bytes.
func TestPartialChunkChanges(t *testing.T) {
	s := servertest.Start(t)
	data := testkit.Pattern(1<<20, 8)
	w := s.Seed(t, "/pc", data)
	a := s.Dial(t, func(o *client.Options) { o.NoDirDelegations = true })
	f := openFile(t, a, "/pc", os.O_RDWR)
	_, err := f.WriteAt([]byte("middle"), 600_000)
	testkit.Must(t, err)
	testkit.Must(t, f.Truncate(800_000))
	testkit.Must(t, f.Close())
	want := slices.Clone(data[:800_000])
	copy(want[600_000:], "middle")
	testkit.WantFile(t, w, "/pc", want)
	if a.Client().Stats().BytesFetched == 0 {
		t.Fatal("nothing fetched for partial-chunk changes")
	}
}

// A truncation of an open file under a write delegation is local; one the
// server refuses (past the volume's quota) is reported by the Sync that
// stores it, with the server's errno, and the writes go to lost/.
func TestRefusedStoreKeptInLost(t *testing.T) {
	s := servertest.Start(t)
	dir := t.TempDir()
	a := s.Dial(t, servertest.InDir(dir), func(o *client.Options) { o.FlushAge = time.Hour })
	b := s.Dial(t, servertest.MemCache())
	_, err := a.Admin().CreateVolume("capped")
	testkit.Must(t, err)
	testkit.Must(t, a.Admin().MountVolume("/q", "capped"))
	_, err = a.Admin().SetQuota("capped", 1000)
	testkit.Must(t, err)
	f := testkit.Create(t, a, "/q/big", []byte("abc"))
	testkit.Must(t, f.Truncate(1<<20))
	// (The message does not say where the data went, as an EIO's does:
	// errOf keeps only the errno.)
	if err := f.Sync(); errnoOf(err) != syscall.EDQUOT {
		t.Fatalf("sync of a truncation past the volume's quota: %v, want EDQUOT", err)
	}
	testkit.Must(t, f.Close())
	if st, err := b.Stat("/q/big"); err != nil || st.Size != 0 {
		t.Fatalf("another client's stat: %+v %v", st, err)
	}
	kept, err := lost.List(dir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/q/big" || kept[0].Truncate == nil || kept[0].Size != 1<<20 {
		t.Fatalf("kept: %+v %v", kept, err)
	}
}

// A truncation past the largest file the server stores is EFBIG at once,
// under a write delegation too: the server's bound came in its Welcome.
// Taken locally, the truncation's store would be refused at the recall,
// and the file's earlier unstored writes with it, with nobody told.
func TestTruncateByNameTooLarge(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour })
	b := s.Dial(t, servertest.MemCache())
	testkit.WriteFile(t, a, "/big", []byte("abc"))
	if err := a.Truncate("/big", 1<<62); errnoOf(err) != syscall.EFBIG {
		t.Fatalf("truncate past the largest file: %v, want EFBIG", err)
	}
	f, err := a.Open("/big", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("x"), 1<<62); errnoOf(err) != syscall.EFBIG {
		t.Fatalf("write past the largest file: %v, want EFBIG", err)
	}
	if err := f.Truncate(1 << 62); errnoOf(err) != syscall.EFBIG {
		t.Fatalf("ftruncate past the largest file: %v, want EFBIG", err)
	}
	if got := testkit.ReadFile(t, b, "/big"); string(got) != "abc" {
		t.Fatalf("another client reads %q", got)
	}
}
