package client

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/datapath"
)

// bypass is an open file's state while it bypasses the cache: chunks go
// from the network to the reader through a small map of buffers, never to
// the cache disk, and writes go to the server behind the writer.
type bypass struct {
	f *File

	mu     sync.Mutex
	chunks map[int64]*memChunk // fetched or in flight
	window int64               // read-ahead, in chunks
	next   int64               // where a sequential reader continues
	// probation: auto chose bypass for a first use; a random read admits
	// the file to the cache instead.
	probation bool

	// Write-behind: one contiguous run collects writes; full runs are
	// stored in the background, at most maxStores at once.
	wbuf    []byte
	woff    int64
	stores  sync.WaitGroup
	slots   chan struct{}
	failure error
	// flying are the ranges being stored; a run that overlaps one waits
	// for it, so stores of the same bytes commit in the order written.
	flying map[*[2]int64]bool
}

type memChunk struct {
	done chan struct{}
	data []byte
	dv   uint64 // the data version it was read at
	err  error
	// Under bypass.mu: readers copying from data, and whether the chunk
	// has left the map. The last of them gives the buffer back.
	refs    int
	dropped bool
}

const (
	maxBypassWindow = 32      // chunks of read-ahead at most (8 MiB of 256 KiB chunks)
	writeRun        = 4 << 20 // bytes per background store
	maxStores       = 2
)

func newBypass(f *File, probation bool) *bypass {
	return &bypass{f: f, chunks: map[int64]*memChunk{}, probation: probation,
		slots: make(chan struct{}, maxStores), flying: map[*[2]int64]bool{}}
}

// get returns chunk idx, starting its fetch if needed.
func (b *bypass) get(idx int64) *memChunk {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.getLocked(idx)
}

func (b *bypass) getLocked(idx int64) *memChunk {
	if mc := b.chunks[idx]; mc != nil {
		return mc
	}
	mc := &memChunk{done: make(chan struct{})}
	b.chunks[idx] = mc
	go func() {
		data, dv, err := b.f.n.fetchChunk(idx)
		b.mu.Lock()
		mc.data, mc.dv, mc.err = data, dv, err
		close(mc.done)
		b.releaseLocked(mc)
		b.mu.Unlock()
	}()
	return mc
}

// dropLocked takes chunk idx out of the map; its buffer goes back to the
// pool once no reader is copying from it and its fetch is over.
func (b *bypass) dropLocked(idx int64) {
	if mc := b.chunks[idx]; mc != nil {
		delete(b.chunks, idx)
		mc.dropped = true
		b.releaseLocked(mc)
	}
}

func (b *bypass) dropAllLocked() {
	for idx := range b.chunks {
		b.dropLocked(idx)
	}
}

func (b *bypass) releaseLocked(mc *memChunk) {
	select {
	case <-mc.done:
	default:
		return // the fetch will release it
	}
	if mc.dropped && mc.refs == 0 && mc.data != nil {
		datapath.PutBuffer(mc.data)
		mc.data = nil
	}
}

// readAt serves a read without the cache. It reports admit when a random
// read ends the probation: the caller then reads through the cache.
//
// Read-ahead may hold chunks of a version that another client's change has
// since replaced (the break arrived while they were buffered): those are
// dropped and the read served again from the new version, so a reader
// never mixes versions nor sees bytes older than a break it has received.
func (b *bypass) readAt(p []byte, off int64) (n int, admit bool, err error) {
	if err := b.flushWrites(true); err != nil {
		return 0, false, err
	}
	for attempt := 0; attempt < 4; attempt++ {
		n, admit, err = b.readVersion(p, off)
		if err != errVersion {
			return n, admit, err
		}
		b.mu.Lock()
		b.dropAllLocked()
		b.mu.Unlock()
	}
	return 0, false, fmt.Errorf("read %s: the file changed under every attempt: %w", b.f.name, syscall.EIO)
}

// errVersion: the chunks of a read were of different versions.
var errVersion = errors.New("chunks of different versions")

func (b *bypass) readVersion(p []byte, off int64) (n int, admit bool, err error) {
	f := b.f
	st, err := f.c.fresh(f.n)
	if err != nil {
		return 0, false, err
	}
	size := int64(st.Size)
	if off >= size {
		return 0, false, io.EOF
	}
	end := min(off+int64(len(p)), size)
	cs := f.c.cache.ChunkSize()
	first, last := off/cs, (end-1)/cs

	b.mu.Lock()
	sequential := off == b.next
	if b.probation && !sequential && off != 0 {
		b.probation = false
		b.mu.Unlock()
		return 0, true, nil
	}
	if sequential {
		b.window = min(max(2*b.window, 2), maxBypassWindow)
	} else {
		b.window = 0
	}
	b.next = end
	need := make([]*memChunk, 0, last-first+1)
	for idx := first; idx <= last; idx++ {
		mc := b.getLocked(idx)
		mc.refs++
		need = append(need, mc)
	}
	defer func() {
		b.mu.Lock()
		for _, mc := range need {
			mc.refs--
			b.releaseLocked(mc)
		}
		b.mu.Unlock()
	}()
	for idx := last + 1; idx <= last+b.window && idx*cs < size; idx++ {
		b.getLocked(idx) // read-ahead, in the background
	}
	// Keep memory bounded: what lies behind the reader is done with.
	for idx := range b.chunks {
		if idx < first || idx > last+b.window {
			b.dropLocked(idx)
		}
	}
	b.mu.Unlock()

	// Wait without holding the lock, so read-ahead never blocks a reader.
	for i, mc := range need {
		<-mc.done
		if mc.err != nil {
			b.mu.Lock()
			if b.chunks[first+int64(i)] == mc {
				b.dropLocked(first + int64(i)) // retry it next time
			}
			b.mu.Unlock()
			return n, false, mc.err
		}
		if mc.dv != st.DataVersion {
			return 0, false, errVersion
		}
		cstart := (first + int64(i)) * cs
		from := max(off, cstart) - cstart
		to := min(end-cstart, int64(len(mc.data)))
		if from < to {
			n += copy(p[n:], mc.data[from:to])
		}
		if int64(len(mc.data)) < min(cs, end-cstart) {
			break // a short chunk: the file ends here now
		}
	}
	f.c.cache.CountMiss(1)
	if int64(n) < int64(len(p)) {
		return n, false, io.EOF // at the end, or the file shrank under the read
	}
	return n, false, nil
}

// writeAt adds a write to the write-behind run, storing full runs in the
// background. Buffered reads of this file go away: they may be stale now.
func (b *bypass) writeAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	if err := b.failure; err != nil {
		b.mu.Unlock()
		return 0, err
	}
	b.dropAllLocked()
	if len(b.wbuf) > 0 && off == b.woff+int64(len(b.wbuf)) && len(b.wbuf)+len(p) <= writeRun {
		b.wbuf = append(b.wbuf, p...)
		full := len(b.wbuf) == writeRun
		b.mu.Unlock()
		if full {
			b.flushWrites(false)
		}
		return len(p), nil
	}
	b.mu.Unlock()
	if err := b.flushWrites(false); err != nil {
		return 0, err
	}
	b.mu.Lock()
	b.wbuf, b.woff = append(make([]byte, 0, max(len(p), writeRun)), p...), off
	b.mu.Unlock()
	return len(p), nil
}

// flushWrites sends the collected run in the background; with wait it
// also waits for every store in flight (reads do: they must see this
// client's own writes) and reports the first failure.
func (b *bypass) flushWrites(wait bool) error {
	b.mu.Lock()
	buf, off := b.wbuf, b.woff
	b.wbuf = nil
	b.mu.Unlock()
	if len(buf) > 0 {
		run := &[2]int64{off, off + int64(len(buf))}
		b.mu.Lock()
		overlaps := false
		for r := range b.flying {
			overlaps = overlaps || r[0] < run[1] && run[0] < r[1]
		}
		b.mu.Unlock()
		if overlaps {
			b.stores.Wait()
		}
		b.slots <- struct{}{}
		b.stores.Add(1)
		b.mu.Lock()
		b.flying[run] = true
		b.mu.Unlock()
		go func() {
			defer func() { <-b.slots; b.stores.Done() }()
			err := b.store(buf, off)
			b.mu.Lock()
			delete(b.flying, run)
			if err != nil && b.failure == nil {
				b.failure = err
			}
			b.mu.Unlock()
		}()
	}
	if wait {
		b.stores.Wait()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failure
}

// store writes one run to the server, durably; a run that cannot be
// delivered is kept under the lost directory, never dropped.
func (b *bypass) store(buf []byte, off int64) error {
	f := b.f
	c := f.c
	read := func(p []byte, at int64) error {
		copy(p, buf[at-off:])
		return nil
	}
	ranges := [][2]int64{{off, int64(len(buf))}}
	err := c.storeData(datapath.StoreArgs{FID: f.n.fid, Sync: true, Mtime: time.Now(),
		Ranges: []datapath.Range{{Off: off, Len: int64(len(buf))}}, Read: read}, nil)
	if err == nil {
		return nil
	}
	where, lerr := c.saveLost(f.name, f.n.fid, ranges, read, off+int64(len(buf)), nil, err)
	if lerr != nil {
		c.log.Error("undelivered writes could not be saved", "path", f.name, "err", lerr)
	}
	return &lostError{path: f.name, cause: err, kept: where}
}

// truncate cuts a bypassed file at the server, after its pending writes.
func (b *bypass) truncate(size int64) error {
	if err := b.flushWrites(true); err != nil {
		return err
	}
	b.mu.Lock()
	b.dropAllLocked()
	b.mu.Unlock()
	sz := uint64(size)
	_, err := b.f.c.SetAttr(b.f.n, Attr{Size: &sz})
	return err
}
