package testkit

import (
	"errors"
	"syscall"
	"testing"
)

// Must fails the test if err is not nil.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// WantErrno fails unless err carries errno; what names the call.
func WantErrno(t testing.TB, what string, err error, errno syscall.Errno) {
	t.Helper()
	if !errors.Is(err, errno) {
		t.Fatalf("%s: %v, want %v", what, err, errno)
	}
}
