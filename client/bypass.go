package client

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
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

	// The writes since the last publication are one stage at the server
	// (StoreRequest.stage): nobody sees them until Sync, Close or a read
	// publishes them at once, so a crash mid-write leaves the old file,
	// never a torn one. pub orders launching runs against publishing;
	// the fields below are under mu.
	pub     sync.Mutex
	stage   string // the stage's name once a run went out under it
	session string // the session it began in: it lives as long as that
	dirty   bool   // writes or a truncation to publish
	wrote   bool   // writes since the last publication
	end     int64  // where those writes end
	hasCut  bool   // a truncation since the last publication:
	cut     int64  // its lowest point, sent with the stage's first store,
	tsize   int64  // and the size the last one set
	cutSent bool
	lost    error // what the writes that could not be published became
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
	if err := b.publish(); err != nil {
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
// background under the open's stage. Buffered reads of this file go away:
// they may be stale now.
func (b *bypass) writeAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	if err := b.failedLocked(); err != nil {
		b.mu.Unlock()
		return 0, err
	}
	b.dropAllLocked()
	if len(p) > 0 {
		b.dirtyLocked()
		b.wrote = true
		b.end = max(b.end, off+int64(len(p)))
	}
	if len(b.wbuf) > 0 && off == b.woff+int64(len(b.wbuf)) && len(b.wbuf)+len(p) <= writeRun {
		b.wbuf = append(b.wbuf, p...)
		full := len(b.wbuf) == writeRun
		b.mu.Unlock()
		if full {
			b.send(false)
		}
		return len(p), nil
	}
	b.mu.Unlock()
	if err := b.send(false); err != nil {
		return 0, err
	}
	b.mu.Lock()
	b.wbuf, b.woff = append(make([]byte, 0, max(len(p), writeRun)), p...), off
	b.mu.Unlock()
	return len(p), nil
}

// failedLocked is the error writes get once a store failed.
func (b *bypass) failedLocked() error {
	if b.lost != nil {
		return b.lost
	}
	if b.failure != nil {
		return fmt.Errorf("write %s: an earlier store failed (%v): %w", b.f.name, b.failure, syscall.EIO)
	}
	return nil
}

// dirtyLocked notes that there is something to publish.
func (b *bypass) dirtyLocked() {
	if !b.dirty {
		b.dirty = true
		b.f.c.unpublished.add(b.f.n, b)
	}
}

// send stores the collected run in the background, under the stage; with
// wait it also waits for every store in flight. It reports the first
// failure.
func (b *bypass) send(wait bool) error {
	b.pub.Lock()
	defer b.pub.Unlock()
	return b.sendLocked(wait)
}

func (b *bypass) sendLocked(wait bool) error {
	b.mu.Lock()
	buf, off := b.wbuf, b.woff
	b.wbuf = nil
	b.mu.Unlock()
	if len(buf) > 0 {
		args, err := b.stageArgs()
		if err != nil {
			b.mu.Lock()
			b.failure = firstErr(b.failure, err)
			b.wbuf, b.woff = buf, off // kept for lost/ with the rest
			b.mu.Unlock()
			return err
		}
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
		args.Ranges = []datapath.Range{{Off: off, Len: int64(len(buf))}}
		args.Read = func(p []byte, at int64) error {
			copy(p, buf[at-off:])
			return nil
		}
		go func() {
			defer func() { <-b.slots; b.stores.Done() }()
			err := b.storeStaged(args)
			b.mu.Lock()
			delete(b.flying, run)
			b.failure = firstErr(b.failure, err)
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

// firstErr is old if there was one, else err.
func firstErr(old, err error) error {
	if old != nil {
		return old
	}
	return err
}

// stageArgs begins the stage if this is its first run, and describes the
// run's store: kept aside under the stage, the truncation with the first.
func (b *bypass) stageArgs() (datapath.StoreArgs, error) {
	c := b.f.c
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stage == "" {
		sess := c.awaitNewSession("", time.Now().Add(c.opts.RPCTimeout))
		if sess == "" {
			return datapath.StoreArgs{}, fmt.Errorf("store %s: no session with the server: %w", b.f.name, syscall.EIO)
		}
		var id [16]byte
		rand.Read(id[:])
		b.stage, b.session = hex.EncodeToString(id[:]), sess
	}
	args := datapath.StoreArgs{FID: b.f.n.fid, Mtime: time.Now(), Stage: b.stage}
	if b.hasCut && !b.cutSent {
		args.HasTruncate, args.Truncate = true, uint64(b.cut)
		b.cutSent = true
	}
	return args, nil
}

// storeStaged makes one store of the stage (or, without one, a store of
// its own). All of a stage's stores must reach the server in the session
// it began in: one sent in a later session would begin a stage of that
// session without the runs before it.
func (b *bypass) storeStaged(args datapath.StoreArgs) error {
	c := b.f.c
	if args.Op == "" {
		args.Op = newOp()
	}
	give := time.Now().Add(c.opts.RPCTimeout)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if args.Stage != "" && *c.session.Load() != b.session {
			return b.stageLost()
		}
		err := c.storeData(args, nil)
		if err == nil && args.Stage != "" && !args.Publish && *c.session.Load() != b.session {
			return b.stageLost()
		}
		// Too many stages at the server: one of this client's others
		// will be published soon.
		if pb.Errno(err) != syscall.EAGAIN || time.Now().After(give) {
			return err
		}
		time.Sleep(wait)
	}
}

func (b *bypass) stageLost() error {
	return fmt.Errorf("store %s: the session its stage began in ended (server restart or reconnection): %w", b.f.name, syscall.EIO)
}

// publish makes every write since the last publication visible at once,
// durably: the last run goes with the store that publishes the stage. If
// that cannot be done, lose says what became of the writes.
func (b *bypass) publish() error {
	b.pub.Lock()
	defer b.pub.Unlock()
	b.mu.Lock()
	buf, off := b.wbuf, b.woff
	b.wbuf = nil
	b.mu.Unlock()
	b.stores.Wait()
	b.mu.Lock()
	failure, dirty, lost := b.failure, b.dirty, b.lost
	b.mu.Unlock()
	if lost != nil && len(buf) == 0 {
		return lost
	}
	if failure != nil {
		return b.lose(buf, off, failure)
	}
	if !dirty {
		return nil
	}
	args := datapath.StoreArgs{FID: b.f.n.fid, Sync: true, Mtime: time.Now()}
	b.mu.Lock()
	if b.stage != "" {
		args.Stage, args.Publish = b.stage, true
	}
	if b.hasCut {
		if !b.cutSent {
			args.HasTruncate, args.Truncate = true, uint64(b.cut)
		}
		// What the truncation left, and the writes after it: exactly.
		args.HasSize, args.Size = true, uint64(max(b.tsize, b.end))
	}
	b.mu.Unlock()
	if len(buf) > 0 {
		args.Ranges = []datapath.Range{{Off: off, Len: int64(len(buf))}}
		args.Read = func(p []byte, at int64) error {
			copy(p, buf[at-off:])
			return nil
		}
	}
	if err := b.storeStaged(args); err != nil {
		return b.lose(buf, off, err)
	}
	b.mu.Lock()
	b.resetLocked()
	b.mu.Unlock()
	return nil
}

// resetLocked starts afresh after a publication (or a loss).
func (b *bypass) resetLocked() {
	b.stage, b.session = "", ""
	b.wrote, b.end, b.hasCut, b.cut, b.tsize, b.cutSent = false, 0, false, 0, 0, false
	if b.dirty {
		b.dirty = false
		b.f.c.unpublished.remove(b.f.n, b)
	}
}

// lose reports writes that could not be published. Without a stage (they
// were all in the one store that failed) they are kept under lost/, as
// the cached path keeps undeliverable data. A stage lost at the server
// (its session ended: a restart, a reconnection) took the writes sent
// under it: a bypassed file keeps no local copy, which could take as
// much of the client's disk as the file, past any cache size. The
// application learns it from the error (EIO), the log names the file,
// and the server keeps the file as it was.
func (b *bypass) lose(buf []byte, off int64, cause error) error {
	c := b.f.c
	b.mu.Lock()
	staged, hasCut, cut, size := b.stage != "", b.hasCut, uint64(b.cut), max(b.end, b.tsize)
	b.mu.Unlock()
	var err error
	if staged {
		c.log.Error("writes not published: the server no longer has the stage they were sent under; the file keeps its contents from before them",
			"path", b.f.name, "size", size, "err", cause)
		err = fmt.Errorf("%s: writes since the last fsync not published (%v): %w", b.f.name, cause, syscall.EIO)
	} else {
		var trunc *uint64
		if hasCut {
			trunc = &cut
		}
		ranges := [][2]int64{{off, int64(len(buf))}}
		read := func(p []byte, at int64) error {
			copy(p, buf[at-off:])
			return nil
		}
		where, lerr := c.saveLost(b.f.name, b.f.n.fid, ranges, read, size, trunc, cause)
		if lerr != nil {
			c.log.Error("undelivered writes could not be saved", "path", b.f.name, "err", lerr)
		}
		err = &lostError{path: b.f.name, cause: cause, kept: where}
	}
	b.mu.Lock()
	b.resetLocked()
	b.lost, b.failure = err, firstErr(b.failure, cause)
	b.mu.Unlock()
	return err
}

// truncate cuts a bypassed file: with the stage's first store, so that
// the old contents stay visible until the publication (open with O_TRUNC
// comes here). A truncation after writes publishes them first.
func (b *bypass) truncate(size int64) error {
	b.mu.Lock()
	err, wrote := b.failedLocked(), b.wrote
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if wrote {
		if err := b.publish(); err != nil {
			return err
		}
	}
	b.pub.Lock()
	defer b.pub.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropAllLocked()
	if !b.hasCut || size < b.cut {
		b.cut = size
	}
	b.hasCut, b.tsize = true, size
	b.dirtyLocked()
	return nil
}

// status is the file's status as this open sees it: the size includes
// its unpublished writes and truncation.
func (b *bypass) status() (node.Status, error) {
	st, err := b.f.c.fresh(b.f.n)
	if err != nil {
		return st, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.hasCut {
		st.Size = uint64(max(b.tsize, b.end))
	} else if b.wrote {
		st.Size = max(st.Size, uint64(b.end))
	}
	return st, nil
}

// stageIndex holds, by node, the bypassed opens with writes not yet
// published (Client.unpublished): a read of the node elsewhere in this
// client publishes them first, so that the client reads its own writes.
type stageIndex struct {
	mu sync.Mutex
	m  map[*Node]map[*bypass]bool
	n  atomic.Int64
}

func (x *stageIndex) add(n *Node, b *bypass) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m == nil {
		x.m = map[*Node]map[*bypass]bool{}
	}
	if x.m[n] == nil {
		x.m[n] = map[*bypass]bool{}
	}
	x.m[n][b] = true
	x.n.Add(1)
}

func (x *stageIndex) remove(n *Node, b *bypass) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m[n][b] {
		delete(x.m[n], b)
		if len(x.m[n]) == 0 {
			delete(x.m, n)
		}
		x.n.Add(-1)
	}
}

// publishFor publishes the writes other opens of n left unpublished; their
// own Sync or Close reports any failure.
func (c *Client) publishFor(n *Node, self *bypass) {
	x := &c.unpublished
	if x.n.Load() == 0 {
		return
	}
	x.mu.Lock()
	var bs []*bypass
	for b := range x.m[n] {
		if b != self {
			bs = append(bs, b)
		}
	}
	x.mu.Unlock()
	for _, b := range bs {
		b.publish()
	}
}
