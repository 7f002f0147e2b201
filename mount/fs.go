// Package mount is the FUSE adapter: it translates kernel requests into
// calls on the cache manager (package client) and holds no cache logic of
// its own. Callback promises become kernel cache lifetimes: entries,
// attributes and pages are cached for as long as the promise holds, and a
// break invalidates them through an asynchronous queue.
package mount

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/node"
)

// hnode is one kernel inode: a cache manager Node.
type hnode struct {
	fs.Inode
	m *Mount
	n *client.Node
	// gen tells this kernel inode from others of the same file
	// (Mount.kernelGen).
	gen uint64
	// lateTicket, when not 0, distrusts this inode until the invalidation
	// queue sent that ticket (Mount.distrust).
	lateTicket atomic.Uint64

	mu sync.Mutex
	// Open modes, as the kernel requires them not to mix on one inode:
	// passthrough opens, and opens through the page cache.
	ptOpens, cachedOpens int
	ptVersion            uint64 // data version the passthrough file holds
	// ptFile identifies the backing file the kernel holds for this inode
	// (zero: not known yet), to tell whether it is still the cache file.
	ptFile fileID
	// pageVersion is the data version the kernel's page cache may hold.
	pageVersion uint64
	// A file unlinked while open lives on under a hidden name until its
	// last close removes it, as the user who unlinked it.
	sillyDir  *hnode
	sillyName string
	sillyBy   *client.Nodes
	// issued are the names of a directory the kernel was given since its
	// last invalidation; see child.
	issued map[string]struct{}
}

var (
	_ = (fs.NodeLookuper)((*hnode)(nil))
	_ = (fs.NodeFsyncer)((*hnode)(nil))
	_ = (fs.NodeLseeker)((*hnode)(nil))
)

// Lseek answers SEEK_DATA and SEEK_HOLE (the kernel handles the others),
// so that sparse-aware tools (cp, tar, rsync) skip a file's holes instead
// of reading zeros.
func (h *hnode) Lseek(ctx context.Context, f fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	pos, err := h.m.as(ctx).Seek(h.n, int64(off), int(whence))
	if err != nil {
		return 0, errno(err)
	}
	return uint64(pos), 0
}

// Fsync of a directory's descriptor makes the names made and removed in
// it durable at the server, as ext4's does (databases fsync a directory
// after a create or rename and treat a failure as fatal): what a directory
// delegation let this mount make locally is settled first. A file's goes
// to its handle.
func (h *hnode) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if fh, ok := f.(*handle); ok {
		return fh.Fsync(ctx, flags)
	}
	return errno(h.m.as(ctx).SyncDir(h.n))
}

// ino maps a FID to a stable inode number: volume in the top 24 bits,
// vnode below (vnode numbers past 2^40 in one volume would collide).
func ino(f node.FID) uint64 { return f.Volume<<40 | f.Vnode&(1<<40-1) }

func typeBits(t node.Type) uint32 {
	switch t {
	case node.TypeDir, node.TypeMountPoint:
		return syscall.S_IFDIR
	case node.TypeSymlink:
		return syscall.S_IFLNK
	case node.TypeFifo:
		return syscall.S_IFIFO
	case node.TypeSocket:
		return syscall.S_IFSOCK
	case node.TypeCharDev:
		return syscall.S_IFCHR
	case node.TypeBlockDev:
		return syscall.S_IFBLK
	}
	return syscall.S_IFREG
}

func fillAttr(st node.Status, out *fuse.Attr) {
	out.Ino = ino(st.FID)
	out.Size = st.Size
	out.Blocks = st.Blocks // what the data takes, not its size: sparse files
	out.Blksize = 4096
	out.Mode = typeBits(st.Type) | st.Mode&0o7777
	out.Nlink = st.Nlink
	out.Owner = fuse.Owner{Uid: st.UID, Gid: st.GID}
	out.Rdev = uint32(st.Rdev)
	out.SetTimes(&st.Atime, &st.Mtime, &st.Ctime)
}

// errno turns a cache manager error into the errno for the kernel. An
// EIO says nothing to the application of why: the log says it, once per
// error (the mount's log is rate-limited).
func errno(err error) syscall.Errno {
	e := client.Errno(err)
	if e == syscall.EIO {
		slog.Warn("I/O error returned to an application", "err", err)
	}
	return e
}

func (h *hnode) OnAdd(ctx context.Context) {
	h.m.added(h)
	h.m.track(h, false)
}

func (h *hnode) OnForget() { h.m.untrack(h) }

// child wraps a cache manager node, named name in directory h, in a kernel
// inode and fills out. The kernel may keep the name while h's promise
// lasts (a change to h breaks it) and the attributes while n's does. The
// name is noted before h's promise is read: a break of h that comes after
// finds it (invalidate), even before go-fuse lists it among h's children,
// and the kernel applies that invalidation once it holds the name.
func (h *hnode) child(ctx context.Context, name string, n *client.Node, st node.Status, out *fuse.EntryOut) *fs.Inode {
	h.issue(name)
	fillAttr(st, &out.Attr)
	out.SetEntryTimeout(h.m.c.PromiseLeft(h.n))
	out.SetAttrTimeout(h.m.c.PromiseLeft(n))
	gen := h.m.kernelGen(n.FID(), typeBits(st.Type) == syscall.S_IFDIR)
	return h.NewInode(ctx, &hnode{m: h.m, n: n, gen: gen}, stableAttr(st, gen))
}

// stale refuses, with ESTALE, a request on h that may have come through a
// name the kernel should have dropped already (Mount.distrust). The
// kernel then walks the path again asking the mount for every name
// (LOOKUP_REVAL), and finds the file, if it is still there, through
// another inode (Mount.kernelGen).
func (h *hnode) stale() syscall.Errno {
	if h.late() {
		h.m.log.Debug("distrusted: ESTALE", "fid", h.n.FID(), "gen", h.gen)
		return syscall.ESTALE
	}
	return 0
}

// late reports whether h is distrusted.
func (h *hnode) late() bool {
	seq := h.lateTicket.Load()
	if seq == 0 {
		return false
	}
	if h.m.queue.sent() < seq {
		return true
	}
	h.lateTicket.CompareAndSwap(seq, 0) // through since
	return false
}

// distrustUntil distrusts h until the invalidation queue sent ticket seq.
func (h *hnode) distrustUntil(seq uint64) {
	for {
		old := h.lateTicket.Load()
		if old >= seq || h.lateTicket.CompareAndSwap(old, seq) {
			return
		}
	}
}

func (h *hnode) trust() { h.lateTicket.Store(0) }

// staleAny is the first of hs's stale answers.
func staleAny(hs ...*hnode) syscall.Errno {
	for _, h := range hs {
		if e := h.stale(); e != 0 {
			return e
		}
	}
	return 0
}

// issue notes that the kernel was given name in directory h.
func (h *hnode) issue(name string) {
	h.mu.Lock()
	if h.issued == nil {
		h.issued = map[string]struct{}{}
	}
	h.issued[name] = struct{}{}
	h.mu.Unlock()
}

func (h *hnode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	h.m.track(h, true)
	if e := h.stale(); e != 0 {
		return nil, e
	}
	n, st, err := h.m.as(ctx).Lookup(h.n, name)
	if err != nil {
		return nil, errno(err)
	}
	return h.child(ctx, name, n, st, out), 0
}

func (h *hnode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	h.m.track(h, true)
	if f == nil && !h.isOpen() {
		if e := h.stale(); e != 0 {
			return e
		}
	}
	k := h.m.as(ctx)
	if fh := ourHandle(f); fh != nil {
		k = fh.k // fstat: an open file's status is its opener's to see
	}
	st, err := k.Getattr(h.n)
	if e := errno(err); e == syscall.ESTALE || e == syscall.ENOENT {
		if f == nil && !h.isOpen() {
			return e
		}
		// Open here, removed by another client: what the open still
		// sees, unlinked. An error would also make the kernel, which
		// checks permissions this way while it opens a file it just
		// created, take ESTALE as a reason to open the name again.
		st = h.n.Status()
		st.Nlink = 0
		fillAttr(st, &out.Attr)
		out.SetTimeout(0)
		return 0
	} else if e != 0 {
		return e
	}
	fillAttr(st, &out.Attr)
	h.mu.Lock()
	if h.sillyDir != nil {
		out.Nlink-- // the hidden name is ours, not the application's
	}
	h.mu.Unlock()
	out.SetTimeout(h.m.c.PromiseLeft(h.n))
	return 0
}

func (h *hnode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if f == nil {
		if e := h.stale(); e != 0 {
			return e
		}
	}
	var a client.Attr
	if m, ok := in.GetMode(); ok {
		m &= 0o7777
		a.Mode = &m
	}
	if u, ok := in.GetUID(); ok {
		a.UID = &u
	}
	if g, ok := in.GetGID(); ok {
		a.GID = &g
	}
	if t, ok := in.GetATime(); ok {
		a.Atime = &t
	}
	if t, ok := in.GetMTime(); ok {
		a.Mtime = &t
	}
	if size, ok := in.GetSize(); ok {
		// ftruncate on an open file stays local until the file is stored,
		// as its writes do; truncate by name goes to the server now, in
		// place if the cache file is being read directly.
		fh := ourHandle(f)
		h.mu.Lock()
		direct := h.ptOpens > 0
		h.mu.Unlock()
		switch {
		case fh != nil && fh.f.Writable() && fh.mode != modePassthrough:
			if err := fh.f.Truncate(int64(size)); err != nil {
				return errno(err)
			}
		case direct:
			if _, err := h.m.as(ctx).TruncateStored(h.n, size); err != nil {
				return errno(err)
			}
		default:
			if here, err := h.m.as(ctx).TruncateHere(h.n, size); err != nil {
				return errno(err)
			} else if !here {
				a.Size = &size
			}
		}
	}
	st, err := h.m.as(ctx).SetAttr(h.n, a)
	if err != nil {
		return errno(err)
	}
	fillAttr(st, &out.Attr)
	out.SetTimeout(h.m.c.PromiseLeft(h.n))
	return 0
}

// OpendirHandle lets the kernel keep the directory's listing
// (FOPEN_CACHE_DIR) and read it again with no request, while the
// directory's promise holds and its data version is the one the kernel
// was last shown: a break invalidates the kernel's copy (invalidate), and
// the kernel drops it itself when it changes the directory. go-fuse sets
// the two flags together, so the first open of a version keeps nothing
// and the second fills the kernel's copy.
func (h *hnode) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	st := h.n.Status()
	h.mu.Lock()
	keep := h.n.Valid() && h.pageVersion == st.DataVersion
	h.pageVersion = st.DataVersion
	h.mu.Unlock()
	var fuseFlags uint32
	if keep {
		fuseFlags = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	}
	return &dirHandle{h: h}, fuseFlags, 0
}

// dirHandle is an open directory; its listing is taken at the first read.
type dirHandle struct {
	h  *hnode
	ds fs.DirStream
}

func (d *dirHandle) stream(ctx context.Context) (fs.DirStream, syscall.Errno) {
	if d.ds == nil {
		ds, e := d.h.Readdir(ctx)
		if e != 0 {
			return nil, e
		}
		d.ds = ds
	}
	return d.ds, 0
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	ds, e := d.stream(ctx)
	if e != 0 || !ds.HasNext() {
		return nil, e
	}
	ent, e := ds.Next()
	return &ent, e
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	ds, e := d.stream(ctx)
	if e != 0 {
		return e
	}
	if sd, ok := ds.(fs.FileSeekdirer); ok {
		return sd.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	if d.ds != nil {
		d.ds.Close()
	}
}

func (h *hnode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	ents, err := h.m.as(ctx).ReadDir(h.n)
	if err != nil {
		return nil, errno(err)
	}
	list := make([]fuse.DirEntry, len(ents))
	for i, e := range ents {
		list[i] = fuse.DirEntry{Name: e.Name, Ino: ino(e.FID), Mode: typeBits(e.Type)}
	}
	return fs.NewListDirStream(list), 0
}

// caller is the process a request comes from: new files are its.
func caller(ctx context.Context) client.Creator {
	if c, ok := fuse.FromContext(ctx); ok {
		return client.Creator{UID: c.Uid, GID: c.Gid}
	}
	return client.Creator{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
}

func (h *hnode) make(ctx context.Context, name string, t node.Type, mode uint32, target string, rdev uint64, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := h.stale(); e != 0 {
		return nil, e
	}
	n, err := h.m.as(ctx).Create(client.Make{Dir: h.n, Name: name, Type: t, Mode: mode & 0o7777, Who: caller(ctx), Target: target, Rdev: rdev, Excl: true})
	if err != nil {
		return nil, errno(err)
	}
	return h.made(ctx, name, n, out)
}

// made answers a request that made name for n.
func (h *hnode) made(ctx context.Context, name string, n *client.Node, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	st, err := h.m.as(ctx).Getattr(n)
	if err != nil {
		return nil, errno(err)
	}
	return h.child(ctx, name, n, st, out), 0
}

func (h *hnode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return h.make(ctx, name, node.TypeDir, mode, "", 0, out)
}

func (h *hnode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return h.make(ctx, name, node.TypeSymlink, 0o777, target, 0, out)
}

// Mknod makes regular files and special files: fifos, sockets and device
// nodes are stored as typed, empty vnodes, and the kernel that opens them
// gives them their meaning (the mount is nodev, so devices do not open).
func (h *hnode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var t node.Type
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG, 0:
		t = node.TypeFile
	case syscall.S_IFIFO:
		t = node.TypeFifo
	case syscall.S_IFSOCK:
		t = node.TypeSocket
	case syscall.S_IFCHR:
		t = node.TypeCharDev
	case syscall.S_IFBLK:
		t = node.TypeBlockDev
	default:
		return nil, syscall.EINVAL
	}
	return h.make(ctx, name, t, mode, "", uint64(dev), out)
}

func (h *hnode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if e := h.stale(); e != 0 {
		return nil, e
	}
	st, err := h.m.as(ctx).Getattr(h.n)
	if err != nil {
		return nil, errno(err)
	}
	if st.Type != node.TypeSymlink {
		return nil, syscall.EINVAL
	}
	return []byte(st.Target), 0
}

func (h *hnode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*hnode)
	if !ok {
		return nil, syscall.EXDEV
	}
	if e := staleAny(h, t); e != 0 {
		return nil, e
	}
	n, err := h.m.as(ctx).Link(h.n, name, t.n)
	if err != nil {
		return nil, errno(err)
	}
	return h.made(ctx, name, n, out)
}

// Unlink removes name. A file this mount still has open is renamed to a
// hidden name instead and removed at its last close, as NFS clients do
// ("silly rename"): POSIX lets an unlinked open file be read and written
// until it is closed, and the server would otherwise forget its data.
// An unlink of that hidden name (rm -rf of the directory) removes it at
// once, as an NFS client removes its .nfs files: the directory can then be
// removed, and the open file answers ESTALE, as NFS's does.
func (h *hnode) Unlink(ctx context.Context, name string) syscall.Errno {
	if e := h.stale(); e != 0 {
		return e
	}
	if c := h.GetChild(name); c != nil {
		if ch, ok := c.Operations().(*hnode); ok && ch.isOpen() {
			if ch.hiddenAs(h, name) {
				if err := h.m.as(ctx).Remove(h.n, name, false); err != nil {
					return errno(err)
				}
				ch.unhide(h, name)
				return 0
			}
			// No kernel notification here: this handler runs under the
			// directory's lock, and the kernel drops the name itself.
			return h.hide(h.m.as(ctx), name, ch)
		}
	}
	return errno(h.m.as(ctx).Remove(h.n, name, false))
}

// hide renames name, the open file ch, to a hidden name in h, for the
// user of k, which removes it at its last close (silly rename).
func (h *hnode) hide(k *client.Nodes, name string, ch *hnode) syscall.Errno {
	silly := sillyName(ch)
	if _, err := k.Rename(h.n, name, h.n, silly); err != nil {
		return errno(err)
	}
	ch.hiddenIn(h, silly, k)
	return 0
}

// sillyName is a new hidden name for the open file h.
func sillyName(h *hnode) string {
	return fmt.Sprintf(".hoard-unlinked-%x-%x", ino(h.n.FID()), time.Now().UnixNano())
}

// hiddenIn records that h is now named silly in dir, removed by k at its
// last close.
func (h *hnode) hiddenIn(dir *hnode, silly string, k *client.Nodes) {
	h.mu.Lock()
	h.sillyDir, h.sillyName, h.sillyBy = dir, silly, k
	h.mu.Unlock()
}

func (h *hnode) isOpen() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ptOpens+h.cachedOpens > 0
}

func (h *hnode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if e := h.stale(); e != 0 {
		return e
	}
	return errno(h.m.as(ctx).Remove(h.n, name, true))
}

func (h *hnode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*hnode)
	if !ok {
		return syscall.EXDEV
	}
	if e := staleAny(h, np); e != 0 {
		return e
	}
	switch flags {
	case 0:
	case unix.RENAME_NOREPLACE:
		if _, _, err := h.m.as(ctx).Lookup(np.n, newName); err == nil {
			return syscall.EEXIST
		} else if errno(err) != syscall.ENOENT {
			return errno(err)
		}
	default:
		return syscall.EINVAL // RENAME_EXCHANGE and friends are not supported
	}
	// A file this mount has open, which the rename would replace, is
	// hidden, as Unlink hides it: its opens go on reading and writing it
	// until the last is closed. NFS clients hide it with a rename of its
	// own first, and lose it if the rename then fails; here the server
	// hides it in the rename's own change.
	var hidden *hnode
	silly := ""
	if c := np.GetChild(newName); c != nil && flags == 0 && c != h.GetChild(name) {
		if ch, ok := c.Operations().(*hnode); ok && ch.isOpen() && !ch.hiddenAs(np, newName) {
			hidden, silly = ch, sillyName(ch)
		}
	}
	k := h.m.as(ctx)
	moved, kept, err := k.RenameKeeping(h.n, name, np.n, newName, silly)
	if err != nil {
		return errno(err)
	}
	switch {
	case hidden != nil && kept == hidden.n.FID():
		hidden.hiddenIn(np, silly, k)
	case !kept.IsZero():
		// Another client had put another file under newName: nothing
		// here has it open, and the rename replaced it.
		if err := k.Remove(np.n, silly, false); err != nil {
			h.m.log.Warn("removing a file a rename replaced", "name", silly, "err", err)
		}
	}
	// Once this returns, the kernel moves the old name's entry, with its
	// timeout, to newName. A break of either directory during the rename
	// may have been applied before newName was there: invalidate again,
	// queued, which is meant to wait for the kernel's lock and so come after
	// the move.
	np.issue(newName)
	var kernel *hnode // the inode the kernel files under newName
	if c := h.GetChild(name); c != nil {
		kernel, _ = c.Operations().(*hnode)
	}
	late := kernel != nil && kernel.n.FID() != moved
	if late {
		// The kernel's entry was stale (another client had put
		// another file under name): it files the wrong file under
		// newName.
		h.m.queue.add([]node.FID{np.n.FID()})
	}
	for _, d := range []*hnode{h, np} {
		if h.m.c.PromiseLeft(d.n) == 0 {
			h.m.queue.add([]node.FID{d.n.FID()})
			late = true
		}
	}
	if late {
		// The inode the kernel files under newName is distrusted until
		// the kernel looks newName up again, which finds the file through
		// another inode (kernelGen): another client may have moved it on
		// meanwhile, and neither the break's invalidation, sent before
		// the kernel filed it there, nor the one just queued is seen to
		// drop newName every time (TestFuseRenamedOnDuringRename).
		if kernel == nil {
			kernel = h.m.current(moved)
		}
		if kernel != nil {
			kernel.distrustUntil(untilLookup)
		}
	}
	return 0
}

func (h *hnode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	st, err := h.m.as(ctx).StatFS(h.n)
	if err != nil {
		return errno(err)
	}
	out.Bsize = uint32(st.BlockSize)
	out.Frsize = uint32(st.BlockSize)
	out.Blocks, out.Bfree, out.Bavail = st.Blocks, st.BlocksFree, st.BlocksFree
	out.Files, out.Ffree = st.Files, st.FilesFree
	out.NameLen = node.MaxName
	return 0
}

// Create makes and opens a file. It never fails once the file is made:
// the kernel would take an error such as ESTALE (another client removed
// the new file at once) as a reason to create it again.
func (h *hnode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if e := h.stale(); e != 0 {
		return nil, nil, 0, e
	}
	full := "/" + path.Join(h.Path(h.Root()), name)
	// The kernel hands us offsets for O_APPEND itself.
	k := h.m.as(ctx)
	n, f, err := k.CreateOpen(client.Make{Dir: h.n, Name: name, Mode: mode & 0o7777, Who: caller(ctx), Excl: flags&syscall.O_EXCL != 0}, full, int(flags)&^os.O_APPEND)
	if err != nil {
		h.m.log.Debug("create failed", "path", full, "err", err)
		return nil, nil, 0, errno(err)
	}
	inode := h.child(ctx, name, n, n.Status(), out)
	fh, fuseFlags, e := inode.Operations().(*hnode).handleFor(k, f)
	return inode, fh, fuseFlags, e
}

func (h *hnode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	h.m.track(h, true)
	if e := h.stale(); e != 0 {
		return nil, 0, e
	}
	base, pn := h.parentNode()
	k := h.m.as(ctx)
	f, err := k.Open(h.n, pn, base, "/"+h.Path(h.Root()), int(flags)&^os.O_APPEND)
	if err != nil {
		h.m.log.Debug("open failed", "fid", h.n.FID(), "err", err)
		return nil, 0, errno(err)
	}
	return h.handleFor(k, f)
}

// handleFor picks how the kernel reads the open file f: straight from the cache file
// (passthrough) when it is wholly cached under a valid promise, through the
// page cache otherwise. The kernel requires every open of an inode that has
// a passthrough open to be passthrough too, writers included: their writes
// land in the cache file, and the cache manager finds them by checksum.
// It also keeps one backing file per inode: an open while that file holds
// an older version than the current one is marked passthrough but served
// by the daemon (FOPEN_DIRECT_IO, which the kernel puts before
// passthrough), so it sees the current version and never fails. k is the
// view of the user who opened it.
func (h *hnode) handleFor(k *client.Nodes, f *client.File) (fs.FileHandle, uint32, syscall.Errno) {
	st := h.n.Status()
	writable := f.Writable()
	h.mu.Lock()
	defer h.mu.Unlock()
	fh := &handle{h: h, f: f, k: k}
	if f.Bypassed() && h.ptOpens == 0 {
		// Bypass: no page cache either; data goes from the network to
		// the read reply.
		fh.mode = modeDirect
		return fh, fuse.FOPEN_DIRECT_IO | noFlush(writable), 0
	}
	pt := h.m.passthrough && (h.ptOpens > 0 || !writable && h.cachedOpens == 0 && st.Size >= passthroughMin && h.n.Complete())
	if pt {
		if h.ptOpens > 0 && (f.Bypassed() || !h.backingCurrent(st)) {
			h.n.Pin()
			h.ptOpens++
			fh.mode = modeServed
			return &ptHandle{handle: fh}, fuse.FOPEN_DIRECT_IO | noFlush(writable), 0
		}
		if writable {
			f.WritesOutside()
		}
		if h.ptOpens == 0 {
			h.ptVersion = st.DataVersion
		}
		h.n.Pin()
		h.ptOpens++
		h.m.countPassthrough()
		fh.mode = modePassthrough
		return &ptHandle{handle: fh}, noFlush(writable), 0
	}
	h.cachedOpens++
	fh.mode = modeCached
	fuseFlags := noFlush(writable)
	if h.n.Valid() && h.pageVersion == st.DataVersion {
		fuseFlags |= fuse.FOPEN_KEEP_CACHE // nothing changed since the kernel cached it
	}
	h.pageVersion = st.DataVersion
	return fh, fuseFlags, 0
}

// backingCurrent reports whether the backing file of the open passthrough
// files holds version st (h.mu held). Versions this mount stored through
// it (a passthrough writer's, a truncation by name) land in the same
// cache file; another client's go to a new one, and the backing file
// keeps the old bytes for the opens that have it.
func (h *hnode) backingCurrent(st node.Status) bool {
	if h.ptVersion == st.DataVersion {
		return true
	}
	if h.ptFile == (fileID{}) || !h.n.Complete() {
		return false
	}
	if id, ok := statID(h.n.CachePath()); !ok || id != h.ptFile {
		return false
	}
	h.ptVersion = st.DataVersion
	return true
}

// fileID tells files apart: device and inode number.
type fileID struct{ dev, ino uint64 }

func statID(path string) (fileID, bool) {
	var st unix.Stat_t
	if path == "" || unix.Stat(path, &st) != nil {
		return fileID{}, false
	}
	return fileID{uint64(st.Dev), st.Ino}, true
}

// noFlush spares a reader's close its FLUSH round trip: there is nothing to
// store.
func noFlush(writable bool) uint32 {
	if writable {
		return 0
	}
	return fuse.FOPEN_NOFLUSH
}

// passthroughMin is the smallest file worth a passthrough open: below it the
// two extra ioctls per open (register and release the backing file) cost
// more than the page cache, which serves a small file as well.
const passthroughMin = 256 << 10

// parentNode is the name and directory the kernel knows this inode by
// (for the caching policy, which a directory's override sets).
func (h *hnode) parentNode() (string, *client.Node) {
	name, p := h.Parent()
	if p == nil {
		return name, nil
	}
	if ph, ok := p.Operations().(*hnode); ok {
		return name, ph.n
	}
	return name, nil
}

// ourHandle unwraps a handle the kernel passes back.
func ourHandle(f fs.FileHandle) *handle {
	switch fh := f.(type) {
	case *handle:
		return fh
	case *ptHandle:
		return fh.handle
	}
	return nil
}

// hiddenAs reports whether name in dir is the hidden name this open file
// was renamed to when it was unlinked.
func (h *hnode) hiddenAs(dir *hnode, name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sillyDir == dir && h.sillyName == name
}

// unhide forgets the hidden name, removed before the last close.
func (h *hnode) unhide(dir *hnode, name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sillyDir == dir && h.sillyName == name {
		h.sillyDir, h.sillyName, h.sillyBy = nil, "", nil
	}
}

// released ends an open of the given mode.
func (h *hnode) released(mode openMode) {
	h.mu.Lock()
	switch mode {
	case modePassthrough, modeServed:
		if h.ptOpens--; h.ptOpens == 0 {
			h.ptFile = fileID{} // the kernel drops the backing file
		}
		h.n.Unpin()
	case modeCached:
		h.cachedOpens--
	}
	var dir *hnode
	var silly string
	var by *client.Nodes
	if h.ptOpens+h.cachedOpens == 0 && h.sillyDir != nil {
		dir, silly, by = h.sillyDir, h.sillyName, h.sillyBy
		h.sillyDir, h.sillyName, h.sillyBy = nil, "", nil
	}
	h.mu.Unlock()
	if dir != nil {
		if err := by.Remove(dir.n, silly, false); err != nil {
			h.m.log.Warn("removing an unlinked file at its last close", "name", silly, "err", err)
		}
		// The kernel did not make this change and may keep the listing
		// and the name: drop them, from the invalidation queue (a
		// handler must not notify).
		h.m.queue.add([]node.FID{dir.n.FID()})
	}
}

// invalidate drops what the kernel caches for this inode: attributes and
// pages, and for a directory every name it holds or was given in it.
func (h *hnode) invalidate() {
	h.mu.Lock()
	h.pageVersion = 0
	issued := h.issued
	h.issued = nil
	h.mu.Unlock()
	untilKnown(1, func(int) syscall.Errno { return h.NotifyContent(0, 0) })
	if h.IsDir() {
		// A name given since the last invalidation may not be filed yet,
		// even one go-fuse already knows (it adds a child before the
		// reply goes out); the others the kernel has had for longer.
		for name := range h.Children() {
			if _, ok := issued[name]; !ok {
				h.NotifyEntry(name)
			}
		}
		names := make([]string, 0, len(issued))
		for name := range issued {
			names = append(names, name)
		}
		untilKnown(len(names), func(i int) syscall.Errno { return h.NotifyEntry(names[i]) })
	}
}

// untilKnown sends notifications 0..n-1 and repeats, together, for a
// while, those the kernel refused because it does not know the inode or
// name yet: the reply that hands it out may still be on its way (the
// kernel takes a lookup's reply in when the process that asked runs
// again). Dropped, a notification would leave the kernel trusting, for
// the promise's lifetime, what the break voided. Together, a directory
// whose names the kernel has forgotten costs the queue 50 ms, not 50 ms
// a name.
func untilKnown(n int, notify func(i int) syscall.Errno) {
	todo := make([]int, n)
	for i := range todo {
		todo[i] = i
	}
	for range 10 {
		again := todo[:0]
		for _, i := range todo {
			if notify(i) == syscall.ENOENT {
				again = append(again, i)
			}
		}
		if todo = again; len(todo) == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// PolicyXattr is the extended attribute through which `hoard cache policy`
// reads and sets a file's caching policy on a mount (as OpenAFS's fs
// command does through pioctl): reading gives "cache (why)" or
// "bypass (why)"; writing "cache", "bypass" or "auto", with ",recursive"
// for a directory's tree, sets the override.
const PolicyXattr = "user.hoard.policy"

// Extended attributes of the user namespace are stored at the server
// with the file (node.CheckXattrName has the bounds); user.hoard.* are
// the cache commands' (PolicyXattr, ctl.go). Other namespaces are not
// stored: setting one says so (ENOTSUP, which cp -a and rsync -X take as
// "not supported here"), reading one finds none, without a round trip
// (the kernel asks for security.capability at every write).
func (h *hnode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	var v []byte
	if b, ok, en := h.getCtl(ctx, attr); ok {
		if en != 0 {
			return 0, en
		}
		v = b
	} else if attr == PolicyXattr {
		base, parent := h.parentNode()
		d, err := h.m.as(ctx).Policy(h.n, parent, base)
		if err != nil {
			return 0, errno(err)
		}
		v = []byte(d.String())
	} else if stored(attr) {
		b, err := h.m.as(ctx).GetXattr(h.n, attr)
		if err != nil {
			return 0, errno(err)
		}
		v = b
	} else {
		return 0, syscall.ENODATA
	}
	return xattrOut(dest, v)
}

// stored reports whether attr is one the server keeps.
func stored(attr string) bool {
	return strings.HasPrefix(attr, node.XattrPrefix) && !strings.HasPrefix(attr, node.ReservedXattrPrefix)
}

// xattrOut answers getxattr and listxattr: the size for an empty buffer,
// ERANGE for a short one.
func xattrOut(dest, v []byte) (uint32, syscall.Errno) {
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (h *hnode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if ok, en := h.setCtl(ctx, attr); ok {
		return en
	}
	if stored(attr) {
		_, err := h.m.as(ctx).SetXattr(h.n, attr, data, flags)
		return errno(err)
	}
	if attr != PolicyXattr {
		return syscall.ENOTSUP
	}
	mode, opt, _ := strings.Cut(string(data), ",")
	if opt != "" && opt != "recursive" {
		return syscall.EINVAL
	}
	switch mode {
	case policy.Cache, policy.Bypass, policy.Auto:
	default:
		return syscall.EINVAL
	}
	return errno(h.m.as(ctx).SetPolicy(h.n, mode, opt == "recursive"))
}

func (h *hnode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if !stored(attr) {
		return syscall.ENOTSUP
	}
	_, err := h.m.as(ctx).RemoveXattr(h.n, attr)
	return errno(err)
}

func (h *hnode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	names, err := h.m.as(ctx).ListXattr(h.n)
	if err != nil {
		return 0, errno(err)
	}
	var v []byte
	for _, n := range names {
		v = append(append(v, n...), 0)
	}
	return xattrOut(dest, v)
}
