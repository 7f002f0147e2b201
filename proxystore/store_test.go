package proxystore

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

const cs = 16 << 10 // small chunks keep the tests quick

func open(t *testing.T, dir, layout string, size int64) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, Size: size, ChunkSize: cs, Layout: layout, Pools: 2})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fid(i int) node.FID { return node.FID{Volume: 1, Vnode: uint64(i), Unique: 1} }

// content is chunk idx of file f at version dv, n bytes: every byte
// depends on all three, so a chunk served for another is caught.
func content(f node.FID, idx int64, dv uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(f.Vnode*1000003+uint64(idx), dv))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func put(t *testing.T, s *Store, f node.FID, idx int64, dv uint64, size int64, user string, took time.Duration) {
	t.Helper()
	n := min(cs, size-idx*cs)
	if err := s.Put(Key{f, idx}, dv, size, content(f, idx, dv, int(n)), user, took); err != nil {
		t.Fatalf("put %v/%d: %v", f, idx, err)
	}
}

// has reports whether chunk idx is served, whole and right.
func has(t *testing.T, s *Store, f node.FID, idx int64, dv uint64, size int64) bool {
	t.Helper()
	n := min(cs, size-idx*cs)
	p := make([]byte, cs)
	got, ok := s.ReadAt(Key{f, idx}, dv, p, 0)
	if !ok {
		return false
	}
	if int64(got) != n || !bytes.Equal(p[:got], content(f, idx, dv, int(n))) {
		t.Fatalf("chunk %v/%d v%d: served %d bytes that are not the chunk's %d", f, idx, dv, got, n)
	}
	return true
}

func forLayouts(t *testing.T, fn func(t *testing.T, layout string)) {
	for _, l := range []string{Pooled, PerChunk} {
		t.Run(l, func(t *testing.T) { fn(t, l) })
	}
}

func TestPutRead(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		s := open(t, t.TempDir(), layout, 4<<20)
		defer s.Close()
		size := int64(3*cs + 100)
		for idx := range int64(4) {
			put(t, s, fid(1), idx, 5, size, "u", 0)
		}
		for idx := range int64(4) {
			if !has(t, s, fid(1), idx, 5, size) {
				t.Fatalf("chunk %d not served", idx)
			}
		}
		// A read within a chunk, and one past its end.
		p := make([]byte, 10)
		if n, ok := s.ReadAt(Key{fid(1), 1}, 5, p, 300); !ok || n != 10 || !bytes.Equal(p, content(fid(1), 1, 5, cs)[300:310]) {
			t.Fatalf("read at 300 of chunk 1: %d %v", n, ok)
		}
		if n, ok := s.ReadAt(Key{fid(1), 3}, 5, p, 100); !ok || n != 0 {
			t.Fatalf("read past the last chunk's end: %d %v", n, ok)
		}
		// An older version's chunk is not stored over a newer one's; a
		// newer version's read drops the older.
		put(t, s, fid(1), 0, 4, size, "u", 0)
		if !has(t, s, fid(1), 0, 5, size) || has(t, s, fid(1), 0, 4, size) {
			t.Fatal("version 4 replaced version 5")
		}
		if has(t, s, fid(1), 1, 6, size) {
			t.Fatal("version 5's chunk served as version 6")
		}
		if st := s.Stats(); st.Chunks != 0 || st.BytesUsed != 0 {
			t.Fatalf("after a newer version was asked for: %+v", st)
		}
	})
}

// TestContiguous: the chunks of one file are one run even when two files
// are fetched interleaved, in the pooled layout; one run per chunk in the
// per-chunk layout.
func TestContiguous(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		s := open(t, t.TempDir(), layout, 8<<20)
		defer s.Close()
		size := int64(8 * cs)
		for idx := range int64(8) {
			put(t, s, fid(1), idx, 1, size, "u", 0)
			put(t, s, fid(2), idx, 1, size, "u", 0)
		}
		st := s.Stats()
		want := int64(2)
		if layout == PerChunk {
			want = 16
		}
		if st.Runs != want || st.Chunks != 16 {
			t.Fatalf("runs %d chunks %d, want %d and 16", st.Runs, st.Chunks, want)
		}
		if layout == PerChunk {
			return
		}
		// Out of order, the runs join when the gap is filled.
		for _, idx := range []int64{3, 1, 0, 2} {
			put(t, s, fid(3), idx, 1, 4*cs, "u", 0)
		}
		if st := s.Stats(); st.Runs != 3 {
			t.Fatalf("runs %d after chunks 3,1,0,2 of a third file, want 3", st.Runs)
		}
		// Two users' files are in different places: the second user's
		// first file does not start where the first user's ends.
		s.mu.Lock()
		a, b := s.files[fid(3)].runs[0].at, s.files[fid(2)].runs[0].at
		s.mu.Unlock()
		put(t, s, fid(4), 0, 1, cs, "v", 0)
		s.mu.Lock()
		c := s.files[fid(4)].runs[0].at
		s.mu.Unlock()
		if a.pool != b.pool || c.pool == a.pool {
			t.Fatalf("user u's files in pools %d and %d, user v's in %d: want u's together, v's apart", b.pool, a.pool, c.pool)
		}
	})
}

func TestEvictionPrefersFastRuns(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		// Room for 16 chunks (2 pools of 8).
		s := open(t, t.TempDir(), layout, 16*cs)
		defer s.Close()
		put(t, s, fid(1), 0, 1, cs, "u", time.Second) // slow and oldest
		for i := 2; i <= 16; i++ {
			put(t, s, fid(i), 0, 1, cs, "u", time.Millisecond)
		}
		for i := 17; i <= 20; i++ {
			put(t, s, fid(i), 0, 1, cs, "u", time.Millisecond)
		}
		if !has(t, s, fid(1), 0, 1, cs) {
			t.Fatal("the slow run was evicted before older fast ones")
		}
		for i := 2; i <= 5; i++ {
			if has(t, s, fid(i), 0, 1, cs) {
				t.Fatalf("file %d, among the oldest fast runs, was kept", i)
			}
		}
		for i := 6; i <= 20; i++ {
			if !has(t, s, fid(i), 0, 1, cs) {
				t.Fatalf("file %d was evicted", i)
			}
		}
		st := s.Stats()
		if st.Evictions != 4 || st.BytesUsed != 16*cs {
			t.Fatalf("evictions %d used %d, want 4 and %d", st.Evictions, st.BytesUsed, 16*cs)
		}
		// With only slow runs, the least recently used goes: file 1 was
		// read last above, so it stays while a slow newcomer evicts.
		for i := 6; i <= 20; i++ {
			s.Drop(fid(i))
		}
		for i := 21; i <= 36; i++ {
			put(t, s, fid(i), 0, 1, cs, "u", time.Second)
		}
		if has(t, s, fid(1), 0, 1, cs) || !has(t, s, fid(36), 0, 1, cs) {
			t.Fatal("with only slow runs, eviction did not follow recency")
		}
	})
}

func TestTooBigChunkRefused(t *testing.T) {
	s := open(t, t.TempDir(), Pooled, 1<<20)
	defer s.Close()
	if err := s.Put(Key{fid(1), 0}, 1, 2*cs, make([]byte, cs+1), "u", 0); err == nil {
		t.Fatal("a chunk larger than the chunk size was stored")
	}
}

func TestRestart(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		dir := t.TempDir()
		s := open(t, dir, layout, 4<<20)
		size := int64(5*cs + 7)
		for idx := range int64(6) {
			put(t, s, fid(1), idx, 3, size, "u", 0)
		}
		put(t, s, fid(2), 0, 9, 100, "u", 0)
		before := s.Stats()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = open(t, dir, layout, 4<<20)
		defer s.Close()
		after := s.Stats()
		if after.Runs != before.Runs || after.Chunks != before.Chunks || after.BytesUsed != before.BytesUsed || after.Hits != before.Hits {
			t.Fatalf("after a clean restart %+v, before %+v", after, before)
		}
		for idx := range int64(6) {
			if !has(t, s, fid(1), idx, 3, size) {
				t.Fatalf("chunk %d lost across a restart", idx)
			}
		}
		if !has(t, s, fid(2), 0, 9, 100) {
			t.Fatal("file 2 lost across a restart")
		}
	})
}

// crash stops s as kill -9 would: what was committed stays, and the
// clean flag is not set.
func crash(t *testing.T, s *Store) {
	t.Helper()
	if err := s.idx.Commit(); err != nil {
		t.Fatal(err)
	}
	s.idx.Abandon()
	s.layout.close()
}

// crashTearing stops s (in dir) as kill -9 would and zeroes n bytes at
// off in chunk k of version dv, as if they never reached the disk.
func crashTearing(t *testing.T, s *Store, dir string, k Key, dv uint64, off, n int64) {
	t.Helper()
	s.mu.Lock()
	r, i := s.findLocked(k, dv)
	at := s.layout.at(r.at, i)
	_, pooled := s.layout.(*pools)
	s.mu.Unlock()
	crash(t, s)
	path := (&chunkFiles{dir: filepath.Join(dir, "chunks")}).path(at)
	if pooled {
		path, off = filepath.Join(dir, fmt.Sprintf("pool-%d", at.pool)), at.block*blockSize+off
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, n), off); err != nil {
		t.Fatal(err)
	}
}

// TestTornChunk: after an unclean stop, a chunk whose bytes do not match
// its CRC is not served; the others are.
func TestTornChunk(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		dir := t.TempDir()
		s := open(t, dir, layout, 4<<20)
		size := int64(4 * cs)
		for idx := range int64(4) {
			put(t, s, fid(1), idx, 1, size, "u", 0)
		}
		// Tear chunk 2: its second half never reached the disk.
		crashTearing(t, s, dir, Key{fid(1), 2}, 1, cs/2, cs/2)
		s = open(t, dir, layout, 4<<20)
		if has(t, s, fid(1), 2, 1, size) {
			t.Fatal("a torn chunk was served")
		}
		for _, idx := range []int64{0, 1, 3} {
			if !has(t, s, fid(1), idx, 1, size) {
				t.Fatalf("intact chunk %d not served after the crash", idx)
			}
		}
		if st := s.Stats(); st.Torn != 1 {
			t.Fatalf("torn %d, want 1", st.Torn)
		}
		// Verified chunks stay verified across a clean restart; the
		// unchecked ones are still checked.
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = open(t, dir, layout, 4<<20)
		defer s.Close()
		s.mu.Lock()
		r := s.files[fid(1)].runs[0]
		v := r.unverified == nil || r.unverified[0]&1 == 0
		s.mu.Unlock()
		if !v {
			t.Fatal("a verified chunk lost its verification across a clean restart")
		}
	})
}

// TestRemade: a store opened with another layout or size starts empty
// (and is usable); bad options are refused.
func TestRemade(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Pooled, 1<<20)
	put(t, s, fid(1), 0, 1, cs, "u", 0)
	s.Close()
	for _, o := range []struct {
		layout string
		size   int64
		kept   bool
	}{{PerChunk, 1 << 20, false}, {PerChunk, 1 << 20, true}, {Pooled, 2 << 20, false}, {Pooled, 2 << 20, true}} {
		s = open(t, dir, o.layout, o.size)
		if has(t, s, fid(1), 0, 1, cs) != o.kept {
			t.Fatalf("%s of %d: the chunk stored before is there: %v", o.layout, o.size, !o.kept)
		}
		put(t, s, fid(1), 0, 1, cs, "u", 0)
		s.Close()
	}
	if pools, _ := filepath.Glob(filepath.Join(dir, "pool-*")); len(pools) != 2 {
		t.Fatalf("pool files %v, want 2", pools)
	}
	if _, err := Open(Options{Dir: dir, Size: 1 << 20, ChunkSize: cs, Layout: "striped"}); err == nil {
		t.Fatal("an unknown layout was accepted")
	}
	if _, err := Open(Options{Dir: dir, Size: 1 << 20, ChunkSize: 3000}); err == nil {
		t.Fatal("a chunk size that is no power of two was accepted")
	}
}

// TestConcurrent: readers, writers of new versions and eviction at once;
// whatever is served is the chunk asked for.
func TestConcurrent(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout string) {
		s := open(t, t.TempDir(), layout, 32*cs)
		defer s.Close()
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 1))
				p := make([]byte, cs)
				for range 400 {
					f, idx, dv := fid(1+r.IntN(6)), int64(r.IntN(8)), uint64(1+r.IntN(3))
					size := int64(8*cs - 1000)
					if r.IntN(2) == 0 {
						n := min(cs, size-idx*cs)
						if err := s.Put(Key{f, idx}, dv, size, content(f, idx, dv, int(n)), fmt.Sprint(w), 0); err != nil {
							t.Error(err)
							return
						}
						continue
					}
					got, ok := s.ReadAt(Key{f, idx}, dv, p, 0)
					if ok && !bytes.Equal(p[:got], content(f, idx, dv, int(min(cs, size-idx*cs)))) {
						t.Errorf("chunk %v/%d v%d: wrong bytes served", f, idx, dv)
						return
					}
				}
			}()
		}
		wg.Wait()
		st := s.Stats()
		if st.BytesUsed > st.Limit || st.Evictions == 0 {
			t.Fatalf("used %d of %d after %d evictions", st.BytesUsed, st.Limit, st.Evictions)
		}
	})
}

// TestVerifyConcurrent: after an unclean stop, readers checking the same
// chunks at once, one of them torn, agree: the torn one is dropped once,
// the others are served right.
func TestVerifyConcurrent(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Pooled, 4<<20)
	size := int64(16 * cs)
	for idx := range int64(16) {
		put(t, s, fid(1), idx, 1, size, "u", 0)
	}
	crashTearing(t, s, dir, Key{fid(1), 5}, 1, 10, 100)
	s = open(t, dir, Pooled, 4<<20)
	defer s.Close()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for idx := range int64(16) {
				if has(t, s, fid(1), idx, 1, size) == (idx == 5) {
					t.Errorf("chunk %d: served %v", idx, idx == 5)
				}
			}
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Torn != 1 || st.Chunks != 15 {
		t.Fatalf("torn %d chunks %d, want 1 and 15", st.Torn, st.Chunks)
	}
}

// TestOutOfOrderAcrossZones: chunks fetched in parallel windows, each
// window shuffled and straddling the 256-chunk zones, still end in one
// run per file.
func TestOutOfOrderAcrossZones(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), Size: 64 << 20, ChunkSize: 4096, Pools: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const chunks = 1000
	r := rand.New(rand.NewPCG(1, 2))
	for f := 1; f <= 3; f++ {
		for w := 0; w < chunks; w += 10 {
			win := r.Perm(min(10, chunks-w))
			for _, j := range win {
				idx := int64(w + j)
				if err := s.Put(Key{fid(f), idx}, 1, chunks*4096, content(fid(f), idx, 1, 4096), "u", 0); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if st := s.Stats(); st.Runs != 3 || st.Chunks != 3*chunks {
		t.Fatalf("%d chunks in %d runs, want %d in 3", st.Chunks, st.Runs, 3*chunks)
	}
}
