package integration

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/testkit"
)

// The fault campaign's data workload: each worker owns one directory and
// writes, reads and renames its own files there through its client (a
// library client, or a FUSE mount), recording every version it wrote and
// what was acknowledged of it, so that what any client reads can be judged.

// fcVer is one write session's content: O_TRUNC, the bytes, maybe fsync,
// close.
type fcVer struct {
	seed uint64
	size int
	sum  [32]byte
	// durable: fsync returned nil, or close did for a client that takes
	// no delegations (it stores at close). Only these are acknowledged
	// against a kill -9: a close under a write delegation leaves the data
	// in the client's cache (the write-back window, docs/consistency.md).
	durable bool
	closed  bool // close returned nil
	failed  bool // some step failed: it may or may not have landed
}

// fcContent is a version's bytes.
func fcContent(seed uint64, size int) []byte {
	b := make([]byte, size+8)
	x := seed | 1
	for i := 0; i < size; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b[:size]
}

// fcFile is one file a worker made, under the name it has now.
type fcFile struct {
	name string
	// alt is the name it had before a rename whose outcome is unknown:
	// it is under one of the two, and the worker leaves it alone until
	// the verifier found which.
	alt  string
	vers []fcVer
}

// floor is the index of the last acknowledged version (-1: none). The
// file must hold it or a later one.
func (f *fcFile) floor() int {
	for i := len(f.vers) - 1; i >= 0; i-- {
		if f.vers[i].durable {
			return i
		}
	}
	return -1
}

// judge says why data cannot be what f holds ("": it can). The floor
// version must match byte for byte; a later one may also show partly
// stored (a recall or a crash in the middle of its session: each byte its
// own or zero, no longer than it), as may the empty file of its O_TRUNC.
func (f *fcFile) judge(data []byte) string {
	floor := f.floor()
	sum := sha256.Sum256(data)
	for i := max(floor, 0); i < len(f.vers); i++ {
		v := f.vers[i]
		if sum == v.sum {
			return ""
		}
		if i != floor && zeroOr(data, fcContent(v.seed, v.size)) {
			return ""
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "read %d bytes (sha256 %x) that are no version from the last acknowledged one on; versions:", len(data), sum[:6])
	for i, v := range f.vers {
		fmt.Fprintf(&b, " [%d: %d bytes %x", i, v.size, v.sum[:6])
		if v.durable {
			b.WriteString(" acknowledged")
		} else if v.closed {
			b.WriteString(" closed")
		}
		if v.failed {
			b.WriteString(" failed")
		}
		if i == floor {
			b.WriteString(" FLOOR")
		}
		b.WriteString("]")
	}
	return b.String()
}

func zeroOr(data, want []byte) bool {
	if len(data) > len(want) {
		return false
	}
	for i, c := range data {
		if c != 0 && c != want[i] {
			return false
		}
	}
	return true
}

// fcFS is a worker's client: a whole write session, a whole read, a
// rename, names relative to the worker's directory.
type fcFS interface {
	write(name string, pieces [][]byte, sync bool) (synced bool, err error)
	read(name string) ([]byte, error)
	rename(from, to string) error
}

type fcHandle interface {
	Write([]byte) (int, error)
	Sync() error
	Close() error
}

func fcSession(h fcHandle, pieces [][]byte, sync bool) (bool, error) {
	var err error
	for _, p := range pieces {
		if _, err = h.Write(p); err != nil {
			break
		}
	}
	synced := false
	if err == nil && sync {
		if err = h.Sync(); err == nil {
			synced = true
		}
	}
	if cerr := h.Close(); err == nil {
		err = cerr
	}
	return synced, err
}

type fcLib struct {
	c   *pathfs.FS
	dir string
}

func (l fcLib) write(name string, pieces [][]byte, sync bool) (bool, error) {
	f, err := l.c.Create(l.dir + "/" + name)
	if err != nil {
		return false, err
	}
	return fcSession(f, pieces, sync)
}

func (l fcLib) read(name string) ([]byte, error) { return testkit.TryRead(l.c, l.dir+"/"+name) }

func (l fcLib) rename(from, to string) error {
	return l.c.Rename(l.dir+"/"+from, l.dir+"/"+to)
}

// fcMount works through a FUSE mount. It holds gate shared while it has
// files open there: a process started meanwhile would carry copies of
// their descriptors, and its exec would close them, each close a FUSE
// flush that can wait for the very process being restarted (serverProc's
// prepare says more).
type fcMount struct {
	dir  string
	gate *sync.RWMutex
}

func (m fcMount) write(name string, pieces [][]byte, sync bool) (bool, error) {
	m.gate.RLock()
	defer m.gate.RUnlock()
	f, err := os.OpenFile(filepath.Join(m.dir, name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return false, err
	}
	return fcSession(f, pieces, sync)
}

func (m fcMount) read(name string) ([]byte, error) {
	m.gate.RLock()
	defer m.gate.RUnlock()
	return os.ReadFile(filepath.Join(m.dir, name))
}

func (m fcMount) rename(from, to string) error {
	m.gate.RLock()
	defer m.gate.RUnlock()
	return os.Rename(filepath.Join(m.dir, from), filepath.Join(m.dir, to))
}

// fcWorker runs one client's share of the workload, one operation at a
// time; the verifier reads its files only while it is stopped.
type fcWorker struct {
	name string // its directory at the server, /name
	fs   fcFS
	// through: close stores (no delegations), so it acknowledges.
	through bool
	rng     *rand.Rand
	files   []*fcFile
	next    int
	// report hears of a read that cannot be right.
	report func(string)

	done, ok                             atomic.Int64 // operations completed, and succeeded
	writes, syncs, reads, renames, fails atomic.Int64
	nospace                              atomic.Int64
	lastErr                              atomic.Value
}

const fcMaxFiles = 12

func (w *fcWorker) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		w.step()
		// A short pause spreads the operations among the faults.
		time.Sleep(time.Duration(w.rng.IntN(15)) * time.Millisecond)
	}
}

func (w *fcWorker) live() []*fcFile {
	var out []*fcFile
	for _, f := range w.files {
		if f.alt == "" {
			out = append(out, f)
		}
	}
	return out
}

func (w *fcWorker) step() {
	live := w.live()
	p := w.rng.IntN(100)
	var err error
	switch {
	case len(live) == 0 || p < 50:
		var f *fcFile
		if len(w.files) < fcMaxFiles && (len(live) == 0 || w.rng.IntN(3) == 0) {
			f = &fcFile{name: w.newName()}
			w.files = append(w.files, f)
		} else {
			f = live[w.rng.IntN(len(live))]
		}
		err = w.write(f)
	case p < 80:
		err = w.read(live[w.rng.IntN(len(live))])
	default:
		err = w.rename(live[w.rng.IntN(len(live))])
	}
	w.done.Add(1)
	if err == nil {
		w.ok.Add(1)
		return
	}
	w.fails.Add(1)
	w.lastErr.Store(err.Error())
	if errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "no space") {
		w.nospace.Add(1)
	}
}

func (w *fcWorker) newName() string {
	w.next++
	return fmt.Sprintf("f%03d", w.next)
}

// size is mostly small, sometimes several chunks (256 KiB) long.
func (w *fcWorker) size() int {
	switch p := w.rng.IntN(10); {
	case p < 6:
		return w.rng.IntN(64 << 10)
	case p < 9:
		return w.rng.IntN(1 << 20)
	}
	return 1<<20 + w.rng.IntN(2<<20)
}

func (w *fcWorker) write(f *fcFile) error {
	return w.writeSized(f, w.size(), w.rng.IntN(2) == 0)
}

// writeSized runs a write session of size bytes, fsynced if sync.
func (w *fcWorker) writeSized(f *fcFile, size int, sync bool) error {
	v := fcVer{seed: w.rng.Uint64(), size: size, failed: true}
	data := fcContent(v.seed, v.size)
	v.sum = sha256.Sum256(data)
	var pieces [][]byte
	for len(data) > 0 {
		n := min(len(data), 1+w.rng.IntN(len(data)))
		if w.rng.IntN(2) == 0 {
			n = len(data)
		}
		pieces = append(pieces, data[:n])
		data = data[n:]
	}
	// Recorded before it starts: from its open on, it may land.
	f.vers = append(f.vers, v)
	vp := &f.vers[len(f.vers)-1]
	w.writes.Add(1)
	synced, err := w.fs.write(f.name, pieces, sync)
	if synced {
		vp.durable = true
		w.syncs.Add(1)
	}
	if err == nil {
		vp.closed, vp.failed = true, false
		if w.through {
			vp.durable = true
		}
	}
	return err
}

func (w *fcWorker) read(f *fcFile) error {
	w.reads.Add(1)
	data, err := w.fs.read(f.name)
	if err != nil {
		return err
	}
	if why := f.judge(data); why != "" {
		w.report(fmt.Sprintf("%s read /%s/%s: %s", w.name, w.name, f.name, why))
	}
	return nil
}

func (w *fcWorker) rename(f *fcFile) error {
	w.renames.Add(1)
	to := w.newName()
	err := w.fs.rename(f.name, to)
	switch {
	case err == nil:
		f.name = to
	case errors.Is(err, syscall.ENOENT):
		// An answer: nothing moved.
	default:
		f.alt, f.name = f.name, to
	}
	return err
}
