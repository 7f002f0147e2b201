package proxystore

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// loc is where a chunk's bytes are: a pool file and a block in it
// (pooled), or a chunk file's number (per-chunk).
type loc struct {
	pool  int32
	block int64
}

// zone is room a file's chunk reserved for the chunks after it: base
// is the chunk at zone.at, n how many fit. It is a hint, not an
// allocation: other files take its blocks when nothing else is free.
type zone struct {
	at      loc
	base, n int64
}

// layout places chunks on disk; the Store keeps the index and accounts
// for space (in blocks) and calls it with its lock held, except for
// readAt and writeAt.
type layout interface {
	// place finds room for nb blocks of chunk idx of f, read by user.
	place(f *file, idx, nb int64, user string) (loc, bool)
	// at is where chunk i of a run starting at start is; a layout that
	// stores no two chunks together answers a loc no run starts at.
	at(start loc, i int64) loc
	// release gives back the room of one placed chunk of nb blocks.
	release(at loc, nb int64)
	// free gives back a run's room: n chunks, the last of last bytes.
	free(start loc, n, last int64)
	// claim marks a run of the index as stored at load; false if its
	// room is not the layout's or overlaps a run claimed before.
	claim(start loc, n, last int64) bool
	// forget removes what no run holds after an unclean stop.
	forget(held map[loc]bool) error
	readAt(at loc, p []byte, off int64) (int, error)
	writeAt(at loc, p []byte) error
	close() error
}

// maxZone bounds the room one file reserves, in chunks: a very large file
// is stored in zones of this size, one after the other where possible.
// A file keeps its last maxZones zones.
const (
	maxZone  = 256
	maxZones = 4
)

// maxCursors bounds the users whose cursors are kept.
const maxCursors = 4096

// pools is the pooled layout: a few preallocated cache files, each a
// bitmap of 4 KiB blocks.
type pools struct {
	files  []*os.File
	bits   [][]uint64
	blocks int64 // per pool
	cb     int64 // blocks per chunk
	// cursor is where each user's next file goes: the files one user
	// reads are stored one after the other.
	cursor map[string]loc
}

func openPools(dir string, n int, blocksEach, cb int64) (*pools, error) {
	ps := &pools{blocks: blocksEach, cb: cb, cursor: map[string]loc{}}
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("pool-%d", i))
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			ps.close()
			return nil, err
		}
		ps.files = append(ps.files, f)
		ps.bits = append(ps.bits, make([]uint64, (blocksEach+63)/64))
		fi, err := f.Stat()
		if err != nil {
			ps.close()
			return nil, err
		}
		if want := blocksEach * blockSize; fi.Size() != want || fi.Sys().(*syscall.Stat_t).Blocks*512 < want {
			if err := unix.Fallocate(int(f.Fd()), 0, 0, want); err != nil {
				ps.close()
				if errors.Is(err, unix.ENOSPC) {
					return nil, fmt.Errorf("%s: the disk has no room for %d bytes of cache (allocated when the store is made)", p, want)
				}
				return nil, fmt.Errorf("%s: allocating %d bytes: %w", p, want, err)
			}
		}
	}
	return ps, nil
}

func (ps *pools) free1(p int32, b int64) bool { return ps.bits[p][b/64]&(1<<(b%64)) == 0 }

func (ps *pools) isFree(at loc, nb int64) bool {
	if at.block+nb > ps.blocks {
		return false
	}
	for b := at.block; b < at.block+nb; b++ {
		if !ps.free1(at.pool, b) {
			return false
		}
	}
	return true
}

func (ps *pools) mark(at loc, nb int64, used bool) {
	for b := at.block; b < at.block+nb; b++ {
		if used {
			ps.bits[at.pool][b/64] |= 1 << (b % 64)
		} else {
			ps.bits[at.pool][b/64] &^= 1 << (b % 64)
		}
	}
}

// stretch finds need free blocks in a row in pool p within [from, to).
func (ps *pools) stretch(p int32, from, to, need int64) (int64, bool) {
	bits := ps.bits[p]
	var n int64
	for b := from; b < to; {
		w := bits[b/64]
		if b%64 == 0 && b+64 <= to && (w == 0 || w == ^uint64(0)) {
			if w == 0 {
				n += 64
			} else {
				n = 0
			}
			b += 64
		} else {
			if w&(1<<(b%64)) == 0 {
				n++
			} else {
				n = 0
			}
			b++
		}
		if n >= need {
			return b - n, true
		}
	}
	return 0, false
}

// find looks for need free blocks from cur on: the rest of cur's pool,
// the other pools, then the start of cur's pool.
func (ps *pools) find(cur loc, need int64) (loc, bool) {
	np := int32(len(ps.files))
	if b, ok := ps.stretch(cur.pool, cur.block, ps.blocks, need); ok {
		return loc{cur.pool, b}, true
	}
	for i := int32(1); i < np; i++ {
		p := (cur.pool + i) % np
		if b, ok := ps.stretch(p, 0, ps.blocks, need); ok {
			return loc{p, b}, true
		}
	}
	if b, ok := ps.stretch(cur.pool, 0, min(cur.block+need, ps.blocks), need); ok {
		return loc{cur.pool, b}, true
	}
	return loc{}, false
}

func (ps *pools) place(f *file, idx, nb int64, user string) (loc, bool) {
	for _, z := range f.zones {
		if idx >= z.base && idx < z.base+z.n {
			if at := ps.at(z.at, idx-z.base); ps.isFree(at, nb) {
				ps.mark(at, nb, true)
				return at, true
			}
		}
	}
	cur, ok := ps.cursor[user]
	if !ok {
		if len(ps.cursor) >= maxCursors {
			clear(ps.cursor) // users come and go: start them afresh
		}
		h := fnv.New32a()
		h.Write([]byte(user))
		cur = loc{pool: int32(h.Sum32() % uint32(len(ps.files)))}
	}
	// Zones are aligned to maxZone chunks, so that a file's chunks land
	// in order whatever order they are fetched in.
	cs := ps.cb * blockSize
	base := idx - idx%maxZone
	want := blocks(min(f.size-base*cs, maxZone*cs))
	if at, ok := ps.find(cur, want); ok && want >= (idx-base)*ps.cb+nb {
		z := zone{at: at, base: base, n: (want + ps.cb - 1) / ps.cb}
		// Chunks fetched in parallel straddle a zone's end: keep the
		// last few zones, so a late chunk still lands in its own.
		f.zones = append(f.zones, z)
		if len(f.zones) > maxZones {
			f.zones = f.zones[1:]
		}
		ps.cursor[user] = loc{at.pool, at.block + want}
		at = ps.at(at, idx-base)
		ps.mark(at, nb, true)
		return at, true
	}
	at, ok := ps.find(cur, nb)
	if !ok {
		return loc{}, false
	}
	ps.cursor[user] = loc{at.pool, at.block + nb}
	ps.mark(at, nb, true)
	return at, true
}

func (ps *pools) at(start loc, i int64) loc { return loc{start.pool, start.block + i*ps.cb} }

func (ps *pools) runBlocks(n, last int64) int64 { return (n-1)*ps.cb + blocks(last) }

func (ps *pools) release(at loc, nb int64) { ps.mark(at, nb, false) }

func (ps *pools) free(start loc, n, last int64) { ps.mark(start, ps.runBlocks(n, last), false) }

func (ps *pools) claim(start loc, n, last int64) bool {
	nb := ps.runBlocks(n, last)
	if start.pool < 0 || int(start.pool) >= len(ps.files) || start.block < 0 || !ps.isFree(start, nb) {
		return false
	}
	ps.mark(start, nb, true)
	return true
}

// forget has nothing to do: room no run holds is free in the bitmap.
func (ps *pools) forget(map[loc]bool) error { return nil }

func (ps *pools) readAt(at loc, p []byte, off int64) (int, error) {
	return ps.files[at.pool].ReadAt(p, at.block*blockSize+off)
}

func (ps *pools) writeAt(at loc, p []byte) error {
	_, err := ps.files[at.pool].WriteAt(p, at.block*blockSize)
	return err
}

func (ps *pools) close() error {
	var err error
	for _, f := range ps.files {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// chunkFiles is the per-chunk layout: chunk files numbered in the order
// they are made, 256 to a directory.
type chunkFiles struct {
	dir  string
	next int64
}

func openChunkFiles(dir string) (*chunkFiles, error) {
	d := filepath.Join(dir, "chunks")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, err
	}
	return &chunkFiles{dir: d, next: 1}, nil
}

func (c *chunkFiles) path(at loc) string {
	return filepath.Join(c.dir, fmt.Sprintf("%02x", at.block%256), strconv.FormatInt(at.block, 10))
}

func (c *chunkFiles) place(*file, int64, int64, string) (loc, bool) {
	at := loc{block: c.next}
	c.next++
	return at, true
}

func (c *chunkFiles) at(start loc, i int64) loc {
	if i == 0 {
		return start
	}
	return loc{pool: -1}
}

func (c *chunkFiles) release(at loc, _ int64) { os.Remove(c.path(at)) }

func (c *chunkFiles) free(start loc, _, _ int64) { os.Remove(c.path(start)) }

func (c *chunkFiles) claim(start loc, n, _ int64) bool {
	if n != 1 || start.pool != 0 || start.block <= 0 {
		return false
	}
	c.next = max(c.next, start.block+1)
	return true
}

func (c *chunkFiles) forget(held map[loc]bool) error {
	subs, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	for _, sub := range subs {
		ents, err := os.ReadDir(filepath.Join(c.dir, sub.Name()))
		if err != nil {
			return err
		}
		for _, e := range ents {
			if id, err := strconv.ParseInt(e.Name(), 10, 64); err != nil || !held[loc{block: id}] {
				os.Remove(filepath.Join(c.dir, sub.Name(), e.Name()))
			}
		}
	}
	return nil
}

func (c *chunkFiles) readAt(at loc, p []byte, off int64) (int, error) {
	f, err := os.Open(c.path(at))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.ReadAt(p, off)
}

func (c *chunkFiles) writeAt(at loc, p []byte) error {
	path := c.path(at)
	err := os.WriteFile(path, p, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(path), 0o700); err == nil {
			err = os.WriteFile(path, p, 0o600)
		}
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

func (c *chunkFiles) close() error { return nil }
