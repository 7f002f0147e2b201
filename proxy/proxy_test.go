package proxy

import (
	"os"
	"path/filepath"
	"testing"
)

// Each start is a new epoch, counted durably in the proxy's directory; a
// file that holds no number is refused, not taken as a first start.
func TestNextEpoch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "epoch")
	for want := uint64(1); want <= 3; want++ {
		got, err := nextEpoch(path)
		if err != nil || got != want {
			t.Fatalf("start %d: epoch %d, %v", want, got, err)
		}
	}
	if b, _ := os.ReadFile(path); string(b) != "3\n" {
		t.Fatalf("epoch file holds %q, want 3", b)
	}
	os.WriteFile(path, []byte("three\n"), 0o600)
	if e, err := nextEpoch(path); err == nil {
		t.Fatalf("a corrupt epoch file gave epoch %d", e)
	}
}
