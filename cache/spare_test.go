package cache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/poll"
)

func spareFiles(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "spare"))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func waitSpares(t *testing.T, dir string, want int) {
	t.Helper()
	if !poll.Until(10*time.Second, func() bool { return spareFiles(t, dir) == want }) {
		t.Fatalf("%d spare files, want %d", spareFiles(t, dir), want)
	}
}

// New cache files are spares renamed into place, each replaced; spares
// left at a stop serve the next start; a spare never replaces a file.
func TestSpareFiles(t *testing.T) {
	dir := t.TempDir()
	c := open(t, dir, 10<<20)
	waitSpares(t, dir, spareCount)
	before, _ := os.ReadDir(filepath.Join(dir, "spare"))
	content := data(1000, 3)
	e := fill(t, c, fid(1), content, 1)
	if b, err := os.ReadFile(e.Path()); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("cache file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "spare", before[0].Name())); !errors.Is(err, os.ErrNotExist) {
		// Taken in order: the first spare is the new file.
		t.Fatalf("the first spare is still there: %v", err)
	}
	waitSpares(t, dir, spareCount)
	c.Close()

	os.WriteFile(filepath.Join(dir, "spare", "junk"), []byte("not empty"), 0o600)
	c = open(t, dir, 10<<20)
	if _, err := os.Stat(filepath.Join(dir, "spare", "junk")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a spare with data in it was kept: %v", err)
	}
	if got := readAll(t, c.Entry(fid(1))); !bytes.Equal(got, content) {
		t.Fatal("the cached file did not survive the restart")
	}

	taken := filepath.Join(dir, "spare", "taken")
	os.WriteFile(taken, nil, 0o600)
	if err := rename(taken, e.Path()); err == nil {
		t.Fatal("a spare replaced a cache file")
	}
	if b, _ := os.ReadFile(e.Path()); !bytes.Equal(b, content) {
		t.Fatal("the cache file changed")
	}
}
