package mount

import (
	"fmt"
	"syscall"
	"testing"
)

// untilKnown sends every notification once, then repeats the refused
// ones together, round by round, until the kernel takes them or ten
// rounds went by: one name the kernel forgot must not hold up the rest.
func TestUntilKnownRetriesTogether(t *testing.T) {
	refusals := map[int]int{1: 2, 3: 2, 4: 100} // ENOENT this many times
	var calls []int
	untilKnown(5, func(i int) syscall.Errno {
		calls = append(calls, i)
		if refusals[i] > 0 {
			refusals[i]--
			return syscall.ENOENT
		}
		return 0
	})
	want := []int{0, 1, 2, 3, 4, 1, 3, 4, 1, 3, 4, 4, 4, 4, 4, 4, 4, 4}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("notifications sent %v, want %v", calls, want)
	}
}
