package cache

import (
	"testing"
)

// Largest names the files holding the most space, most first, counting
// space as the limit does, and leaves out dropped and empty ones.
func TestLargest(t *testing.T) {
	c := open(t, t.TempDir(), 64<<20)
	sizes := []int{3 * cs, 100, 5*cs + 1, cs, 0, 2 * cs}
	for i, n := range sizes {
		fill(t, c, fid(uint64(i+1)), data(n, byte(i)), 1)
	}
	if err := c.Drop(fid(3)); err != nil {
		t.Fatal(err)
	}
	got := c.Largest(3)
	want := []Usage{{FID: fid(1), Bytes: 3 * cs}, {FID: fid(6), Bytes: 2 * cs}, {FID: fid(4), Bytes: cs}}
	if len(got) != len(want) {
		t.Fatalf("Largest(3) = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Largest(3) = %v, want %v", got, want)
		}
	}
	all := c.Largest(10)
	if len(all) != 4 || all[3] != (Usage{FID: fid(2), Bytes: blockSize}) {
		t.Fatalf("Largest(10) = %v: want 4 files, the last %v holding one block", all, fid(2))
	}
	var sum int64
	for _, u := range all {
		sum += u.Bytes
	}
	if used := c.Used(); sum != used {
		t.Fatalf("Largest counts %d bytes, the cache holds %d", sum, used)
	}
	if c.Largest(0) != nil {
		t.Fatal("Largest(0) is not empty")
	}
}
