package client

import (
	"context"
	"errors"
	"github.com/hoardfs/hoard/client/site"
	"github.com/hoardfs/hoard/client/user"
	"golang.org/x/sys/unix"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/policy"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Nodes is the node-level API: what a kernel file system adapter (the
// mount) needs, where the kernel resolves names one directory at a time.
// Mount points are crossed here, so the adapter sees them as the
// directories they lead to.
//
// A Nodes acts for one user (As): every request it makes carries that
// user's token, and what the cache holds is served only as that user's
// rights allow. A view bound to its user, rather than a User argument to
// every method, because a kernel adapter learns the user once per kernel
// request and then makes several calls for it: the view cannot mix users
// up between them, makes no copy of the cache's state (it is two words),
// and leaves the methods as they were for callers that have one user.
type Nodes struct {
	c *Client
	u user.User
}

// Nodes is c's node-level API, acting as c's own user (Options.Token).
func (c *Client) Nodes() *Nodes { return &Nodes{c, c.self} }

// As is k's API acting for u instead. Open files remember the user that
// opened them (File).
func (k *Nodes) As(u user.User) *Nodes { return &Nodes{k.c, u} }

// User is the user k acts for.
func (k *Nodes) User() user.User { return k.u }

// Root is the root directory of the root volume, resolved at Dial or,
// with LazyRoot, at the first call.
func (k *Nodes) Root() (*Node, error) { return k.c.rootDir() }

// Getattr returns n's status, from the cache while a promise is held.
func (k *Nodes) Getattr(n *Node) (node.Status, error) {
	st, err := n.c.fresh(n, k.u)
	if err == nil && st.Type == node.TypeMountPoint {
		var root *Node
		if root, err = n.c.volumeRoot(st.Target, k.u); err == nil {
			st, err = root.c.fresh(root, k.u)
		}
	}
	return st, err
}

// Lookup finds name in dir, crossing a mount point to the root of its volume.
func (k *Nodes) Lookup(dir *Node, name string) (*Node, node.Status, error) {
	n, err := dir.c.lookup(dir, name, k.u)
	if err != nil {
		return nil, node.Status{}, err
	}
	st := n.status()
	if st.Type == node.TypeMountPoint {
		if n, err = dir.c.volumeRoot(st.Target, k.u); err != nil {
			return nil, node.Status{}, err
		}
		st = n.status()
	}
	return n, st, nil
}

// ReadDir lists dir, with the status of every entry learnt (a kernel
// asks for them all: READDIRPLUS); mount points are listed as directories.
func (k *Nodes) ReadDir(dir *Node) ([]DirEntry, error) {
	ents, _, err := dir.c.readDir(dir, k.u)
	if err != nil {
		return nil, err
	}
	if err := dir.c.statusAll(dir.at(), ents, k.u); err != nil {
		return nil, err
	}
	out := make([]DirEntry, len(ents))
	copy(out, ents)
	for i := range out {
		if out[i].Type == node.TypeMountPoint {
			out[i].Type = node.TypeDir
		}
	}
	return out, nil
}

// List lists dir as it is: mount points as such, and without the status
// of every entry that ReadDir learns.
func (k *Nodes) List(dir *Node) ([]DirEntry, error) {
	ents, _, err := dir.c.readDir(dir, k.u)
	return ents, err
}

// Open opens an already resolved file, named base in directory parent
// (nil if unknown: for its caching policy); name is kept for reports.
func (k *Nodes) Open(n *Node, parent *Node, base, name string, flag int) (*File, error) {
	return n.c.openFile(n, parent, base, name, flag, resolved, k.u)
}

// CreateOpen is Create of a regular file followed by Open, except that
// the file is opened as the create answered (openFile): the open does not
// fail if another client removed the file in between. path is kept for
// reports.
func (k *Nodes) CreateOpen(m Make, path string, flag int) (*Node, *File, error) {
	m.Type = node.TypeFile
	c := m.Dir.c
	n, created, err := c.create(m, k.u)
	if err != nil {
		return nil, nil, err
	}
	f, err := c.openFile(n, m.Dir, m.Name, path, flag, createdHow(created), k.u)
	return n, f, err
}

// Create makes m: a file, directory, symlink, mount point or special
// file. With m.Excl unset an existing regular file is returned instead.
func (k *Nodes) Create(m Make) (*Node, error) {
	n, _, err := m.Dir.c.create(m, k.u)
	return n, err
}

// Link makes name in dir a hard link to target.
func (k *Nodes) Link(dir *Node, name string, target *Node) (*Node, error) {
	n, _, err := dir.c.linkAt(dir, name, target, "", k.u)
	return n, err
}

// linkAt is Link as u returning the server's reply; op names the request.
func (c *Client) linkAt(dir *Node, name string, target *Node, op string, u user.User) (*Node, *pb.LinkReply, error) {
	var n *Node
	var reply *pb.LinkReply
	err := dir.onServer(false, func(at *site.Site) (err error) {
		n, reply, err = c.linkAtHere(at, dir, name, target, op, u)
		return err
	})
	return n, reply, err
}

// linkAtHere is linkAt at site at, which holds dir.
func (c *Client) linkAtHere(at *site.Site, dir *Node, name string, target *Node, op string, u user.User) (*Node, *pb.LinkReply, error) {
	if target.at() != at {
		return nil, nil, syscall.EXDEV // another server's volume
	}
	if err := node.CheckName(name); err != nil {
		return nil, nil, err
	}
	if err := c.settleFor(target); err != nil {
		return nil, nil, err
	}
	release, herr := c.hold(dir)
	if herr != nil {
		return nil, nil, herr
	}
	defer release()
	t := at.Begin()
	defer t.End()
	var reply *pb.LinkReply
	err := at.As(u.Token()).CallOnce(op, func(ctx context.Context) (err error) {
		reply, err = at.RPC.Link(ctx, &pb.LinkRequest{Dir: pb.FromFID(dir.fid), Name: name, Target: pb.FromFID(target.fid)})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	child, err := c.learnPB(t, reply.Status, u)
	if err != nil {
		return nil, nil, err
	}
	return child, reply, c.changedDir(t, dir, reply.Dir, u, func(d *Node) { d.addDentLocked(name, child.fid, reply.Status.Type.ToType()) })
}

// Remove removes name from dir: with dirOnly an empty directory (rmdir),
// otherwise anything else (unlink).
func (k *Nodes) Remove(dir *Node, name string, dirOnly bool) error {
	if !dirOnly && dir.c.removeHere(dir, name, k.u) {
		return nil
	}
	_, err := dir.c.removeAt(dir, name, dirOnly, "", k.u)
	return err
}

// removeAt is Remove as u returning the server's reply; op names the
// request.
func (c *Client) removeAt(dir *Node, name string, dirOnly bool, op string, u user.User) (*pb.RemoveReply, error) {
	var reply *pb.RemoveReply
	err := dir.onServer(false, func(at *site.Site) (err error) {
		reply, err = c.removeAtHere(at, dir, name, dirOnly, op, u)
		return err
	})
	return reply, err
}

// removeAtHere is removeAt at site at, which holds dir.
func (c *Client) removeAtHere(at *site.Site, dir *Node, name string, dirOnly bool, op string, u user.User) (*pb.RemoveReply, error) {
	if err := node.CheckName(name); err != nil {
		return nil, err
	}
	if err := c.settleNamed(dir, name); err != nil {
		return nil, err
	}
	defer c.replaceNamed(dir, name)()
	release, herr := c.hold(dir)
	if herr != nil {
		return nil, herr
	}
	defer release()
	t := at.Begin()
	defer t.End()
	var reply *pb.RemoveReply
	err := at.As(u.Token()).CallOnce(op, func(ctx context.Context) (err error) {
		reply, err = at.RPC.Remove(ctx, &pb.RemoveRequest{Dir: pb.FromFID(dir.fid), Name: name, DirOnly: dirOnly})
		return err
	})
	if err != nil {
		return nil, err
	}
	c.removed(t, reply.Status, u)
	return reply, c.changedDir(t, dir, reply.Dir, u, func(d *Node) { d.delDentLocked(name) })
}

// Rename renames sdir/sname to ddir/dname, replacing an existing target,
// and returns the FID of the file it moved: the one sname named at the
// server, which may not be the one the caller thought.
func (k *Nodes) Rename(sdir *Node, sname string, ddir *Node, dname string) (node.FID, error) {
	moved, _, err := k.RenameKeeping(sdir, sname, ddir, dname, "")
	return moved, err
}

// RenameKeeping is Rename, but a file the rename replaces is kept in ddir
// under the name keep, in the same change at the server, and its FID
// returned (zero if none was replaced): the mount hides a file it has
// open so, and a rename that fails leaves it where it was.
func (k *Nodes) RenameKeeping(sdir *Node, sname string, ddir *Node, dname, keep string) (moved, kept node.FID, err error) {
	if sdir == ddir && keep == "" {
		if fid, ok := sdir.c.renameHere(sdir, sname, dname, k.u); ok {
			return fid, kept, nil
		}
	}
	reply, err := sdir.c.renameAt(sdir, sname, ddir, dname, keep, "", k.u)
	if err != nil {
		return moved, kept, err
	}
	if r := keptBy(reply, keep); r != nil {
		kept = r.GetFid().ToFID()
	}
	return reply.Status.GetFid().ToFID(), kept, nil
}

// Attr says which attributes SetAttr changes.
type Attr struct {
	Mode         *uint32
	UID, GID     *uint32
	Size         *uint64
	Atime, Mtime *time.Time
}

// SetAttr changes attributes of n. A size change stores the file's local
// writes first and then truncates at the server.
func (k *Nodes) SetAttr(n *Node, a Attr) (node.Status, error) {
	req := &pb.SetAttrRequest{}
	if a.Mode != nil {
		req.Mask |= node.SetMode
		req.Mode = *a.Mode
	}
	if a.UID != nil {
		req.Mask |= node.SetUID
		req.Uid = *a.UID
	}
	if a.GID != nil {
		req.Mask |= node.SetGID
		req.Gid = *a.GID
	}
	if a.Atime != nil {
		req.Mask |= node.SetAtime
		req.AtimeNs = a.Atime.UnixNano()
	}
	if a.Mtime != nil {
		req.Mask |= node.SetMtime
		req.MtimeNs = a.Mtime.UnixNano()
	}
	if a.Size != nil {
		req.Mask |= node.SetSize
		req.Size = *a.Size
	}
	if req.Mask == 0 {
		return k.Getattr(n)
	}
	if err := n.c.setattr(n, req, k.u); err != nil {
		return node.Status{}, err
	}
	return n.status(), nil
}

// TruncateHere truncates n in the cache if a write delegation is held on
// it, as a write there stays local, and reports whether it did; if not,
// SetAttr truncates at the server. The kernel sends open(O_TRUNC) as a
// truncation by name. Only a user known to have the right to write the
// file truncates it here; the server decides for the others.
func (k *Nodes) TruncateHere(n *Node, size uint64) (bool, error) {
	n.mu.Lock()
	bypassed := n.bypassing > 0
	n.mu.Unlock()
	if bypassed || !n.c.writeHere(n) || n.entry == nil {
		return false, nil
	}
	if st, ok := n.statusAs(k.u); !ok || !allows(st, access.Write) {
		return false, nil
	}
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if !n.c.writeHere(n) {
		return false, nil // recalled meanwhile
	}
	return true, n.truncateLocked(size, k.u)
}

// PromiseLeft is how long n's callback promise still holds: how long a
// kernel may cache n's attributes, entry and pages without asking. A file
// made here has its directory's: nobody else can reach it before a settle
// hands it to the server, and one that leaves it uncovered (without a
// write delegation of its own) says so (OnInvalidate).
func (k *Nodes) PromiseLeft(n *Node) time.Duration { return n.c.promiseLeft(n) }

func (c *Client) promiseLeft(n *Node) time.Duration {
	if dir := n.made(); dir != nil {
		n = dir
	}
	if !n.valid.Load() {
		return 0
	}
	exp, ok := n.at().Expiry(n.fid)
	if !ok {
		return 0
	}
	return max(0, time.Until(exp))
}

// Complete reports whether all of n's data is in the cache and valid: the
// cache file can then stand in for the file (FUSE passthrough). Unstored
// writes are in the cache file too.
func (n *Node) Complete() bool {
	return n.c.current(n) && n.entry != nil && n.entry.Complete()
}

// CachePath is n's cache file, empty for a memory cache.
func (n *Node) CachePath() string {
	if n.entry == nil {
		return ""
	}
	return n.entry.Path()
}

// Status is n's last known status (local size while writes are pending).
func (n *Node) Status() node.Status { return n.status() }

// Pin keeps n's cached chunks in place while the cache file is read
// directly (FUSE passthrough); a new version then goes to a new cache file.
func (n *Node) Pin() {
	if n.entry != nil {
		n.entry.Pin()
	}
}

// Unpin undoes Pin.
func (n *Node) Unpin() {
	if n.entry != nil {
		n.entry.Unpin()
	}
}

// Valid reports whether n's cached status and data are known current: a
// callback promise on n is held, or n was made here (PromiseLeft).
func (n *Node) Valid() bool { return n.valid.Load() || n.made() != nil }

// Gauge publishes a counter with the cache's statistics.
func (k *Nodes) Gauge(name string, v int64) { k.c.cache.SetGauge(name, v) }

// Errno is the errno an error from this package stands for: EIO when the
// server could not be asked, ETIMEDOUT when it did not answer in time.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, os.ErrClosed) {
		return syscall.EBADF
	}
	return pb.Errno(err)
}

// TruncateStored truncates n in its cache file, in place, and stores the
// truncation: for a file whose cache file is being read directly, where a
// truncation at the server would be a new version in a new cache file.
func (k *Nodes) TruncateStored(n *Node, size uint64) (node.Status, error) {
	n.wmu.Lock()
	defer n.wmu.Unlock()
	st, err := n.c.fresh(n, k.u)
	if err != nil {
		return node.Status{}, err
	}
	if !allows(st, access.Write) {
		return node.Status{}, syscall.EACCES // before the cache file is cut
	}
	if err := n.truncateLocked(size, k.u); err != nil {
		return node.Status{}, err
	}
	if err := n.storeLocked(true, k.u); err != nil {
		return node.Status{}, err
	}
	return n.status(), nil
}

// Release says the kernel forgot n. Once it has stayed forgotten for
// releaseAfter and holds nothing local, n is dropped from the client's
// memory: a long-running mount would otherwise keep a Node for every file
// it ever looked at. Its cached data stays in the cache, and a later
// lookup makes a new Node that finds it there. The delay matters: a lookup
// racing the kernel's forget can hand n to the kernel again, which Hold
// then says, and a Node the kernel holds must stay the one for its FID.
func (k *Nodes) Release(n *Node) {
	c := n.c
	if n == c.root {
		return
	}
	c.nodesMu.Lock()
	n.forgot.Store(time.Now().UnixNano())
	c.forgotten[n] = struct{}{}
	c.nodesMu.Unlock()
}

// Hold says the kernel was handed n (again).
func (k *Nodes) Hold(n *Node) {
	if n.forgot.Load() == 0 {
		return
	}
	c := n.c
	c.nodesMu.Lock()
	n.forgot.Store(0)
	delete(c.forgotten, n)
	c.nodesMu.Unlock()
}

// releaseAfter is how long a forgotten Node is kept before it is dropped.
const releaseAfter = 2 * time.Second

// dropForgotten drops the Nodes released more than releaseAfter before now
// that hold nothing local.
func (c *Client) dropForgotten(now time.Time) {
	c.nodesMu.Lock()
	var idle []*Node
	for n := range c.forgotten {
		if now.Sub(time.Unix(0, n.forgot.Load())) > releaseAfter {
			idle = append(idle, n)
		}
	}
	c.nodesMu.Unlock()
	for _, n := range idle {
		n.mu.Lock()
		busy := n.fetching.Load() > 0 || n.entry != nil && n.localChanges()
		n.mu.Unlock()
		if busy || !n.wmu.TryLock() {
			continue
		}
		c.nodesMu.Lock()
		if _, ok := c.forgotten[n]; ok {
			delete(c.forgotten, n)
			if c.nodes[n.fid] == n {
				delete(c.nodes, n.fid)
			}
		}
		c.nodesMu.Unlock()
		n.wmu.Unlock()
	}
}

// Policy is the caching policy of n, opened as base in parent.
func (k *Nodes) Policy(n *Node, parent *Node, base string) (policy.Decision, error) {
	return n.c.policyAt(n, parent, base, k.u)
}

// SetPolicy sets n's caching policy (and, if recursive, its subtree's).
func (k *Nodes) SetPolicy(n *Node, mode string, recursive bool) error {
	return n.c.setPolicyAt(n, mode, recursive, k.u)
}

// Seek is lseek's SEEK_DATA or SEEK_HOLE (whence) from off in file n:
// from the cache file when the cache holds the whole file, which keeps
// its holes; otherwise all of the file is data, as a file system that
// knows of no holes answers. ENXIO at or past the end.
func (k *Nodes) Seek(n *Node, off int64, whence int) (int64, error) {
	st, err := n.c.fresh(n, k.u)
	if err != nil {
		return 0, err
	}
	size := int64(st.Size)
	if off < 0 || off >= size {
		return 0, syscall.ENXIO
	}
	if pos, err := n.entry.SeekData(off, whence); err == nil {
		return min(pos, size), nil
	} else if errors.Is(err, syscall.ENXIO) {
		return 0, err
	}
	if whence == unix.SEEK_HOLE {
		return size, nil
	}
	return off, nil
}

// SyncDir makes what this client changed in directory dir durable at its
// server: names made and removed under a directory delegation are settled
// (the server commits each change durably before it answers).
func (k *Nodes) SyncDir(dir *Node) error {
	err := dir.onServer(false, func(*site.Site) error { return k.c.settle(dir) })
	return site.ErrOf("fsync", "/", err)
}

// FSStat is the space of a volume or of the server's file system.
type FSStat = node.FSStat

// StatFS reports the space of n's volume: its quota if it has one, or
// the space of the server holding it.
func (k *Nodes) StatFS(n *Node) (FSStat, error) {
	fs, err := n.at().StatFS(n.fid.Volume, k.u.Token())
	if err != nil {
		return FSStat{}, site.ErrOf("statfs", "/", err)
	}
	return fs, nil
}

// Writable is n where the administration can change it: n itself, or,
// for a file of a volume's read-only copy (which keeps the volume's
// vnodes under an id of its own), the same file of the read-write
// volume, which rw names: its next release publishes the change.
func (k *Nodes) Writable(n *Node) (w *Node, rw string, err error) {
	c := k.c
	if !c.sites.ReadOnly(n.fid.Volume) {
		return n, "", nil
	}
	tok := k.u.Token()
	l, err := c.sites.LocateID(n.fid.Volume, tok)
	if err != nil {
		return nil, "", err
	}
	rw = strings.TrimSuffix(l.Name, node.ReadOnlySuffix)
	if l, err = c.sites.Locate(rw, tok); err != nil {
		return nil, "", err
	}
	at, err := c.sites.For(l)
	if err != nil {
		return nil, "", err
	}
	w = c.node(node.FID{Volume: l.Id, Vnode: n.fid.Vnode, Unique: n.fid.Unique}, at)
	if _, err = c.fresh(w, k.u); err != nil {
		return nil, "", err
	}
	return w, rw, nil
}
