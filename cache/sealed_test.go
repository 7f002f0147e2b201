package cache

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

func openSealed(t *testing.T, dir string, key []byte) (*Cache, error) {
	t.Helper()
	c, err := Open(Options{Dir: dir, Size: 64 << 20, ChunkSize: cs, Key: key})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// An encrypted cache reads back what a plain one does, after the same
// admits, unaligned writes and truncations, and keeps none of it in the
// clear on disk.
func TestSealedMatchesPlain(t *testing.T) {
	key := bytes.Repeat([]byte{7}, KeySize)
	sealedDir := t.TempDir()
	sealed, err := openSealed(t, sealedDir, key)
	if err != nil {
		t.Fatal(err)
	}
	plain := open(t, t.TempDir(), 64<<20)
	// A marker that cannot appear in the ciphertext by chance.
	content := bytes.Repeat([]byte("hoard-plaintext!"), 3*cs/16+100)
	f := fid(1)
	es := []*Entry{fill(t, sealed, f, content, 1), fill(t, plain, f, content, 1)}
	if sealed.Entry(f).Path() != "" {
		t.Fatal("an encrypted cache hands its file to the kernel")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		switch r.IntN(3) {
		case 0, 1:
			off := r.Int64N(4 * cs)
			p := data(1+r.IntN(3*sector), byte(i))
			for _, e := range es {
				if _, err := e.WriteAt(p, off); err != nil {
					t.Fatal(err)
				}
			}
		case 2:
			size := r.Int64N(4 * cs)
			for _, e := range es {
				if err := e.Truncate(size); err != nil {
					t.Fatal(err)
				}
			}
		}
		if got, want := readAll(t, es[0]), readAll(t, es[1]); !bytes.Equal(got, want) {
			t.Fatalf("step %d: the encrypted cache reads %d bytes differing from the plain one's %d", i, len(got), len(want))
		}
	}
	// The first write made the marker's chunk dirty whatever came after;
	// check every cache file on disk.
	filepath.Walk(filepath.Join(sealedDir, "files"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			if bytes.Contains(b, []byte("plaintext")) {
				t.Errorf("%s holds plaintext", p)
			}
		}
		return nil
	})
}

// An encrypted cache starts empty: a new process has a new key. One
// holding writes not yet stored refuses to open rather than drop them.
func TestSealedStartsEmpty(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir, Size: 64 << 20, ChunkSize: cs, Key: bytes.Repeat([]byte{1}, KeySize)})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, c, fid(1), data(3*cs, 1), 1)
	c.Close()
	c2, err := openSealed(t, dir, bytes.Repeat([]byte{2}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := c2.Lookup(fid(1)); ok {
		t.Fatalf("an encrypted cache kept an entry of the last process: %v", e.FID())
	}
	e := c2.Entry(fid(2))
	if _, err := e.Learn(status(fid(2), 0, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.WriteAt([]byte("unstored"), 0); err != nil {
		t.Fatal(err)
	}
	c2.Close()
	if _, err := openSealed(t, dir, bytes.Repeat([]byte{3}, KeySize)); err == nil {
		t.Fatal("an encrypted cache holding unstored writes opened, dropping them")
	}
	if _, err := Open(Options{Dir: t.TempDir(), Size: 1 << 20, Key: []byte("short")}); err == nil {
		t.Fatal("a short key was taken")
	}
}
