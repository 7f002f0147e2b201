// Package fsx checks one file's bytes and size against an in-memory model
// under random operations, as fsx (the File System eXerciser of BSD and
// xfstests) does: every read is compared byte for byte, and the size after
// every operation that may change it. It finds what histories of many
// clients do not: a size or a range of bytes that one file system call
// acknowledged and a later one does not show.
package fsx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"
)

// File is the file under test. Size must be the file system's answer
// (fstat), never a cached guess of the checker's.
type File interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Truncate(size int64) error
	Sync() error
	Size() (int64, error)
	// Allocate is posix_fallocate: [off, off+n) exists afterwards.
	Allocate(off, n int64) error
	Close() error
}

// Mapper is a File that can also be read through a shared mapping.
type Mapper interface {
	MapRead(p []byte, off int64) error
}

// Op is one kind of operation.
type Op int

const (
	Read Op = iota
	Write
	Truncate
	Sync
	Allocate
	MapRead
	Reopen
	Remount
	numOps
)

var opNames = [...]string{"read", "write", "truncate", "fsync", "fallocate", "mapread", "reopen", "remount"}

func (o Op) String() string { return opNames[o] }

// Config says what to run. Weights of zero leave an operation out.
type Config struct {
	Seed    uint64
	MaxSize int64 // the file stays below this
	MaxLen  int64 // the largest read, write or allocation
	// Ops and For bound the run; whichever ends first (For 0: no limit).
	Ops int
	For time.Duration
	// Weights of each Op; DefaultWeights if nil.
	Weights map[Op]int
	// Open (re)opens the file; Remount remounts before reopening. The
	// checker closes the old File first.
	Open    func() (File, error)
	Remount func() error
	// Present: the file holds initial already (written elsewhere, so that
	// the file system under test has to fetch it); the run starts by
	// reading it back rather than writing it.
	Present bool
}

// DefaultWeights is the mix of the reproduction that first showed a lost
// size change: reads, writes anywhere, truncations, fsyncs, and some
// allocations, mapped reads and reopens.
var DefaultWeights = map[Op]int{Read: 33, Write: 28, Truncate: 24, Sync: 6, Allocate: 4, MapRead: 3, Reopen: 2}

// Failure is a mismatch between the file and the model.
type Failure struct {
	Op      int    // the operation's number, from 1
	What    string // what was found
	History []string
}

func (f *Failure) Error() string {
	return fmt.Sprintf("fsx: operation %d: %s\nlast operations:\n  %s", f.Op, f.What, strings.Join(f.History, "\n  "))
}

// Result is what a run did.
type Result struct {
	Ops    int
	Counts [numOps]int
	Final  []byte // the model's final bytes
}

func (r Result) String() string {
	var parts []string
	for o := Op(0); o < numOps; o++ {
		if r.Counts[o] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", o, r.Counts[o]))
		}
	}
	return fmt.Sprintf("%d operations (%s), final size %d", r.Ops, strings.Join(parts, ", "), len(r.Final))
}

// checker holds one run's state.
type checker struct {
	cfg   Config
	rng   *rand.Rand
	f     File
	model []byte
	hist  []string
	n     int
}

const keepHistory = 40

// Run runs the checker on the file Open returns, which it first makes
// hold initial (its content is the model's start). It returns the first
// mismatch as a *Failure, or an error an operation returned.
func Run(cfg Config, initial []byte) (Result, error) {
	if cfg.MaxSize <= 0 || cfg.MaxLen <= 0 || cfg.Open == nil {
		return Result{}, errors.New("fsx: MaxSize, MaxLen and Open are required")
	}
	if cfg.Weights == nil {
		cfg.Weights = DefaultWeights
	}
	c := &checker{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	var res Result
	f, err := cfg.Open()
	if err != nil {
		return res, err
	}
	c.f = f
	defer func() { c.f.Close() }()
	c.model = append([]byte(nil), initial...)
	if cfg.Present {
		if err := c.readAll(); err != nil {
			return res, err
		}
	} else {
		if err := f.Truncate(0); err != nil {
			return res, err
		}
		if _, err := f.WriteAt(initial, 0); err != nil {
			return res, err
		}
		if err := f.Sync(); err != nil {
			return res, err
		}
	}
	total := 0
	for _, w := range cfg.Weights {
		total += w
	}
	start := time.Now()
	for c.n = 1; cfg.Ops <= 0 || c.n <= cfg.Ops; c.n++ {
		if cfg.For > 0 && time.Since(start) > cfg.For {
			break
		}
		if cfg.Ops <= 0 && cfg.For <= 0 {
			break
		}
		op := c.pick(total)
		if err := c.do(op); err != nil {
			res.Ops, res.Final = c.n, c.model
			return res, err
		}
		res.Counts[op]++
		res.Ops = c.n
	}
	// A last check of the whole file, as it is read back.
	if err := c.readAll(); err != nil {
		return res, err
	}
	res.Final = c.model
	return res, nil
}

func (c *checker) pick(total int) Op {
	r := c.rng.IntN(total)
	for o := Op(0); o < numOps; o++ {
		w := c.cfg.Weights[o]
		if o == MapRead {
			if _, ok := c.f.(Mapper); !ok {
				w = 0
			}
		}
		if o == Remount && c.cfg.Remount == nil {
			w = 0
		}
		if r < w {
			return o
		}
		r -= w
	}
	return Read
}

func (c *checker) note(format string, args ...any) {
	c.hist = append(c.hist, fmt.Sprintf("%d: ", c.n)+fmt.Sprintf(format, args...))
	if len(c.hist) > keepHistory {
		c.hist = c.hist[len(c.hist)-keepHistory:]
	}
}

func (c *checker) fail(format string, args ...any) error {
	return &Failure{Op: c.n, What: fmt.Sprintf(format, args...), History: append([]string(nil), c.hist...)}
}

func (c *checker) failed(op string, err error) error {
	return c.fail("%s: %v", op, err)
}

// span picks an offset below limit and a length of 1..MaxLen.
func (c *checker) span(limit int64) (int64, int64) {
	off := c.rng.Int64N(max(limit, 1))
	return off, 1 + c.rng.Int64N(c.cfg.MaxLen)
}

func (c *checker) do(op Op) error {
	size := int64(len(c.model))
	switch op {
	case Read:
		off, n := c.span(size + size/8 + 1)
		c.note("read %d+%d (size %d)", off, n, size)
		return c.read(off, n, false)
	case MapRead:
		if size == 0 {
			return nil
		}
		off, n := c.span(size)
		n = min(n, size-off)
		c.note("mapread %d+%d (size %d)", off, n, size)
		return c.read(off, n, true)
	case Write:
		off, n := c.span(c.cfg.MaxSize - c.cfg.MaxLen)
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(c.rng.Uint32())
		}
		c.note("write %d+%d (size %d)", off, n, size)
		k, err := c.f.WriteAt(p, off)
		if err != nil || k != len(p) {
			return c.fail("write %d+%d: wrote %d: %v", off, n, k, err)
		}
		if end := off + n; end > size {
			c.model = append(c.model, make([]byte, end-size)...)
		}
		copy(c.model[off:], p)
		return c.checkSize("write")
	case Truncate:
		to := c.rng.Int64N(c.cfg.MaxSize)
		c.note("truncate %d -> %d", size, to)
		if err := c.f.Truncate(to); err != nil {
			return c.failed("truncate", err)
		}
		c.resize(to)
		return c.checkSize("truncate")
	case Allocate:
		off, n := c.span(c.cfg.MaxSize - c.cfg.MaxLen)
		c.note("fallocate %d+%d (size %d)", off, n, size)
		if err := c.f.Allocate(off, n); err != nil {
			return c.failed("fallocate", err)
		}
		if end := off + n; end > size {
			c.resize(end)
		}
		return c.checkSize("fallocate")
	case Sync:
		c.note("fsync (size %d)", size)
		if err := c.f.Sync(); err != nil {
			return c.failed("fsync", err)
		}
		return c.checkSize("fsync")
	case Reopen, Remount:
		c.note("%s (size %d)", op, size)
		if err := c.f.Close(); err != nil {
			return c.failed("close", err)
		}
		if op == Remount {
			if err := c.cfg.Remount(); err != nil {
				return c.failed("remount", err)
			}
		}
		f, err := c.cfg.Open()
		if err != nil {
			return c.failed("open", err)
		}
		c.f = f
		return c.checkSize(op.String())
	}
	return nil
}

func (c *checker) resize(to int64) {
	if size := int64(len(c.model)); to > size {
		c.model = append(c.model, make([]byte, to-size)...)
	} else {
		c.model = c.model[:to]
	}
}

func (c *checker) checkSize(after string) error {
	got, err := c.f.Size()
	if err != nil {
		return c.failed("fstat after "+after, err)
	}
	if want := int64(len(c.model)); got != want {
		return c.fail("size after %s is %d, model says %d", after, got, want)
	}
	return nil
}

func (c *checker) read(off, n int64, mapped bool) error {
	p := make([]byte, n)
	var k int
	var err error
	if mapped {
		err = c.f.(Mapper).MapRead(p, off)
		k = len(p)
	} else {
		k, err = c.f.ReadAt(p, off)
		if errors.Is(err, io.EOF) {
			err = nil
		}
	}
	if err != nil {
		return c.fail("read %d+%d: %v", off, n, err)
	}
	size := int64(len(c.model))
	want := []byte{}
	if off < size {
		want = c.model[off:min(size, off+n)]
	}
	if int64(k) != int64(len(want)) {
		return c.fail("read %d+%d returned %d bytes, model has %d (size %d)", off, n, k, len(want), size)
	}
	if i := FirstDiff(p[:k], want); i >= 0 {
		return c.fail("read %d+%d differs from byte %d (file offset %d): got %x, model %x",
			off, n, i, off+int64(i), p[i:min(i+8, k)], want[i:min(i+8, len(want))])
	}
	return nil
}

// readAll compares the whole file.
func (c *checker) readAll() error {
	c.note("read all (size %d)", len(c.model))
	if err := c.checkSize("the run"); err != nil {
		return err
	}
	return c.read(0, int64(len(c.model))+1, false)
}

// FirstDiff is the first index at which a and b differ, -1 if equal.
func FirstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
