package fsx

import (
	"errors"
	"path/filepath"
	"testing"
)

// The checker passes on the local file system, with every operation.
func TestLocalDisk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	w := map[Op]int{Read: 30, Write: 25, Truncate: 20, Sync: 5, Allocate: 5, MapRead: 10, Reopen: 5}
	res, err := Run(Config{Seed: 1, MaxSize: 1 << 20, MaxLen: 64 << 10, Ops: 2000, Weights: w,
		Open: func() (File, error) { return OpenOS(path) }}, make([]byte, 300<<10))
	if err != nil {
		t.Fatal(err)
	}
	for o := Op(0); o < Remount; o++ {
		if res.Counts[o] == 0 {
			t.Errorf("no %s in %v", o, res)
		}
	}
}

// lossy forgets every fifth truncation, as the size race did.
type lossy struct {
	File
	n int
}

func (l *lossy) Truncate(size int64) error {
	if l.n++; l.n%5 == 0 {
		return nil
	}
	return l.File.Truncate(size)
}

// The checker catches a truncation that was acknowledged and not done.
func TestCatchesLostTruncate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	_, err := Run(Config{Seed: 2, MaxSize: 1 << 20, MaxLen: 64 << 10, Ops: 2000,
		Weights: map[Op]int{Read: 1, Write: 1, Truncate: 1},
		Open: func() (File, error) {
			f, err := OpenOS(path)
			return &lossy{File: f}, err
		}}, nil)
	var fail *Failure
	if !errors.As(err, &fail) {
		t.Fatalf("a lost truncation went unseen: %v", err)
	}
	t.Log(err)
}

// lossyWrite drops the last byte of one write in ten.
type lossyWrite struct {
	File
	n int
}

func (l *lossyWrite) WriteAt(p []byte, off int64) (int, error) {
	if l.n++; l.n%10 == 0 && len(p) > 1 {
		l.File.WriteAt(p[:len(p)-1], off)
		return len(p), nil
	}
	return l.File.WriteAt(p, off)
}

// The checker catches a byte that a write acknowledged and did not write.
func TestCatchesLostByte(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	_, err := Run(Config{Seed: 3, MaxSize: 1 << 16, MaxLen: 1 << 10, Ops: 5000,
		Weights: map[Op]int{Read: 3, Write: 1},
		Open: func() (File, error) {
			f, err := OpenOS(path)
			return &lossyWrite{File: f}, err
		}}, make([]byte, 1<<15))
	var fail *Failure
	if !errors.As(err, &fail) {
		t.Fatalf("a lost byte went unseen: %v", err)
	}
}
