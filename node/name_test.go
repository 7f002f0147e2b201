package node

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

func TestCheckName(t *testing.T) {
	ok := []string{"a", "a.b", "...", ".hidden", strings.Repeat("x", MaxName), "ünïcödé", "with space"}
	for _, n := range ok {
		if err := CheckName(n); err != nil {
			t.Errorf("%q refused: %v", n, err)
		}
	}
	bad := map[string]syscall.Errno{"": syscall.EINVAL, ".": syscall.EINVAL, "..": syscall.EINVAL,
		"a/b": syscall.EINVAL, "/": syscall.EINVAL, "a\x00": syscall.EINVAL, strings.Repeat("x", MaxName+1): syscall.ENAMETOOLONG}
	for n, want := range bad {
		if err := CheckName(n); !errors.Is(err, want) {
			t.Errorf("%q: got %v, want %v", n, err, want)
		}
	}
}

func TestCheckVolumeName(t *testing.T) {
	for _, n := range []string{"root", "__bypass", "a.b-c+d_e", strings.Repeat("v", 64)} {
		if err := CheckVolumeName(n); err != nil {
			t.Errorf("%q refused: %v", n, err)
		}
	}
	for _, n := range []string{"", ".x", "a/b", "a b", strings.Repeat("v", 65), "..", "ä"} {
		if err := CheckVolumeName(n); err == nil {
			t.Errorf("%q accepted", n)
		}
	}
}

// FuzzCheckName: an accepted name is a single, bounded path component.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"a", "..", "a/b", "\x00", strings.Repeat("y", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if CheckName(name) != nil {
			return
		}
		if name == "" || name == "." || name == ".." || len(name) > MaxName || strings.ContainsAny(name, "/\x00") {
			t.Fatalf("accepted %q", name)
		}
	})
}
