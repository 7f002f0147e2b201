package vnode

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hoardfs/hoard/node"
)

// Pinned is one version of a file's bytes, taken under the file's lock
// and read after it is released: a slow reader (a client that does not
// read its socket) then holds up nobody's commit. A commit that makes a
// new generation renames it over the data file, and the pinned
// descriptor keeps the old one; a commit that writes in place into the
// pinned generation (a small write into a big file) marks the pins whose
// range it touches as spoiled, before it writes, instead of waiting for
// them: a spoiled reader must not hand on what it read.
type Pinned struct {
	// Status is the status of the version pinned.
	Status node.Status
	// File is that version's data file, nil if the bytes are inline (Mem)
	// or there are none (zeros).
	File *os.File
	// Mem is a copy of the bytes of an inline file.
	Mem []byte
	// Have is the data file's length when pinned: past it, up to the
	// size, the version reads as zeros, however the file grows since.
	Have int64

	s        *Store
	key      pinKey
	off, end int64
	spoiled  atomic.Bool
}

type pinKey struct{ vol, vnode, gen uint64 }

// pins are the Pinned of data files still open, by generation.
type pins struct {
	mu sync.Mutex
	m  map[pinKey]map[*Pinned]struct{}
}

// PinData pins f's current version for reading bytes [off, off+n) after
// the lock: the caller reads p.File (or p.Mem), checks Spoiled once it
// has read, and calls Release.
func (s *Store) PinData(f node.FID, off, n int64) (*Pinned, error) {
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("read %v: negative range: %w", f, syscall.EINVAL)
	}
	l := s.lock(f)
	l.RLock()
	defer l.RUnlock()
	st, gen, fd, mem, err := s.openData(f)
	if err != nil {
		return nil, err
	}
	p := &Pinned{Status: st, Mem: mem, s: s, off: off, end: off + n}
	if fd == nil {
		return p, nil
	}
	fi, err := fd.Stat()
	if err != nil {
		fd.Close()
		return nil, err
	}
	p.File, p.Have, p.key = fd, fi.Size(), pinKey{f.Volume, f.Vnode, gen}
	s.pins.mu.Lock()
	if s.pins.m == nil {
		s.pins.m = map[pinKey]map[*Pinned]struct{}{}
	}
	if s.pins.m[p.key] == nil {
		s.pins.m[p.key] = map[*Pinned]struct{}{}
	}
	s.pins.m[p.key][p] = struct{}{}
	s.pins.mu.Unlock()
	return p, nil
}

// Spoiled reports whether a commit wrote into the pinned range in place
// since the pin: what was read from File may mix two versions.
func (p *Pinned) Spoiled() bool { return p.spoiled.Load() }

// Release ends the pin.
func (p *Pinned) Release() {
	if p.File == nil {
		return
	}
	s := p.s
	s.pins.mu.Lock()
	if set := s.pins.m[p.key]; set != nil {
		delete(set, p)
		if len(set) == 0 {
			delete(s.pins.m, p.key)
		}
	}
	s.pins.mu.Unlock()
	p.File.Close()
	p.File = nil
}

// spoil marks the pins of generation gen of (vol, vnode) that overlap
// ranges, which a commit is about to write in place. It runs under the
// file's exclusive lock, so no pin of the file begins meanwhile.
func (s *Store) spoil(vol, vnode, gen uint64, ranges []extent) {
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	for p := range s.pins.m[pinKey{vol, vnode, gen}] {
		for _, e := range ranges {
			if e.off < p.end && p.off < e.end {
				p.spoiled.Store(true)
				break
			}
		}
	}
}
