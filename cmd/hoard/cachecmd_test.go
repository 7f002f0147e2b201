package main

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"
)

// A control call a signal interrupts is made again, unless the command
// was told to stop (Ctrl-C).
func TestCtlRetriesInterrupted(t *testing.T) {
	calls := 0
	setxattr = func(path, attr string, data []byte, flags int) error {
		if calls++; calls < 3 {
			return unix.EINTR
		}
		return nil
	}
	getxattr = func(path, attr string, dest []byte) (int, error) {
		if calls++; calls < 3 {
			return 0, unix.EINTR
		}
		return 7, nil
	}
	defer func() { setxattr, getxattr = unix.Setxattr, unix.Getxattr }()
	if err := setCtl(context.Background(), "/m/f", "user.hoard.warm", nil); err != nil || calls != 3 {
		t.Fatalf("setCtl: %v after %d calls, want success on the third", err, calls)
	}
	calls = 0
	if n, err := getCtl("/m/f", "user.hoard.cache", nil); err != nil || n != 7 || calls != 3 {
		t.Fatalf("getCtl: %d, %v after %d calls", n, err, calls)
	}
	calls = 0
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := setCtl(ctx, "/m/f", "user.hoard.warm", nil); err != unix.EINTR || calls != 1 {
		t.Fatalf("setCtl after Ctrl-C: %v after %d calls, want EINTR at once", err, calls)
	}
}
