package client

import (
	"context"
	"errors"
	"github.com/hoardfs/hoard/client/site"
	"github.com/hoardfs/hoard/client/user"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client/bypass"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/datapath"
	"github.com/hoardfs/hoard/node"
	"golang.org/x/sync/singleflight"
)

// fileData is a file node's cached data and its writers (Node).
type fileData struct {
	entry *cache.Entry
	// fetches shares one fetch of a chunk among its readers; fetching
	// counts the fetches under way (a node fetching is not dropped).
	fetches  singleflight.Group
	fetching atomic.Int32

	// wmu serialises writers with stores of this file, so that a store
	// never marks clean a byte written while it was in flight.
	wmu sync.Mutex
	// modified is when local writes or truncation last changed the file:
	// its mtime and ctime until they are stored (the store carries it).
	modified time.Time
	// unlinked: this client removed the file's last name (or renamed
	// another file over it). replacing counts this client's removes and
	// renames over the file under way (replaceNamed).
	unlinked  bool
	replacing int
	// bypassing counts the opens of the file that bypass the cache: its
	// data is then at the server, where a truncation must go too.
	bypassing int
	// files counts the open Files of a regular file: writes this client
	// made to a file it removed stay readable through them until the last
	// is closed, and are dropped then.
	files int
}

// File is an open hoard file. ReadAt and WriteAt may be called concurrently;
// Read, Write and Seek share the file offset. It acts as the user who
// opened it: its reads, writes, stores and close carry that user's token,
// and the user's rights were checked at the open, as Unix checks a file's
// mode once, at open(2).
type File struct {
	// n is the file; its Client (n.at) is the one of its server.
	n      *Node
	u      user.User
	name   string
	flags  int
	closed atomic.Bool

	mu  sync.Mutex // the offset
	off int64

	// Read-ahead: a reader that continues where it stopped is sequential
	// and gets a growing window of chunks fetched ahead in the background.
	seqNext atomic.Int64
	window  atomic.Int64

	// outside: the kernel writes the cache file directly (FUSE passthrough);
	// stores first rescan it for what changed.
	outside bool

	// bp is set while the file bypasses the cache (see policy.go).
	bp       atomic.Pointer[bypass.Open]
	decision policy.Decision
	// counted: the open was recorded for delegations (deleg.go), and its
	// close must be too.
	counted bool
	// held: the open is counted in n.files.
	held bool
}

// Policy is the caching decision made when the file was opened.
func (f *File) Policy() policy.Decision { return f.decision }

// Bypassed reports whether reads and writes skip the cache now.
func (f *File) Bypassed() bool { return f.bp.Load() != nil }

// WritesOutside says that writes to this file reach the cache file without
// passing through WriteAt; Sync, Flush and Close then find them by checksum.
func (f *File) WritesOutside() { f.outside = true }

// Writable reports whether the file was opened for writing.
func (f *File) Writable() bool { return f.writable() }

func (f *File) readable() bool { return f.flags&(os.O_WRONLY|os.O_RDWR) != os.O_WRONLY }
func (f *File) writable() bool { return f.flags&(os.O_WRONLY|os.O_RDWR) != 0 }

// Name is the path the file was opened by.
func (f *File) Name() string { return f.name }

// FID is the file's identifier.
func (f *File) FID() node.FID { return f.n.fid }

func (f *File) pathErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return site.ErrOf(op, f.name, err)
}

// ReadAt reads len(p) bytes at off. With a valid promise and the data
// cached it is one flag check and one pread of the cache file.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if f.closed.Load() {
		return 0, os.ErrClosed
	}
	if !f.readable() {
		return 0, f.pathErr("read", syscall.EBADF)
	}
	if off < 0 {
		return 0, f.pathErr("read", syscall.EINVAL)
	}
	bp := f.bp.Load()
	// Writes other opens here left unpublished are this client's own:
	// they are published first, so that it reads them.
	f.n.c.publishFor(f.n, bp)
	if bp != nil {
		n, admit, err := bp.ReadAt(p, off)
		if !admit {
			return n, f.pathErr("read", err)
		}
		// A random read ends auto's probation: from now on, cache it.
		f.bp.Store(nil)
	}
	if f.n.valid.Load() {
		n, err := f.n.entry.ReadAt(p, off)
		if err != cache.ErrMiss {
			f.n.c.cache.CountHit(1)
			f.readAhead(off, int64(n))
			return n, f.pathErr("read", err)
		}
	}
	n, err := f.readSlow(p, off)
	f.readAhead(off, int64(n))
	return n, f.pathErr("read", err)
}

// readSlow revalidates, fetches what is missing and reads.
func (f *File) readSlow(p []byte, off int64) (int, error) {
	n, _, err := f.n.read(p, off, f.u)
	return n, err
}

// read revalidates n, fetches what is missing and reads, for u, and
// returns the status of the version the bytes belong to: a read that a
// new version overtook (its chunks replaced the ones read) is read again.
func (n *Node) read(p []byte, off int64, u user.User) (int, node.Status, error) {
	for attempt := 0; ; attempt++ {
		st, err := n.c.fresh(n, u)
		if err != nil {
			return 0, st, err
		}
		k, err := n.readFetching(p, off, u)
		if errors.Is(err, cache.ErrStale) && attempt < 3 {
			continue // the file changed under the fetch: revalidate and retry
		}
		if err == cache.ErrMiss {
			if attempt < 3 {
				continue // evicted between the fetch and the read
			}
			// Evicted every time: the read is larger than what the cache
			// keeps (its own chunks evict each other), or other readers
			// churn it. Served past the cache, as a bypassed read is,
			// but for this client's own bytes, which the cache pins.
			k, err = n.readPast(p, off, st, u)
		}
		if est, ok := n.entry.Status(); ok && est.DataVersion != st.DataVersion && attempt < 3 {
			continue
		}
		return k, st, err
	}
}

// readFetching reads p at off, fetching the chunks that are missing as u.
func (n *Node) readFetching(p []byte, off int64, u user.User) (int, error) {
	missing := n.entry.Missing(off, int64(len(p)))
	if len(missing) == 0 {
		k, err := n.entry.ReadAt(p, off)
		if err != cache.ErrMiss {
			n.c.cache.CountHit(1)
		}
		return k, err
	}
	n.c.cache.CountMiss(1)
	got, err := n.fetch(missing, true, u)
	if err != nil {
		return 0, err
	}
	if len(got) == 0 {
		return n.entry.ReadAt(p, off)
	}
	// Some chunks could not be cached (no evictable space): serve them
	// from memory, the rest from the cache.
	return n.readMixed(p, off, got)
}

// readPast serves a read at status st from chunks fetched into memory as
// u, none cached; chunks whose bytes are this client's (unstored writes,
// zeros past a local truncation) are read from the cache, which pins them.
func (n *Node) readPast(p []byte, off int64, st node.Status, u user.User) (int, error) {
	cs := n.c.cache.ChunkSize()
	size := int64(st.Size)
	if est, ok := n.entry.Status(); ok {
		size = int64(est.Size)
	}
	mem := map[int64][]byte{}
	for idx := off / cs; idx*cs < min(off+int64(len(p)), size); idx++ {
		if n.entry.Local(idx) {
			continue
		}
		data, dv, err := n.fetchChunk(idx, u)
		if err != nil {
			return 0, err
		}
		if dv != st.DataVersion {
			return 0, cache.ErrStale
		}
		mem[idx] = data
	}
	n.c.cache.CountBypassed(int64(len(mem)))
	return n.readMixed(p, off, mem)
}

// readMixed serves a read from chunks held in memory where the cache could
// not take them, and from the cache elsewhere.
func (n *Node) readMixed(p []byte, off int64, mem map[int64][]byte) (int, error) {
	cs := n.c.cache.ChunkSize()
	st, _ := n.entry.Status()
	size := int64(st.Size)
	if off >= size {
		return 0, io.EOF
	}
	want := min(int64(len(p)), size-off)
	done := int64(0)
	for done < want {
		at := off + done
		idx := at / cs
		in := at - idx*cs
		span := min(want-done, cs-in)
		if data, ok := mem[idx]; ok {
			if in >= int64(len(data)) {
				break
			}
			done += int64(copy(p[done:done+span], data[in:]))
			continue
		}
		k, err := n.entry.ReadAt(p[done:done+span], at)
		done += int64(k)
		if err != nil && err != io.EOF {
			return int(done), err
		}
	}
	if done < int64(len(p)) {
		return int(done), io.EOF
	}
	return int(done), nil
}

// readAhead starts background fetches ahead of a sequential reader.
func (f *File) readAhead(off, n int64) {
	if n <= 0 {
		return
	}
	if f.seqNext.Swap(off+n) != off {
		f.window.Store(0)
		return
	}
	cs := f.n.c.cache.ChunkSize()
	w := f.window.Load()
	if w == 0 {
		w = 2
	} else if w < 32 {
		w *= 2
	}
	f.window.Store(w)
	from := (off + n + cs - 1) / cs
	missing := f.n.entry.Missing(from*cs, w*cs)
	if len(missing) > 0 && f.n.valid.Load() {
		go f.n.fetch(missing, false, f.u)
	}
}

// Read reads at the file offset.
func (f *File) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.ReadAt(p, f.off)
	f.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Write writes at the file offset (at the end with O_APPEND).
func (f *File) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.write(p, f.off, f.flags&os.O_APPEND != 0)
	f.off += int64(n)
	return n, err
}

// WriteAt writes p at off. The data stays in the local cache until Sync or
// Close stores it.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if f.flags&os.O_APPEND != 0 {
		return 0, f.pathErr("write", errors.New("WriteAt on a file opened with O_APPEND"))
	}
	return f.write(p, off, false)
}

// write is WriteAt; with appending, off is ignored and the end is used,
// and the file offset ends up after the data.
func (f *File) write(p []byte, off int64, appending bool) (int, error) {
	if f.closed.Load() {
		return 0, os.ErrClosed
	}
	if !f.writable() {
		return 0, f.pathErr("write", syscall.EBADF)
	}
	if bp := f.bp.Load(); bp != nil {
		if appending {
			st, err := f.Stat()
			if err != nil {
				return 0, err
			}
			off = int64(st.Size)
			f.off = off
		}
		k, err := bp.WriteAt(p, off)
		return k, f.pathErr("write", err)
	}
	n := f.n
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if _, err := f.n.c.fresh(n, f.u); err != nil {
		return 0, f.pathErr("write", err)
	}
	if appending {
		off = int64(n.status().Size)
		f.off = off
	}
	if off < 0 {
		return 0, f.pathErr("write", syscall.EINVAL)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := n.sizeAllowed(uint64(off) + uint64(len(p))); err != nil {
		return 0, f.pathErr("write", err)
	}
	var k int
	err := n.withRoom(f.u, func() (err error) {
		if err = n.prepareWrite(off, int64(len(p)), f.u); err == nil {
			n.touch(f.u)
			k, err = n.entry.WriteAt(p, off)
		}
		return err
	})
	if k > 0 {
		f.n.c.dirtied(n)
	}
	return k, f.pathErr("write", err)
}

// withRoom runs change, a local write or truncation of n (wmu held), and
// runs it again when the cache had no room for it: everything left is
// dirty, or the room the change took evicted a chunk it covers in part,
// fetched just before. It first stores this file's writes and the
// flusher's (stored chunks are evictable), as u. Only when nothing could
// be stored is the caller told ENOSPC, never EIO.
func (n *Node) withRoom(u user.User, change func() error) error {
	err := change()
	for attempt := 0; (errors.Is(err, cache.ErrNoSpace) || errors.Is(err, cache.ErrMiss)) && attempt < 3; attempt++ {
		serr := n.c.storeBack(n, false, u)
		if !n.c.flusher.Drain(dirtyNode{n}) && serr != nil {
			return site.Explained(syscall.ENOSPC, serr)
		}
		err = change()
	}
	if errors.Is(err, cache.ErrNoSpace) {
		err = syscall.ENOSPC
	}
	return err
}

// prepareWrite fetches the chunks a write covers only in part, as u, so
// that a cached chunk is always whole: what the write does not cover must
// hold the server's bytes. Chunks wholly past the server's data need
// nothing.
func (n *Node) prepareWrite(off, length int64, u user.User) error {
	cs := n.c.cache.ChunkSize()
	n.mu.Lock()
	remote := int64(n.st.Size)
	n.mu.Unlock()
	if cut, ok := n.entry.Cut(); ok {
		remote = min(remote, cut)
	}
	end := off + length
	var need []int64
	for idx := off / cs; idx*cs < end; idx++ {
		cstart := idx * cs
		cend := min(cstart+cs, remote)
		if cstart >= remote || n.entry.Present(idx) || off <= cstart && end >= cend {
			continue
		}
		need = append(need, idx)
	}
	if len(need) == 0 {
		return nil
	}
	mem, err := n.fetchNow(need, u)
	if err != nil {
		return err
	}
	if len(mem) > 0 {
		return cache.ErrNoSpace
	}
	return nil
}

// fetchNow is fetch for a writer or a truncation, which cannot go on
// without the chunks: a fetch that a new version overtook (ErrStale: it
// joined a read-ahead begun before a store) is made again at the current
// version.
func (n *Node) fetchNow(idxs []int64, u user.User) (map[int64][]byte, error) {
	for attempt := 0; ; attempt++ {
		mem, err := n.fetch(idxs, true, u)
		if !errors.Is(err, cache.ErrStale) || attempt == 3 {
			return mem, err
		}
		if _, err := n.c.fresh(n, u); err != nil {
			return nil, err
		}
	}
}

// Allocate makes sure [off, off+n) exists: past the end it extends the file
// with zeros (posix_fallocate); hoard does not reserve server space ahead.
func (f *File) Allocate(off, n int64) error {
	if off < 0 || n <= 0 {
		return f.pathErr("fallocate", syscall.EINVAL)
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if end := off + n; end > int64(st.Size) {
		return f.Truncate(end)
	}
	return nil
}

// Truncate changes the file's size locally; Sync or Close stores it.
func (f *File) Truncate(size int64) error {
	if f.closed.Load() {
		return os.ErrClosed
	}
	if !f.writable() {
		return f.pathErr("truncate", syscall.EBADF)
	}
	if size < 0 {
		return f.pathErr("truncate", syscall.EINVAL)
	}
	if bp := f.bp.Load(); bp != nil {
		return f.pathErr("truncate", bp.Truncate(size))
	}
	n := f.n
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if _, err := f.n.c.fresh(n, f.u); err != nil {
		return f.pathErr("truncate", err)
	}
	return f.pathErr("truncate", n.truncateLocked(uint64(size), f.u))
}

// truncateLocked truncates n in the cache, for u (wmu held).
func (n *Node) truncateLocked(size uint64, u user.User) error {
	if err := n.sizeAllowed(size); err != nil {
		return err
	}
	n.touch(u)
	err := n.withRoom(u, func() error {
		err := n.entry.Truncate(int64(size))
		if errors.Is(err, cache.ErrMiss) {
			// The chunk the new end falls in keeps its first part: fetch
			// it (ErrNoSpace if the cache could not keep it).
			cs := n.c.cache.ChunkSize()
			var mem map[int64][]byte
			if mem, err = n.fetchNow([]int64{int64(size) / cs}, u); err == nil && len(mem) > 0 {
				err = cache.ErrNoSpace
			} else if err == nil {
				err = n.entry.Truncate(int64(size))
			}
		}
		return err
	})
	if err == nil {
		n.c.dirtied(n)
	}
	return err
}

// sizeAllowed refuses a size past the largest file n's server stores
// (EFBIG, as a local file system refuses it), before it is cached: its
// store would be refused after the call succeeded.
func (n *Node) sizeAllowed(size uint64) error {
	if most := n.at().MaxFile(); most > 0 && size > most {
		return syscall.EFBIG
	}
	return nil
}

// Sync stores the file's local changes and makes them durable on the server.
func (f *File) Sync() error {
	if f.closed.Load() {
		return os.ErrClosed
	}
	if !f.writable() {
		return nil
	}
	if bp := f.bp.Load(); bp != nil {
		return f.pathErr("sync", bp.Publish())
	}
	losses := f.n.lossCount()
	f.n.wmu.Lock()
	defer f.n.wmu.Unlock()
	err := f.rescan()
	if err == nil {
		err = f.n.c.storeBack(f.n, false, f.u)
	}
	if err == nil {
		err = f.n.takeLost()
	}
	if err == nil {
		err = f.n.lostSince(losses)
	}
	return f.pathErr("sync", err)
}

// storeLocked sends the dirty ranges and any truncation to the server as
// one atomic commit, as u. Called with wmu held.
func (n *Node) storeLocked(sync bool, u user.User) error {
	if err := n.c.settleFor(n); err != nil {
		return err
	}
	n.mu.Lock()
	cached := n.entry != nil
	n.mu.Unlock()
	if !cached {
		// A node whose status is still being learned (a recall can reach
		// it then) has no cache entry yet, so nothing to store.
		return nil
	}
	ranges := n.entry.Dirty()
	cut, hasCut := n.entry.Cut()
	if len(ranges) == 0 && !hasCut {
		return nil
	}
	est, _ := n.entry.Status()
	n.mu.Lock()
	mtime, state := n.modified, n.dirtyState
	n.mu.Unlock()
	args := datapath.StoreArgs{
		FID: n.fid, BaseVersion: est.DataVersion, Sync: sync, Mtime: mtime, DelegState: state,
		HasTruncate: hasCut, Truncate: uint64(max(cut, 0)), HasSize: hasCut, Size: est.Size,
		Read: func(p []byte, off int64) error {
			_, err := n.entry.ReadAt(p, off)
			if err == io.EOF {
				err = nil
			}
			return err
		},
	}
	for _, r := range ranges {
		args.Ranges = append(args.Ranges, datapath.Range{Off: r.Off, Len: r.Len})
	}
	stored := func(st node.Status) error {
		if err := n.entry.Cleaned(ranges, st); err != nil {
			return err
		}
		n.c.stored(n)
		if st.DataVersion != est.DataVersion+1 {
			// Another client's store came between: the clean chunks we
			// kept may predate it.
			return n.entry.Invalidate()
		}
		return nil
	}
	home := n.at()
	return n.onServer(true, func(at *site.Site) error {
		if at != home {
			// The volume moved; the old server's delegation went with it.
			args.DelegState = 0
		}
		return n.c.storeData(at, args, u, stored)
	})
}

// storeData runs one store as u, lets stored update local state from the
// new status, then records the status and the promise that came with it.
func (c *Client) storeData(at *site.Site, args datapath.StoreArgs, u user.User, stored func(st node.Status) error) error {
	t := at.Begin()
	defer t.End()
	var st node.Status
	var ttl time.Duration
	c.counters.stores.Add(1)
	defer c.counters.storeTime.Since(time.Now())
	if args.Op == "" {
		// Every attempt names the store alike: one the server made
		// before a lost reply is not made again over later stores.
		args.Op = string(node.NewOp())
	}
	err := at.As(u.Token()).CallData(func(ctx context.Context) (err error) {
		st, ttl, err = at.Conn.Data().Store(ctx, args)
		return err
	})
	if err == nil && stored != nil {
		err = stored(st)
	}
	if err != nil {
		return err
	}
	_, err = c.learn(t, st, ttl, u)
	return err
}

// Close stores local changes durably, as Flush, and closes the file.
// Under a write delegation they stay in the cache, for the flusher.
func (f *File) Close() error {
	if f.closed.Swap(true) {
		return os.ErrClosed
	}
	err := f.flush("close")
	if cerr := f.uncount(); err == nil && cerr != nil {
		err = f.pathErr("close", cerr)
	}
	if f.held {
		f.n.mu.Lock()
		f.n.files--
		last := f.n.files == 0 && f.n.unlinked
		f.n.mu.Unlock()
		if last {
			f.n.c.dropUnread(f.n)
		}
	}
	return err
}

// uncount undoes what openFile counted for f: a bypassing open, an open
// recorded for delegations.
func (f *File) uncount() error {
	if f.decision.Bypass {
		f.n.mu.Lock()
		f.n.bypassing--
		f.n.mu.Unlock()
	}
	if f.counted {
		return f.n.c.closeDeleg(f.n, f.writable(), f.u)
	}
	return nil
}

// Flush stores local changes durably: what close(2) does for each
// descriptor. If they cannot be delivered the error says so (EIO) and the
// data is kept under the cache directory's lost/ folder: it is never
// dropped silently.
func (f *File) Flush() error {
	if f.closed.Load() {
		return os.ErrClosed
	}
	return f.flush("flush")
}

func (f *File) flush(op string) error {
	if !f.writable() {
		return nil
	}
	if bp := f.bp.Load(); bp != nil {
		return f.pathErr(op, bp.Publish())
	}
	n := f.n
	losses := n.lossCount()
	n.wmu.Lock()
	defer n.wmu.Unlock()
	err := f.rescan()
	if err == nil && f.n.c.writeBack(n) && f.u.StorableFor(time.Now(), f.n.c.opts.FlushAge) && f.n.c.roomFor(n, f.u) {
		if n.localChanges() {
			f.n.c.dirtied(n) // writes through passthrough did not say so
		}
		err = n.takeLost()
	} else {
		if err == nil {
			if err = n.storeLocked(true, f.u); n.goneHere(err) {
				err = nil
			}
		}
		if err != nil {
			err = n.c.keepLost(n, f.name, err)
		} else {
			err = n.takeLost()
		}
	}
	if err == nil {
		err = n.lostSince(losses)
	}
	return f.pathErr(op, err)
}

func (f *File) rescan() error {
	if !f.outside {
		return nil
	}
	return f.n.entry.Rescan()
}

// Stat returns the file's status, with the local size while local writes
// are pending.
func (f *File) Stat() (node.Status, error) {
	if f.closed.Load() {
		return node.Status{}, os.ErrClosed
	}
	if bp := f.bp.Load(); bp != nil {
		st, err := bp.Status()
		return st, f.pathErr("stat", err)
	}
	st, err := f.n.c.fresh(f.n, f.u)
	return st, f.pathErr("stat", err)
}

// Seek sets the offset for the next Read or Write.
func (f *File) Seek(offset int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += f.off
	case io.SeekEnd:
		st, err := f.n.c.fresh(f.n, f.u)
		if bp := f.bp.Load(); bp != nil {
			st, err = bp.Status() // with its unpublished writes
		}
		if err != nil {
			return 0, f.pathErr("seek", err)
		}
		offset += int64(st.Size)
	default:
		return 0, f.pathErr("seek", syscall.EINVAL)
	}
	if offset < 0 {
		return 0, f.pathErr("seek", syscall.EINVAL)
	}
	f.off = offset
	return offset, nil
}
