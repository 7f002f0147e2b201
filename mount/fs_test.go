package mount

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// An EIO that reaches an application leaves a log line saying why; other
// errors, which say it themselves, do not.
func TestEIOIsLogged(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(old)
	if e := errno(fmt.Errorf("store /a: %w", errors.New("cache: chunk not present"))); e != syscall.EIO {
		t.Fatalf("errno %v, want EIO", e)
	}
	if !strings.Contains(buf.String(), "chunk not present") || !strings.Contains(buf.String(), "store /a") {
		t.Fatalf("log: %q", buf.String())
	}
	buf.Reset()
	if e := errno(fmt.Errorf("open /b: %w", syscall.ENOENT)); e != syscall.ENOENT || buf.Len() != 0 {
		t.Fatalf("ENOENT: %v, logged %q", e, buf.String())
	}
}
