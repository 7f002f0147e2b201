package poll

import (
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	n := 0
	if !Until(time.Second, func() bool { n++; return n == 5 }) || n != 5 {
		t.Fatalf("a condition true at the fifth look: %d looks", n)
	}
	start := time.Now()
	if Until(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a false condition held")
	}
	if d := time.Since(start); d < 20*time.Millisecond || d > time.Second {
		t.Fatalf("gave up after %v, want about 20 ms", d)
	}
}
