// Package bypass is an open file that bypasses the client's cache (after
// Improving AFS Performance via Selective Caching): reads go from the
// network to the reader through a small window of buffers, never to the
// cache disk, and writes go to the server behind the writer, as one stage
// published at Sync or Close. It knows its file only through Client.
package bypass

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Client is what an Open needs of the cache manager, for its one file.
type Client interface {
	// Status is the file's status, revalidated as the client's rules say.
	Status() (node.Status, error)
	// FetchChunk fetches chunk idx past the cache: its bytes, whole, of
	// data version dv.
	FetchChunk(idx int64) (data []byte, dv uint64, err error)
	// Store makes one store at the server.
	Store(args datapath.StoreArgs) error
	// Session is the client's session with the server now; AwaitSession
	// waits until deadline for one ("" if none came). A stage lives as
	// long as the session it began in.
	Session() string
	AwaitSession(deadline time.Time) string
	// KeepLost keeps writes that could not be delivered where the user
	// finds them (lost/), and returns the error the application gets.
	KeepLost(ranges [][2]int64, read func(p []byte, off int64) error, size int64, trunc *uint64, cause error) error
	// Unpublished hears that o has writes to publish (pending) or has
	// none any more: the client's other reads of the file publish first.
	Unpublished(o *Open, pending bool)
	// Missed counts a read served past the cache.
	Missed()
}

// Config describes the open.
type Config struct {
	Name      string // for errors and the log
	FID       node.FID
	ChunkSize int64
	// Probation: auto chose bypass for a first use; a random read admits
	// the file to the cache instead (ReadAt's admit).
	Probation bool
	// Timeout bounds waiting for a session and retrying a store.
	Timeout time.Duration
	Log     *slog.Logger
}

// Open is an open file's state while it bypasses the cache: chunks go
// from the network to the reader through a small map of buffers, never to
// the cache disk, and writes go to the server behind the writer.
type Open struct {
	cl  Client
	cfg Config

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

// New is an open of the file cl serves that bypasses the cache.
func New(cl Client, cfg Config) *Open {
	return &Open{cl: cl, cfg: cfg, chunks: map[int64]*memChunk{}, probation: cfg.Probation,
		slots: make(chan struct{}, maxStores), flying: map[*[2]int64]bool{}}
}

// get returns chunk idx, starting its fetch if needed.
func (b *Open) get(idx int64) *memChunk {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.getLocked(idx)
}

func (b *Open) getLocked(idx int64) *memChunk {
	if mc := b.chunks[idx]; mc != nil {
		return mc
	}
	mc := &memChunk{done: make(chan struct{})}
	b.chunks[idx] = mc
	go func() {
		data, dv, err := b.cl.FetchChunk(idx)
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
func (b *Open) dropLocked(idx int64) {
	if mc := b.chunks[idx]; mc != nil {
		delete(b.chunks, idx)
		mc.dropped = true
		b.releaseLocked(mc)
	}
}

func (b *Open) dropAllLocked() {
	for idx := range b.chunks {
		b.dropLocked(idx)
	}
}

func (b *Open) releaseLocked(mc *memChunk) {
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

// ReadAt serves a read without the cache. It reports admit when a random
// read ends the probation: the caller then reads through the cache.
//
// Read-ahead may hold chunks of a version that another client's change has
// since replaced (the break arrived while they were buffered): those are
// dropped and the read served again from the new version, so a reader
// never mixes versions nor sees bytes older than a break it has received.
func (b *Open) ReadAt(p []byte, off int64) (n int, admit bool, err error) {
	if err := b.Publish(); err != nil {
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
	return 0, false, fmt.Errorf("read %s: the file changed under every attempt: %w", b.cfg.Name, syscall.EIO)
}

// errVersion: the chunks of a read were of different versions.
var errVersion = errors.New("chunks of different versions")

func (b *Open) readVersion(p []byte, off int64) (n int, admit bool, err error) {
	st, err := b.cl.Status()
	if err != nil {
		return 0, false, err
	}
	size := int64(st.Size)
	if off >= size {
		return 0, false, io.EOF
	}
	end := min(off+int64(len(p)), size)
	cs := b.cfg.ChunkSize
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
	b.cl.Missed()
	if int64(n) < int64(len(p)) {
		return n, false, io.EOF // at the end, or the file shrank under the read
	}
	return n, false, nil
}

// WriteAt adds a write to the write-behind run, storing full runs in the
// background under the open's stage. Buffered reads of this file go away:
// they may be stale now.
func (b *Open) WriteAt(p []byte, off int64) (int, error) {
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
func (b *Open) failedLocked() error {
	if b.lost != nil {
		return b.lost
	}
	if b.failure != nil {
		return fmt.Errorf("write %s: an earlier store failed (%v): %w", b.cfg.Name, b.failure, syscall.EIO)
	}
	return nil
}

// dirtyLocked notes that there is something to publish.
func (b *Open) dirtyLocked() {
	if !b.dirty {
		b.dirty = true
		b.cl.Unpublished(b, true)
	}
}

// send stores the collected run in the background, under the stage; with
// wait it also waits for every store in flight. It reports the first
// failure.
func (b *Open) send(wait bool) error {
	b.pub.Lock()
	defer b.pub.Unlock()
	return b.sendLocked(wait)
}

func (b *Open) sendLocked(wait bool) error {
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
// Called with pub held.
func (b *Open) stageArgs() (datapath.StoreArgs, error) {
	// The caller holds pub, so the stage stays as it is while this waits
	// for a session without mu: readers go on meanwhile.
	b.mu.Lock()
	begun := b.stage != ""
	b.mu.Unlock()
	var sess string
	if !begun {
		if sess = b.cl.AwaitSession(time.Now().Add(b.cfg.Timeout)); sess == "" {
			return datapath.StoreArgs{}, fmt.Errorf("store %s: no session with the server: %w", b.cfg.Name, syscall.EIO)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !begun {
		b.stage, b.session = string(node.NewOp()), sess
	}
	args := datapath.StoreArgs{FID: b.cfg.FID, Mtime: time.Now(), Stage: b.stage}
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
func (b *Open) storeStaged(args datapath.StoreArgs) error {
	if args.Op == "" {
		args.Op = string(node.NewOp())
	}
	give := time.Now().Add(b.cfg.Timeout)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if args.Stage != "" && b.cl.Session() != b.session {
			return b.stageLost()
		}
		err := b.cl.Store(args)
		if err == nil && args.Stage != "" && !args.Publish && b.cl.Session() != b.session {
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

func (b *Open) stageLost() error {
	return fmt.Errorf("store %s: the session its stage began in ended (server restart or reconnection): %w", b.cfg.Name, syscall.EIO)
}

// Publish makes every write since the last publication visible at once,
// durably: the last run goes with the store that publishes the stage. If
// that cannot be done, lose says what became of the writes.
func (b *Open) Publish() error {
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
	args := datapath.StoreArgs{FID: b.cfg.FID, Sync: true, Mtime: time.Now()}
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
func (b *Open) resetLocked() {
	b.stage, b.session = "", ""
	b.wrote, b.end, b.hasCut, b.cut, b.tsize, b.cutSent = false, 0, false, 0, 0, false
	if b.dirty {
		b.dirty = false
		b.cl.Unpublished(b, false)
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
func (b *Open) lose(buf []byte, off int64, cause error) error {
	b.mu.Lock()
	staged, hasCut, cut, size := b.stage != "", b.hasCut, uint64(b.cut), max(b.end, b.tsize)
	b.mu.Unlock()
	var err error
	if staged {
		b.cfg.Log.Error("writes not published: the server no longer has the stage they were sent under; the file keeps its contents from before them",
			"path", b.cfg.Name, "size", size, "err", cause)
		err = fmt.Errorf("%s: writes since the last fsync not published (%v): %w", b.cfg.Name, cause, syscall.EIO)
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
		err = b.cl.KeepLost(ranges, read, size, trunc, cause)
	}
	b.mu.Lock()
	b.resetLocked()
	b.lost, b.failure = err, firstErr(b.failure, cause)
	b.mu.Unlock()
	return err
}

// Truncate cuts a bypassed file: with the stage's first store, so that
// the old contents stay visible until the publication (open with O_TRUNC
// comes here). A truncation after writes publishes them first.
func (b *Open) Truncate(size int64) error {
	b.mu.Lock()
	err, wrote := b.failedLocked(), b.wrote
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if wrote {
		if err := b.Publish(); err != nil {
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

// Status is the file's status as this open sees it: the size includes
// its unpublished writes and truncation.
func (b *Open) Status() (node.Status, error) {
	st, err := b.cl.Status()
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
