package cache

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/chunkindex"
	"github.com/hoardfs/hoard/internal/fsx"
	"github.com/hoardfs/hoard/node"
)

const cs = 64 << 10

func fid(n uint64) node.FID { return node.FID{Volume: 1, Vnode: n, Unique: 1} }

func status(f node.FID, size, dv uint64) node.Status {
	return node.Status{FID: f, Type: node.TypeFile, Size: size, DataVersion: dv, Mode: 0o644, Mtime: time.Unix(1, 0)}
}

func data(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

func open(t *testing.T, dir string, size int64) *Cache {
	t.Helper()
	c, err := Open(Options{Dir: dir, Size: size, ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fill admits a whole file of content at data version dv.
func fill(t *testing.T, c *Cache, f node.FID, content []byte, dv uint64) *Entry {
	t.Helper()
	e := c.Entry(f)
	if _, err := e.Learn(status(f, uint64(len(content)), dv)); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(content); off += cs {
		if err := e.Admit(int64(off/cs), dv, content[off:min(off+cs, len(content))]); err != nil {
			t.Fatalf("admit chunk %d: %v", off/cs, err)
		}
	}
	return e
}

func readAll(t *testing.T, e *Entry) []byte {
	t.Helper()
	st, _ := e.Status()
	p := make([]byte, st.Size+10)
	n, err := e.ReadAt(p, 0)
	if err != io.EOF && err != nil {
		t.Fatal(err)
	}
	return p[:n]
}

func modes(t *testing.T) map[string]string {
	return map[string]string{"disk": t.TempDir(), "memory": ""}
}

func TestAdmitReadRoundTrip(t *testing.T) {
	for name, dir := range modes(t) {
		t.Run(name, func(t *testing.T) {
			c := open(t, dir, 10<<20)
			content := data(3*cs+1000, 1) // a short last chunk
			e := fill(t, c, fid(1), content, 1)
			if got := readAll(t, e); !bytes.Equal(got, content) {
				t.Fatal("read back differs")
			}
			p := make([]byte, 100)
			if n, err := e.ReadAt(p, int64(len(content))-50); n != 50 || err != io.EOF || !bytes.Equal(p[:50], content[len(content)-50:]) {
				t.Fatalf("read over the end: %d %v", n, err)
			}
			if _, err := e.ReadAt(p, int64(len(content))); err != io.EOF {
				t.Fatalf("read at the end: %v", err)
			}
			if !e.Complete() || c.Used() != 3*cs+4096 || c.Stats().BytesWritten != int64(len(content)) {
				t.Fatalf("complete=%v used=%d written=%d", e.Complete(), c.Used(), c.Stats().BytesWritten)
			}
			if name == "disk" {
				if b, _ := os.ReadFile(e.Path()); !bytes.Equal(b, content) {
					t.Fatal("the cache file is not the file's bytes at their offsets")
				}
			} else if e.Path() != "" {
				t.Fatal("memory cache with a path")
			}
		})
	}
}

func TestMissAndStale(t *testing.T) {
	c := open(t, t.TempDir(), 10<<20)
	f := fid(1)
	content := data(4*cs, 2)
	e := c.Entry(f)
	e.Learn(status(f, uint64(len(content)), 5))
	e.Admit(0, 5, content[:cs])
	e.Admit(2, 5, content[2*cs:3*cs])
	if _, err := e.ReadAt(make([]byte, 2*cs), 0); err != ErrMiss {
		t.Fatalf("partly present range: %v", err)
	}
	if got := e.Missing(0, 4*cs); fmt.Sprint(got) != "[1 3]" {
		t.Fatalf("missing %v", got)
	}
	if got := e.Missing(cs*3+5, 1<<30); fmt.Sprint(got) != "[3]" {
		t.Fatalf("missing clipped to size: %v", got)
	}
	if err := e.Admit(1, 4, content[cs:2*cs]); err != ErrStale {
		t.Fatalf("old version admitted: %v", err)
	}
	if err := e.Admit(1, 5, content[cs:2*cs-1]); err != ErrStale {
		t.Fatalf("short chunk admitted: %v", err)
	}
	if e.Complete() {
		t.Fatal("complete with chunks missing")
	}
}

func TestLearn(t *testing.T) {
	c := open(t, t.TempDir(), 10<<20)
	f := fid(1)
	content := data(4*cs, 3)
	e := fill(t, c, f, content, 1)
	// Same version, other attributes: chunks stay.
	st := status(f, uint64(len(content)), 1)
	st.Mode = 0o600
	e.Learn(st)
	if !e.Complete() {
		t.Fatal("attribute change dropped chunks")
	}
	// New version from someone else: dropped.
	e.Learn(status(f, uint64(len(content)), 3))
	if e.Present(0) || c.Used() != 0 {
		t.Fatalf("new version kept chunks; used %d", c.Used())
	}
	// Shrinking drops what lies past the new size, and the chunk it cuts.
	e = fill(t, c, fid(2), content, 1)
	e.Learn(status(fid(2), uint64(cs+10), 1))
	if !e.Present(0) || e.Present(1) || e.Present(2) || c.Used() != cs {
		t.Fatalf("after shrink: used %d", c.Used())
	}
	if fi, _ := os.Stat(e.Path()); fi.Size() != cs+10 {
		t.Fatalf("cache file is %d bytes, want the file's size", fi.Size())
	}
}

func TestLRUEviction(t *testing.T) {
	c := open(t, t.TempDir(), 4*cs)
	var es []*Entry
	for i := uint64(1); i <= 4; i++ {
		es = append(es, fill(t, c, fid(i), data(cs, byte(i)), 1))
	}
	// Use 1 and 3 (3 twice, through the hint path); 2 and 4 are oldest.
	p := make([]byte, 10)
	es[0].ReadAt(p, 0)
	es[2].ReadAt(p, 0)
	es[2].ReadAt(p, 100)
	es[1].ReadAt(p, 0) // then 2 becomes recent again
	es[3].ReadAt(p, 0)
	es[0].ReadAt(p, 0)
	// Order now, oldest first: 3, 2, 4, 1.
	fill(t, c, fid(5), data(cs, 5), 1)
	if es[2].Present(0) || !es[1].Present(0) || !es[3].Present(0) || !es[0].Present(0) {
		t.Fatal("did not evict the least recently used chunk")
	}
	fill(t, c, fid(6), data(cs, 6), 1)
	if es[1].Present(0) || !es[3].Present(0) {
		t.Fatal("second eviction took the wrong chunk")
	}
	if c.Used() > c.Size() || c.Stats().Evictions != 2 {
		t.Fatalf("used %d evictions %d", c.Used(), c.Stats().Evictions)
	}
	// A read that moves to another chunk of the same file counts as use.
	big := fill(t, c, fid(7), data(2*cs, 7), 1)
	big.ReadAt(p, 0)
	big.ReadAt(p, cs)
	big.ReadAt(p, 0)
	fill(t, c, fid(8), data(cs, 8), 1)
	if !big.Present(0) {
		t.Fatal("a chunk just read was evicted")
	}
}

func TestDirtyPinnedAndNoSpace(t *testing.T) {
	c := open(t, t.TempDir(), 2*cs)
	f := fid(1)
	e := c.Entry(f)
	e.Learn(status(f, 0, 1))
	if _, err := e.WriteAt(data(2*cs, 1), 0); err != nil {
		t.Fatal(err)
	}
	if e.DirtyBytes() != 2*cs {
		t.Fatalf("dirty %d", e.DirtyBytes())
	}
	g := c.Entry(fid(2))
	g.Learn(status(fid(2), cs, 1))
	if err := g.Admit(0, 1, data(cs, 2)); err != ErrNoSpace {
		t.Fatalf("admit over dirty data: %v", err)
	}
	if _, err := g.WriteAt([]byte("x"), cs); err != ErrNoSpace {
		t.Fatalf("write over dirty data: %v", err)
	}
	if c.Used() != 2*cs || c.Stats().Evictions != 0 {
		t.Fatalf("used %d, evictions %d: dirty chunks must stay", c.Used(), c.Stats().Evictions)
	}
	// Once stored, they are clean, checksummed and evictable.
	if err := e.Cleaned(e.Dirty(), status(f, 2*cs, 2)); err != nil {
		t.Fatal(err)
	}
	if e.DirtyBytes() != 0 {
		t.Fatal("still dirty after Cleaned")
	}
	if err := g.Admit(0, 1, data(cs, 2)); err != nil {
		t.Fatalf("admit after cleaning: %v", err)
	}
	e.mu.RLock()
	for idx, ch := range e.chunks {
		if ch.crc != chunkindex.Checksum(data(2*cs, 1)[idx*cs:(idx+1)*cs]) {
			t.Fatal("Cleaned did not recompute the checksum")
		}
	}
	e.mu.RUnlock()
}

func TestWritesPartialChunksAndTruncate(t *testing.T) {
	for name, dir := range modes(t) {
		t.Run(name, func(t *testing.T) {
			c := open(t, dir, 10<<20)
			f := fid(1)
			content := data(2*cs, 4)
			e := c.Entry(f)
			e.Learn(status(f, uint64(len(content)), 1))
			// A partial write into a missing chunk with server data is refused.
			if _, err := e.WriteAt([]byte("abc"), 10); err != ErrMiss {
				t.Fatalf("partial write over a missing chunk: %v", err)
			}
			e.Admit(0, 1, content[:cs])
			if _, err := e.WriteAt([]byte("abc"), 10); err != nil {
				t.Fatal(err)
			}
			want := append([]byte(nil), content...)
			copy(want[10:], "abc")
			// Past the end: the gap reads as zeros, chunk 1 stays missing
			// (it is before the old end).
			if _, err := e.WriteAt([]byte("tail"), 3*cs); err != nil {
				t.Fatal(err)
			}
			if cut, ok := e.Cut(); !ok || cut != 2*cs {
				t.Fatalf("cut %d %v", cut, ok)
			}
			if got := e.Missing(0, 4*cs); fmt.Sprint(got) != "[1]" {
				t.Fatalf("missing %v", got)
			}
			e.Admit(1, 1, content[cs:])
			want = append(append(want, make([]byte, cs)...), "tail"...)
			if got := readAll(t, e); !bytes.Equal(got, want) {
				t.Fatal("read after writes differs")
			}
			if fmt.Sprint(e.Dirty()) != fmt.Sprint([]Range{{10, 3}, {3 * cs, 4}}) {
				t.Fatalf("dirty %v", e.Dirty())
			}
			// Truncate into the middle of chunk 0, then extend again.
			if err := e.Truncate(100); err != nil {
				t.Fatal(err)
			}
			if err := e.Truncate(200); err != nil {
				t.Fatal(err)
			}
			want = append(want[:100:100], make([]byte, 100)...)
			if got := readAll(t, e); !bytes.Equal(got, want) {
				t.Fatalf("after truncate: %q", got[95:105])
			}
			if cut, _ := e.Cut(); cut != 100 {
				t.Fatalf("cut %d after truncating to 100 then 200", cut)
			}
			if fmt.Sprint(e.Dirty()) != fmt.Sprint([]Range{{10, 3}}) {
				t.Fatalf("dirty after truncate %v", e.Dirty())
			}
			// The totals follow every change: another file's writes
			// add to the cache's, stores and drops take away.
			other := c.Entry(fid(2))
			other.Learn(status(fid(2), 0, 1))
			other.WriteAt(data(5000, 1), 0)
			if e.DirtyBytes() != 3 || c.DirtyBytes() != 5003 {
				t.Fatalf("dirty bytes %d, cache's %d; want 3 and 5003", e.DirtyBytes(), c.DirtyBytes())
			}
			if err := other.Cleaned([]Range{{0, 4096}}, status(fid(2), 5000, 2)); err != nil {
				t.Fatal(err)
			}
			if c.DirtyBytes() != 3+904 {
				t.Fatalf("cache's dirty bytes %d after a partial store, want %d", c.DirtyBytes(), 3+904)
			}
			c.Remove(fid(2))
			e.Discard()
			if c.DirtyBytes() != 0 {
				t.Fatalf("cache's dirty bytes %d after the drops", c.DirtyBytes())
			}
		})
	}
}

func TestAdmitAcrossCut(t *testing.T) {
	c := open(t, "", 10<<20)
	f := fid(1)
	e := c.Entry(f)
	e.Learn(status(f, 100, 1))
	e.WriteAt([]byte("x"), 2*cs) // extends: cut at 100, chunk 0 missing
	server := data(100, 9)
	if err := e.Admit(0, 1, server); err != nil {
		t.Fatalf("admit of the chunk the cut falls in: %v", err)
	}
	p := make([]byte, cs)
	if _, err := e.ReadAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p[:100], server) || !bytes.Equal(p[100:], make([]byte, cs-100)) {
		t.Fatal("chunk across the cut is not server bytes then zeros")
	}
}

func TestUsedNeverExceedsLimit(t *testing.T) {
	c := open(t, t.TempDir(), 8*cs)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var over error
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := 0; i < 300; i++ {
				f := fid(uint64(rng.Intn(12) + 1))
				e := c.Entry(f)
				switch rng.Intn(4) {
				case 0:
					e.Learn(status(f, 3*cs, 1))
				case 1:
					idx := int64(rng.Intn(3))
					e.Admit(idx, 1, data(cs, byte(idx)))
				case 2:
					e.ReadAt(make([]byte, 100), int64(rng.Intn(3*cs)))
				default:
					if _, err := e.WriteAt(data(100, 1), int64(rng.Intn(3))*cs); err == nil && rng.Intn(2) == 0 {
						st, _ := e.Status()
						st.DataVersion++
						e.Cleaned(e.Dirty(), st)
					}
				}
				if u := c.Used(); u > c.Size() {
					mu.Lock()
					over = fmt.Errorf("used %d > limit %d", u, c.Size())
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	if over != nil {
		t.Fatal(over)
	}
	// Used is exactly the sum of the present chunks' charges.
	var sum int64
	for _, f := range c.Entries() {
		e, _ := c.Lookup(f)
		e.mu.RLock()
		for _, ch := range e.chunks {
			sum += charge(ch.n)
		}
		e.mu.RUnlock()
	}
	if sum != c.Used() {
		t.Fatalf("used %d, chunks add up to %d", c.Used(), sum)
	}
}

func TestReopenReusesChunksAndStats(t *testing.T) {
	dir := t.TempDir()
	c, _ := Open(Options{Dir: dir, Size: 10 << 20, ChunkSize: cs})
	content := data(3*cs, 5)
	e := fill(t, c, fid(1), content, 7)
	e.SetPolicy("mode", "bypass")
	c.CountHit(3)
	c.CountFetched(1234)
	used := c.Used()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Another chunk size asked for: the stored one wins.
	c2, err := Open(Options{Dir: dir, Size: 10 << 20, ChunkSize: 2 * cs})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2.ChunkSize() != cs || c2.Used() != used {
		t.Fatalf("chunk size %d used %d", c2.ChunkSize(), c2.Used())
	}
	e2, ok := c2.Lookup(fid(1))
	if !ok || !e2.Complete() || !bytes.Equal(readAll(t, e2), content) {
		t.Fatal("chunks not reused after reopen")
	}
	if st, _ := e2.Status(); st.DataVersion != 7 || e2.Policy("mode") != "bypass" {
		t.Fatalf("status or policy lost: %+v %q", st, e2.Policy("mode"))
	}
	if s := c2.Stats(); s.Hits != 3 || s.BytesFetched != 1234 || s.Recovered != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// crash closes the cache without the clean flag, as a killed process would
// leave it.
func crash(c *Cache) {
	c.Flush()
	close(c.stop)
	c.idx.Abandon()
}

func TestUncleanReopenVerifies(t *testing.T) {
	dir := t.TempDir()
	c, _ := Open(Options{Dir: dir, Size: 10 << 20, ChunkSize: cs})
	content := data(3*cs, 6)
	e := fill(t, c, fid(1), content, 1)
	dirty := c.Entry(fid(2))
	dirty.Learn(status(fid(2), 0, 1))
	dirty.WriteAt([]byte("unstored"), 0)
	path := e.Path()
	crash(c)
	// Corrupt one byte of chunk 1.
	fd, _ := os.OpenFile(path, os.O_WRONLY, 0)
	fd.WriteAt([]byte{content[cs+5] ^ 0xff}, cs+5)
	fd.Close()
	c2 := open(t, dir, 10<<20)
	e2, _ := c2.Lookup(fid(1))
	if !e2.Present(0) || e2.Present(1) || !e2.Present(2) {
		t.Fatal("verification did not drop exactly the corrupt chunk")
	}
	if c2.Stats().Recovered != 1 || c2.Used() != 2*cs+charge(8) {
		t.Fatalf("recovered %d used %d", c2.Stats().Recovered, c2.Used())
	}
	d2, _ := c2.Lookup(fid(2))
	if fmt.Sprint(d2.Dirty()) != "[{0 8}]" {
		t.Fatalf("unstored writes lost in recovery: %v", d2.Dirty())
	}
	// A clean reopen after that does not verify again.
	c2.Close()
	c3 := open(t, dir, 10<<20)
	if c3.Stats().Recovered != 1 {
		t.Fatal("clean reopen verified again")
	}
}

func TestCorruptIndexStartsEmpty(t *testing.T) {
	dir := t.TempDir()
	c, _ := Open(Options{Dir: dir, Size: 10 << 20, ChunkSize: cs})
	fill(t, c, fid(1), data(cs, 1), 1)
	c.Close()
	// A record that does not decode.
	db, _ := bolt.Open(filepath.Join(dir, "index.db"), 0o600, nil)
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("files")).Put(fid(9).Key(), []byte{42, 1, 2}) })
	db.Close()
	c2 := open(t, dir, 10<<20)
	if len(c2.Entries()) != 0 || c2.Used() != 0 {
		t.Fatal("a corrupt index was served from")
	}
	c2.Close()
	// A file that is not a database at all.
	os.WriteFile(filepath.Join(dir, "index.db"), []byte("garbage garbage garbage"), 0o600)
	c3 := open(t, dir, 10<<20)
	if len(c3.Entries()) != 0 {
		t.Fatal("garbage index served")
	}
}

func TestLockAndBadDir(t *testing.T) {
	dir := t.TempDir()
	c := open(t, dir, 1<<20)
	_ = c
	if _, err := Open(Options{Dir: dir, Size: 1 << 20}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open: %v", err)
	}
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o600)
	if _, err := Open(Options{Dir: file, Size: 1 << 20}); err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("open on a file: %v", err)
	}
	if _, err := Open(Options{Dir: t.TempDir(), Size: 1 << 20, ChunkSize: 3000}); err == nil {
		t.Fatal("odd chunk size accepted")
	}
}

func TestDropAndStatsFile(t *testing.T) {
	dir := t.TempDir()
	c := open(t, dir, 10<<20)
	e := fill(t, c, fid(1), data(2*cs, 1), 1)
	path := e.Path()
	if err := c.Drop(fid(1)); err != nil {
		t.Fatal(err)
	}
	c.Flush() // the committer unlinks the file
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) || c.Used() != 0 {
		t.Fatalf("drop left the file or its space: %v used %d", err, c.Used())
	}
	d := c.Entry(fid(2))
	d.Learn(status(fid(2), 0, 1))
	d.WriteAt([]byte("x"), 0)
	if err := c.Drop(fid(2)); err == nil {
		t.Fatal("dropped unstored writes")
	}
	c.SetGauge("callbacks", 42)
	c.CountMiss(2)
	c.Close()
	s, err := ReadStats(dir)
	if err != nil || s.Misses != 2 || s.Gauges["callbacks"] != 42 || s.ChunkSize != cs {
		t.Fatalf("stats.json: %+v %v", s, err)
	}
	if _, err := ReadStats(t.TempDir()); err == nil {
		t.Fatal("stats from an empty directory")
	}
}

func TestInvalidateAndDiscard(t *testing.T) {
	c := open(t, "", 10<<20)
	e := fill(t, c, fid(1), data(2*cs, 1), 1)
	e.WriteAt([]byte("dirty"), 0)
	e.Invalidate()
	if !e.Present(0) || e.Present(1) {
		t.Fatal("Invalidate must drop clean chunks only")
	}
	e.Discard()
	if e.Present(0) || e.DirtyBytes() != 0 || c.Used() != 0 {
		t.Fatal("Discard left data")
	}
	if _, ok := e.Status(); ok {
		t.Fatal("Discard kept the status")
	}
}

func BenchmarkReadAtHit(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		dir := b.TempDir()
		c, _ := Open(Options{Dir: dir, Size: 64 << 20})
		content := data(16<<20, 1)
		f := fid(1)
		e := c.Entry(f)
		e.Learn(status(f, uint64(len(content)), 1))
		for off := 0; off < len(content); off += DefaultChunkSize {
			e.Admit(int64(off/DefaultChunkSize), 1, content[off:off+DefaultChunkSize])
		}
		plain := filepath.Join(dir, "plain")
		os.WriteFile(plain, content, 0o600)
		pf, _ := os.Open(plain)
		p := make([]byte, size)
		b.Run(fmt.Sprintf("cache/%dK", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				e.ReadAt(p, int64(i*size)%int64(len(content)-size))
			}
		})
		b.Run(fmt.Sprintf("file/%dK", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				pf.ReadAt(p, int64(i*size)%int64(len(content)-size))
			}
		})
		pf.Close()
		c.Close()
	}
}

func TestPinnedFileIsNotEvictedOrOverwritten(t *testing.T) {
	c := open(t, t.TempDir(), 2*cs)
	old := data(2*cs, 1)
	e := fill(t, c, fid(1), old, 1)
	e.Pin()
	reader, err := os.Open(e.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	g := c.Entry(fid(2))
	g.Learn(status(fid(2), cs, 1))
	if err := g.Admit(0, 1, data(cs, 2)); err != ErrNoSpace {
		t.Fatalf("admit evicted a pinned file's chunk: %v", err)
	}
	// A new version while pinned: the reader keeps the old bytes.
	e.Learn(status(fid(1), 2*cs, 2))
	if e.Present(0) {
		t.Fatal("old chunks still listed under the new version")
	}
	e.Admit(0, 2, data(cs, 3))
	buf := make([]byte, 2*cs)
	if _, err := reader.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, old) {
		t.Fatalf("pinned reader saw the file change: %v", err)
	}
	got := make([]byte, cs)
	if _, err := e.ReadAt(got, 0); err != nil || !bytes.Equal(got, data(cs, 3)) {
		t.Fatalf("new version not readable through the cache: %v", err)
	}
	e.Unpin()
	if err := g.Admit(0, 1, data(cs, 2)); err != nil {
		t.Fatalf("unpinned chunk not evictable: %v", err)
	}
}

func TestRescanFindsOutsideWrites(t *testing.T) {
	c := open(t, t.TempDir(), 10<<20)
	content := data(3*cs, 1)
	e := fill(t, c, fid(1), content, 1)
	f, _ := os.OpenFile(e.Path(), os.O_WRONLY, 0)
	f.WriteAt([]byte("changed"), cs+10)  // inside chunk 1
	f.WriteAt([]byte("grown"), 3*cs+100) // past the end: new chunk 3
	f.Close()
	used := c.Used()
	if err := e.Rescan(); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(e.Dirty()); got != fmt.Sprint([]Range{{cs, cs}, {3 * cs, 105}}) {
		t.Fatalf("dirty after rescan: %s", got)
	}
	if st, _ := e.Status(); st.Size != 3*cs+105 {
		t.Fatalf("size %d", st.Size)
	}
	if c.Used() != used+charge(105) {
		t.Fatalf("used %d, want %d", c.Used(), used+charge(105))
	}
	// Shrinking behind the cache's back is a truncation.
	os.Truncate(e.Path(), cs)
	e.Rescan()
	if cut, ok := e.Cut(); !ok || cut != cs || e.Present(2) {
		t.Fatalf("shrink: cut %d %v present(2) %v", cut, ok, e.Present(2))
	}
}

// Remove drops an entry with its unstored writes (a file removed here):
// its space at once, its cache file with the next commit, its record for
// good.
func TestRemove(t *testing.T) {
	dir := t.TempDir()
	c := open(t, dir, 10<<20)
	d := c.Entry(fid(2))
	d.Learn(status(fid(2), 0, 1))
	if _, err := d.WriteAt(data(cs+10, 3), 0); err != nil {
		t.Fatal(err)
	}
	path := d.Path()
	c.Flush()
	c.Remove(fid(2))
	if _, ok := c.Lookup(fid(2)); ok || c.Used() != 0 || c.Stats().Files != 0 {
		t.Fatalf("after Remove: entry kept %v, %d bytes used", ok, c.Used())
	}
	c.Flush()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the cache file of a removed entry stays: %v", err)
	}
	c.Close()
	c2 := open(t, dir, 10<<20)
	if _, ok := c2.Lookup(fid(2)); ok {
		t.Fatal("a removed entry came back after a restart")
	}
}

// After an unclean shutdown, cache files no entry owns (a drop whose
// record was committed and its file not yet unlinked) are removed.
func TestUncleanReopenRemovesOrphans(t *testing.T) {
	dir := t.TempDir()
	c, _ := Open(Options{Dir: dir, Size: 10 << 20, ChunkSize: cs})
	e := fill(t, c, fid(1), data(cs, 4), 1)
	kept := e.Path()
	orphan := filepath.Join(filepath.Dir(kept), "999.1")
	crash(c)
	if err := os.WriteFile(orphan, data(100, 5), 0o600); err != nil {
		t.Fatal(err)
	}
	c2 := open(t, dir, 10<<20)
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an orphan cache file survived an unclean restart: %v", err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("a cache file with its entry was removed: %v", err)
	}
	if e2, ok := c2.Lookup(fid(1)); !ok || !e2.Present(0) {
		t.Fatal("the entry with its file was lost")
	}
}

// More files with unstored writes than the cache keeps open (a tree the
// write-back holds): storing each still finds its bytes. The store's
// checksums read a cache file the bound had closed, which failed with
// EINVAL and left the file unstored.
func TestCleanedPastOpenFileBound(t *testing.T) {
	defer func(m int) { maxOpen = m }(maxOpen)
	maxOpen = 8
	c := open(t, t.TempDir(), 64<<20)
	var es []*Entry
	for i := range 20 {
		e := c.Entry(fid(uint64(i + 1)))
		e.Learn(status(e.FID(), 0, 1))
		if _, err := e.WriteAt(data(5000, byte(i)), 0); err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	for i, e := range es {
		if err := e.Cleaned([]Range{{0, 5000}}, status(e.FID(), 5000, 2)); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if got := readAll(t, e); !bytes.Equal(got, data(5000, byte(i))) {
			t.Fatalf("entry %d reads other bytes after the store", i)
		}
	}
}

// After a clean stop, chunks are not read in bulk at the start, but each
// is checked against its checksum the first time it is served, and before
// the file is offered whole (passthrough): a byte flipped while no
// process held the cache is a miss, fetched again, never served.
func TestCleanReopenChecksOnFirstRead(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir, Size: 10 << 20, ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	content := data(3*cs, 9)
	fill(t, c, fid(1), content, 1)
	other := data(2*cs, 4)
	path2 := fill(t, c, fid(2), other, 1).Path()
	path := c.Entry(fid(1)).Path()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	flip := func(path string, off int64, was byte) {
		fd, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fd.WriteAt([]byte{was ^ 0x01}, off)
		fd.Close()
	}
	flip(path, cs+5, content[cs+5])
	flip(path2, 7, other[7])
	c2 := open(t, dir, 10<<20)
	e, _ := c2.Lookup(fid(1))
	p := make([]byte, cs)
	if _, err := e.ReadAt(p, 0); err != nil || !bytes.Equal(p, content[:cs]) {
		t.Fatalf("an intact chunk: %v", err)
	}
	if _, err := e.ReadAt(p, cs); err != ErrMiss {
		t.Fatalf("a read of the flipped chunk: %v, want a miss", err)
	}
	if e.Present(1) || c2.Stats().Corrupt != 1 {
		t.Fatalf("flipped chunk present %v, corrupt %d", e.Present(1), c2.Stats().Corrupt)
	}
	if err := e.Admit(1, 1, content[cs:2*cs]); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, e); !bytes.Equal(got, content) {
		t.Fatal("the file after the chunk was fetched again")
	}
	e2, _ := c2.Lookup(fid(2))
	if e2.Complete() || e2.Present(0) || c2.Stats().Corrupt != 2 {
		t.Fatalf("a file with a flipped chunk offered whole: present %v, corrupt %d", e2.Present(0), c2.Stats().Corrupt)
	}
}

// A fetch begun before a local truncation lands after it: the chunks
// wholly past the truncation point read as zeros, not as the server's old
// bytes, until the truncation is stored.
func TestAdmitPastLocalTruncation(t *testing.T) {
	c := open(t, t.TempDir(), 10<<20)
	f := fid(1)
	content := data(4*cs, 5)
	e := c.Entry(f)
	if _, err := e.Learn(status(f, uint64(len(content)), 1)); err != nil {
		t.Fatal(err)
	}
	if err := e.Truncate(cs / 2); err != ErrMiss {
		t.Fatalf("truncate inside a missing chunk: %v, want a miss", err)
	}
	if err := e.Admit(0, 1, content[:cs]); err != nil {
		t.Fatal(err)
	}
	if err := e.Truncate(cs / 2); err != nil {
		t.Fatal(err)
	}
	if err := e.Truncate(int64(len(content))); err != nil {
		t.Fatal(err)
	}
	// The fetches of chunks 1 and 2, at the version before the truncation.
	for idx := int64(1); idx < 3; idx++ {
		if err := e.Admit(idx, 1, content[idx*cs:(idx+1)*cs]); err != nil {
			t.Fatalf("admit %d: %v", idx, err)
		}
	}
	want := append(append([]byte(nil), content[:cs/2]...), make([]byte, len(content)-cs/2)...)
	if got := readAll(t, e); !bytes.Equal(got, want) {
		t.Fatalf("after a truncation and old fetches: first difference at %d", fsx.FirstDiff(got, want))
	}
}

// Learn merges a server status with local changes atomically: while a
// writer truncates, no status from the server (the fetches' replies) may
// put the size back, and none older than the entry's may roll it back.
func TestLearnKeepsLocalSize(t *testing.T) {
	c := open(t, t.TempDir(), 10<<20)
	f := fid(1)
	e := fill(t, c, f, data(4*cs, 6), 3)
	if _, err := e.Learn(status(f, 4*cs, 2)); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.Status(); st.DataVersion != 3 || !e.Complete() {
		t.Fatalf("an older status rolled the entry back to version %d", st.DataVersion)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			e.Learn(status(f, 4*cs, 3))
		}
	}()
	for i := 0; i < 2000; i++ {
		size := int64(i%(4*cs) + 1)
		if err := e.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if st, _ := e.Status(); int64(st.Size) != size {
			t.Fatalf("truncated to %d, the entry says %d", size, st.Size)
		}
	}
	<-done
}

// A clean chunk an earlier process recorded is checked before a write
// keeps some of its bytes: once written it is this client's data, and
// neither a flipped bit may be stored nor the write be dropped as corrupt
// by a later read.
func TestWriteChecksRecordedChunk(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir, Size: 10 << 20, ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	content := data(2*cs, 8)
	path := fill(t, c, fid(1), content, 1).Path()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2 := open(t, dir, 10<<20)
	e, _ := c2.Lookup(fid(1))
	// An intact chunk, written in part: the write stays through reads.
	if _, err := e.WriteAt([]byte("xyz"), 10); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), content...)
	copy(want[10:], "xyz")
	if got := readAll(t, e); !bytes.Equal(got, want) || e.DirtyBytes() != 3 {
		t.Fatalf("a write to a recorded chunk: dirty %d, first difference at %d", e.DirtyBytes(), fsx.FirstDiff(got, want))
	}
	// A flipped chunk, written in part: a miss, fetched first.
	fd, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fd.WriteAt([]byte{content[cs+100] ^ 1}, cs+100)
	fd.Close()
	c2.Close()
	c3 := open(t, dir, 10<<20)
	e, _ = c3.Lookup(fid(1))
	if _, err := e.WriteAt([]byte("abc"), cs+5); err != ErrMiss {
		t.Fatalf("a write into a flipped chunk: %v, want a miss", err)
	}
	if e.Present(1) {
		t.Fatal("the flipped chunk stayed")
	}
}

// A cache on a file system smaller than its size is capped at what the
// file system can give it, and one whose file system fills up with other
// files evicts to make room instead of failing fetches with ENOSPC.
func TestCacheOnSmallFileSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("SKIP: cannot mount a tmpfs: %v", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	c, err := Open(Options{Dir: dir, Size: 1 << 30, ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Size() > 4<<20 {
		t.Fatalf("a 1 GiB cache on a 4 MiB file system kept its size: %d", c.Size())
	}
	content := data(8*cs, 1)
	e := c.Entry(fid(1))
	if _, err := e.Learn(status(fid(1), uint64(len(content)), 1)); err != nil {
		t.Fatal(err)
	}
	for idx := int64(0); idx < 4; idx++ {
		if err := e.Admit(idx, 1, content[idx*cs:(idx+1)*cs]); err != nil {
			t.Fatalf("admit %d: %v", idx, err)
		}
	}
	// Another program fills the file system.
	hog, err := os.Create(filepath.Join(dir, "hog"))
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := hog.Write(buf); err != nil {
			break
		}
	}
	err = e.Admit(4, 1, content[4*cs:5*cs])
	if err != nil && !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a fetch on a full file system: %v, want ErrNoSpace (served from memory)", err)
	}
	if err := e.Admit(5, 1, content[5*cs:6*cs]); err != nil {
		t.Fatalf("a fetch after the cache shrank: %v", err)
	}
	if c.Stats().Evictions == 0 {
		t.Fatal("nothing evicted on a full file system")
	}
}
