package client

import (
	"context"
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/client/site"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/policy"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// DirEntry is one name in a directory listing.
type DirEntry struct {
	Name string
	Type node.Type
	FID  node.FID
}

// maxLinks bounds symlink hops in one path resolution, as Linux's 40.
const maxLinks = 40

// splitPath cleans an absolute or root-relative path into names. ".."
// cannot climb above the root: the path is cleaned lexically first.
func splitPath(p string) ([]string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return nil, fmt.Errorf("path contains NUL: %w", syscall.EINVAL)
	}
	p = path.Clean("/" + p)
	if p == "/" {
		return nil, nil
	}
	comps := strings.Split(p[1:], "/")
	for _, c := range comps {
		if err := node.CheckName(c); err != nil {
			return nil, err
		}
	}
	return comps, nil
}

// resolve walks p from the root, as the client's own user. Mount points
// and relative symlinks are followed in the middle of a path, and at its
// end when follow is set.
func (c *Client) resolve(p string, follow bool) (*Node, error) {
	comps, err := splitPath(p)
	if err != nil {
		return nil, err
	}
	links := 0
	root, err := c.rootDir()
	if err != nil {
		return nil, err
	}
walk:
	cur := root
	for i, name := range comps {
		if cur, err = c.enterDir(cur, c.self); err != nil {
			return nil, err
		}
		child, err := c.lookup(cur, name, c.self)
		if err != nil {
			return nil, err
		}
		last := i == len(comps)-1
		st := child.status()
		switch {
		case st.Type == node.TypeSymlink && (!last || follow):
			if links++; links > maxLinks {
				return nil, syscall.ELOOP
			}
			if path.IsAbs(st.Target) {
				return nil, fmt.Errorf("symlink %s points to %s, outside hoard: %w", "/"+path.Join(comps[:i+1]...), st.Target, syscall.ENOENT)
			}
			rest := path.Join(append([]string{path.Join(comps[:i]...), st.Target}, comps[i+1:]...)...)
			if comps, err = splitPath(rest); err != nil {
				return nil, err
			}
			goto walk
		case st.Type == node.TypeMountPoint && (!last || follow):
			if child, err = c.volumeRoot(st.Target, c.self); err != nil {
				return nil, err
			}
		}
		cur = child
	}
	return cur, nil
}

// enterDir makes sure n is a directory for u to look names up in.
func (c *Client) enterDir(n *Node, u User) (*Node, error) {
	st, err := c.fresh(n, u)
	if err != nil {
		return nil, err
	}
	switch st.Type {
	case node.TypeDir:
		return n, nil
	case node.TypeMountPoint:
		return c.volumeRoot(st.Target, u)
	}
	return nil, syscall.ENOTDIR
}

// resolveParent resolves all but the last name of p.
func (c *Client) resolveParent(p string) (*Node, string, error) {
	comps, err := splitPath(p)
	if err != nil {
		return nil, "", err
	}
	if len(comps) == 0 {
		return nil, "", fmt.Errorf("the root has no parent: %w", syscall.EINVAL)
	}
	dir, err := c.resolve("/"+path.Join(comps[:len(comps)-1]...), true)
	if err != nil {
		return nil, "", err
	}
	if dir, err = c.enterDir(dir, c.self); err != nil {
		return nil, "", err
	}
	return dir, comps[len(comps)-1], nil
}

func unixMode(m os.FileMode) uint32 {
	mode := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// Creator is who new files belong to; by default the calling process.
type Creator struct{ UID, GID uint32 }

func (c *Client) creator() Creator {
	return Creator{uint32(os.Getuid()), uint32(os.Getgid())}
}

// Make is a file to make: Name in Dir, of Type, owned by Who.
type Make struct {
	Dir  *Node
	Name string
	Type node.Type
	Mode uint32
	Who  Creator
	// Target is a symlink's text or a mount point's volume name; Rdev is
	// a device node's number.
	Target string
	Rdev   uint64
	// Excl refuses an existing file (O_EXCL); without it an existing
	// regular file is returned instead.
	Excl bool
	// Op names the request for the server's retry check ("": a new one);
	// a proxy passes its client's on.
	Op string
}

// create makes m as u. With m.Excl unset an existing regular file is
// returned instead (created=false). A new file comes with a write
// delegation when the client takes them (it is about to be opened).
func (c *Client) create(m Make, u User) (*Node, bool, error) {
	if m.Type == node.TypeFile && m.Op == "" {
		if err := node.CheckName(m.Name); err != nil {
			return nil, false, err
		}
		if n, created, ok, err := c.makeHere(m.Dir, m.Name, m.Mode, m.Who, m.Excl, u); ok {
			return n, created, err
		}
	}
	n, reply, err := c.createAt(m, u)
	if err != nil {
		return nil, false, err
	}
	return n, reply.Created, nil
}

// createAt is create at the server, returning its reply.
func (c *Client) createAt(m Make, u User) (*Node, *pb.CreateReply, error) {
	var n *Node
	var reply *pb.CreateReply
	err := m.Dir.onServer(false, func(at *site.Site) (err error) {
		n, reply, err = c.createAtHere(at, m, u)
		return err
	})
	return n, reply, err
}

// createAtHere is createAt at site at, which holds m.Dir.
func (c *Client) createAtHere(at *site.Site, m Make, u User) (*Node, *pb.CreateReply, error) {
	dir, name, t := m.Dir, m.Name, m.Type
	if err := node.CheckName(name); err != nil {
		return nil, nil, err
	}
	release, herr := c.hold(dir)
	if herr != nil {
		return nil, nil, herr
	}
	defer release()
	tk := at.Begin()
	defer tk.End()
	var reply *pb.CreateReply
	err := at.As(u.token).CallOnce(m.Op, func(ctx context.Context) (err error) {
		reply, err = at.RPC.Create(ctx, &pb.CreateRequest{Dir: pb.FromFID(dir.fid), Name: name, Type: pb.FromType(t),
			Mode: m.Mode, Uid: m.Who.UID, Gid: m.Who.GID, Target: m.Target, Rdev: m.Rdev, Exclusive: m.Excl, Open: t == node.TypeFile && at.Delegating()})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	child, err := c.learnPB(tk, reply.Status, u)
	if err != nil {
		return nil, nil, err
	}
	c.delegated(tk, child, reply.Kind, reply.State)
	if !reply.Created {
		_, err := c.learnPB(tk, reply.Dir, u)
		return child, reply, err
	}
	err = c.changedDir(tk, dir, reply.Dir, u, func(d *Node) { d.addDentLocked(name, child.fid, t) })
	dir.addDent(reply.Dir.DataVersion, name, child, t) // even when no listing was cached
	return child, reply, err
}

// Open opens a file as os.OpenFile does: O_CREATE, O_EXCL, O_TRUNC and
// O_APPEND are honoured. A file is fetched lazily, chunk by chunk, as it
// is read. A directory is not a file: opening one fails with EISDIR.
func (c *Client) Open(name string, flag int, perm os.FileMode) (*File, error) {
	n, how, err := c.openNode(name, flag, perm)
	if err != nil {
		return nil, site.ErrOf("open", name, err)
	}
	parent, base := c.parentOf(name)
	return c.openFile(n, parent, base, name, flag, how, c.self)
}

// openedBy says how the Node an open opens was come by.
type openedBy int

const (
	resolved    openedBy = iota // by name: revalidated
	createMade                  // a create this moment made it: empty
	createFound                 // a create this moment found it: status current
)

// openNode resolves name, or creates it with O_CREATE.
func (c *Client) openNode(name string, flag int, perm os.FileMode) (*Node, openedBy, error) {
	if flag&os.O_CREATE == 0 {
		n, err := c.resolve(name, true)
		return n, resolved, err
	}
	dir, base, err := c.resolveParent(name)
	if err != nil {
		return nil, resolved, err
	}
	n, created, err := c.create(Make{Dir: dir, Name: base, Type: node.TypeFile, Mode: unixMode(perm), Who: c.creator(), Excl: flag&os.O_EXCL != 0}, c.self)
	if Errno(err) == syscall.EEXIST && flag&os.O_EXCL == 0 {
		// Exists as something else: a symlink to follow, or a directory.
		n, err = c.resolve(name, true)
		return n, resolved, err
	}
	return n, createdHow(created), err
}

// permitted refuses an open of an existing file that the opener's rights
// in st (fresh's, the server's word for that user) do not allow, even
// with the bytes in the cache: an ACL change breaks the promises on the
// files it governs, and the status got again says what is left. A status
// the client made itself knows none. As in Unix, a file just created is
// open as its creator asked, whatever mode it was given.
func permitted(st node.Status, flag int) error {
	acc := flag & syscall.O_ACCMODE
	if acc != os.O_WRONLY && !allows(st, access.Read) || acc != os.O_RDONLY && !allows(st, access.Write) {
		return syscall.EACCES
	}
	return nil
}

func createdHow(created bool) openedBy {
	if created {
		return createMade
	}
	return createFound
}

// openFile opens an already resolved node for u, named base in parent
// (nil if unknown) for its caching policy, and name in error reports. A
// file a create just answered with is opened as that answer has it,
// without asking the server again, and the open does not fail if the
// file is gone by then (another client removed it): the create
// succeeded, and through FUSE the kernel would take a failure (ESTALE) as
// a reason to create the file a second time. What is written to a file
// that is gone is kept in lost/, as always. A file the create found is
// opened as an open of it would be: as u's rights allow.
func (c *Client) openFile(n *Node, parent *Node, base, name string, flag int, how openedBy, u User) (*File, error) {
	if flag&(os.O_WRONLY|os.O_RDWR|os.O_TRUNC) != 0 && c.sites.ReadOnly(n.fid.Volume) {
		return nil, site.ErrOf("open", name, syscall.EROFS)
	}

	gone := func(err error) bool {
		e := Errno(err) // a server's answer is a gRPC status, not an errno
		return how != resolved && (e == syscall.ESTALE || e == syscall.ENOENT)
	}
	st := n.status()
	check := how != createMade
	switch how {
	case createMade:
		flag &^= os.O_TRUNC
	default:
		fst, err := c.fresh(n, u)
		switch {
		case err == nil:
			st = fst
		case gone(err):
			check = false
		default:
			return nil, site.ErrOf("open", name, err)
		}
	}
	f := &File{n: n, u: u, name: name, flags: flag}
	switch st.Type {
	case node.TypeFile:
	case node.TypeDir:
		// A directory has no file data to read or write (list it with
		// ReadDir): a File on one would read a cache entry it has not.
		return nil, site.ErrOf("open", name, syscall.EISDIR)
	default:
		return nil, site.ErrOf("open", name, syscall.EINVAL)
	}
	if check {
		if err := permitted(st, flag); err != nil {
			return nil, site.ErrOf("open", name, err)
		}
	}
	n.named(name, f.writable())
	f.decision = c.decide(n, parent, base, true)
	if f.decision.Bypass {
		if i := slices.Index(policy.Rules[:], f.decision.Rule); i >= 0 {
			c.counters.bypassOpens[i].Add(1)
		}
		if err := c.leaveCache(n, u); err != nil {
			return nil, site.ErrOf("open", name, err)
		}
		f.bp.Store(f.openBypass(f.decision.Probation))
		n.mu.Lock()
		n.bypassing++
		n.mu.Unlock()
	} else if n.at().Delegating() {
		switch err := c.openDeleg(n, f.writable(), u); {
		case err == nil:
			f.counted = true
		case !gone(err):
			return nil, site.ErrOf("open", name, err)
		}
	}
	if !f.decision.Bypass && f.readable() && parent != nil {
		c.readAheadIn(parent, base, u)
	}
	if f.writable() && flag&os.O_TRUNC != 0 {
		err := f.Truncate(0)
		if err != nil && !gone(err) {
			f.uncount()
			return nil, site.ErrOf("open", name, err)
		}
	}
	n.mu.Lock()
	n.files++
	n.mu.Unlock()
	f.held = true
	return f, nil
}

// leaveCache readies a cached file for bypass by u: a file made here is
// created at the server and local writes are stored first, so nothing is
// lost or read stale by the bypassing open.
func (c *Client) leaveCache(n *Node, u User) error {
	if err := c.settleFor(n); err != nil {
		return err // bypassing reads and writes go to the server
	}
	if !n.localChanges() {
		return nil
	}
	n.wmu.Lock()
	defer n.wmu.Unlock()
	return n.storeLocked(true, u)
}

// Create creates or truncates a file for reading and writing.
func (c *Client) Create(name string) (*File, error) {
	return c.Open(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// Stat returns the status of name, following symlinks and mount points.
func (c *Client) Stat(name string) (node.Status, error) { return c.stat("stat", name, true) }

// Lstat is Stat without following a final symlink or mount point.
func (c *Client) Lstat(name string) (node.Status, error) { return c.stat("lstat", name, false) }

func (c *Client) stat(op, name string, follow bool) (node.Status, error) {
	n, err := c.resolve(name, follow)
	if err != nil {
		return node.Status{}, site.ErrOf(op, name, err)
	}
	st, err := c.fresh(n, c.self)
	return st, site.ErrOf(op, name, err)
}

// ReadDir lists a directory in the server's stable order.
func (c *Client) ReadDir(name string) ([]DirEntry, error) {
	n, err := c.resolve(name, true)
	if err == nil {
		n, err = c.enterDir(n, c.self)
	}
	if err != nil {
		return nil, site.ErrOf("readdir", name, err)
	}
	ents, _, err := c.readDir(n, c.self)
	return ents, site.ErrOf("readdir", name, err)
}

// Mkdir makes a directory.
func (c *Client) Mkdir(name string, perm os.FileMode) error {
	dir, base, err := c.resolveParent(name)
	if err == nil {
		_, _, err = c.create(Make{Dir: dir, Name: base, Type: node.TypeDir, Mode: unixMode(perm), Who: c.creator(), Excl: true}, c.self)
	}
	return site.ErrOf("mkdir", name, err)
}

// Symlink makes link a symbolic link to target.
func (c *Client) Symlink(target, link string) error {
	dir, base, err := c.resolveParent(link)
	if err == nil {
		_, _, err = c.create(Make{Dir: dir, Name: base, Type: node.TypeSymlink, Mode: 0o777, Who: c.creator(), Target: target, Excl: true}, c.self)
	}
	return site.ErrOf("symlink", link, err)
}

// Readlink returns a symlink's target.
func (c *Client) Readlink(name string) (string, error) {
	n, err := c.resolve(name, false)
	if err != nil {
		return "", site.ErrOf("readlink", name, err)
	}
	st, err := c.fresh(n, c.self)
	if err == nil && st.Type != node.TypeSymlink {
		err = syscall.EINVAL
	}
	return st.Target, site.ErrOf("readlink", name, err)
}

// Link makes newname a hard link to oldname.
func (c *Client) Link(oldname, newname string) error {
	err := c.link(oldname, newname)
	return site.ErrOf("link", newname, err)
}

func (c *Client) link(oldname, newname string) error {
	target, err := c.resolve(oldname, false)
	if err != nil {
		return err
	}
	dir, base, err := c.resolveParent(newname)
	if err != nil {
		return err
	}
	_, err = c.Nodes().Link(dir, base, target)
	return err
}

// Remove removes a file, symlink, mount point or empty directory.
func (c *Client) Remove(name string) error {
	return site.ErrOf("remove", name, c.remove(name))
}

func (c *Client) remove(name string) error {
	dir, base, err := c.resolveParent(name)
	if err != nil {
		return err
	}
	err = c.Nodes().Remove(dir, base, false)
	if pb.Errno(err) == syscall.EISDIR || errors.Is(err, syscall.EISDIR) {
		err = c.Nodes().Remove(dir, base, true)
	}
	return err
}

// removed updates a vnode that lost a name by u's request: forgotten when
// it is gone, given the status the server replied with otherwise (a
// delegation would go on serving the one from before).
func (c *Client) removed(t site.Ticket, ps *pb.Status, u User) {
	st, _, err := ps.ToStatus()
	if err != nil {
		return
	}
	if st.Nlink == 0 {
		c.nodesMu.Lock()
		n := c.nodes[st.FID]
		c.nodesMu.Unlock()
		if n != nil {
			n.mu.Lock()
			n.unlinked = true
			n.mu.Unlock()
			c.forget(n)
		} else {
			c.cache.Drop(st.FID)
		}
		return
	}
	c.node(st.FID, t.At).valid.Store(false)
	c.learn(t, st, 0, u)
}

// Rename renames oldname to newname, replacing newname if it exists (and
// is not a non-empty directory), atomically.
func (c *Client) Rename(oldname, newname string) error {
	return site.ErrOf("rename", oldname, c.rename(oldname, newname))
}

func (c *Client) rename(oldname, newname string) error {
	sdir, sbase, err := c.resolveParent(oldname)
	if err != nil {
		return err
	}
	ddir, dbase, err := c.resolveParent(newname)
	if err != nil {
		return err
	}
	_, err = c.Nodes().Rename(sdir, sbase, ddir, dbase)
	return err
}

// renameAt renames as u and returns the server's reply; op names the
// request for its retries ("": a new name), keep is RenameKeeping's.
func (c *Client) renameAt(sdir *Node, sbase string, ddir *Node, dbase, keep, op string, u User) (*pb.RenameReply, error) {
	var reply *pb.RenameReply
	err := sdir.onServer(false, func(at *site.Site) (err error) {
		reply, err = c.renameAtHere(at, sdir, sbase, ddir, dbase, keep, op, u)
		return err
	})
	return reply, err
}

// renameAtHere is renameAt at site at, which holds sdir.
func (c *Client) renameAtHere(at *site.Site, sdir *Node, sbase string, ddir *Node, dbase, keep, op string, u User) (*pb.RenameReply, error) {
	if sdir.at() != ddir.at() {
		return nil, syscall.EXDEV // another server's volume
	}
	if err := node.CheckName(sbase); err != nil {
		return nil, err
	}
	if err := node.CheckName(dbase); err != nil {
		return nil, err
	}
	if err := c.settleNamed(ddir, dbase); err != nil {
		return nil, err
	}
	defer c.replaceNamed(ddir, dbase)()
	release, herr := c.hold(sdir, ddir)
	if herr != nil {
		return nil, herr
	}
	defer release()
	t := at.Begin()
	defer t.End()
	var reply *pb.RenameReply
	err := at.As(u.token).CallOnce(op, func(ctx context.Context) (err error) {
		reply, err = at.RPC.Rename(ctx, &pb.RenameRequest{SrcDir: pb.FromFID(sdir.fid), SrcName: sbase, DstDir: pb.FromFID(ddir.fid), DstName: dbase, KeepReplacedAs: keep})
		return err
	})
	if err != nil {
		return nil, err
	}
	if reply.Replaced != nil {
		c.removed(t, reply.Replaced, u)
	}
	moved, err := c.learnPB(t, reply.Status, u)
	if err != nil {
		return nil, err
	}
	typ := reply.Status.Type.ToType()
	into := func(d *Node) {
		if r := reply.Replaced; keep != "" && r != nil && r.Nlink > 0 {
			d.addDentLocked(keep, r.GetFid().ToFID(), r.Type.ToType())
		}
		d.addDentLocked(dbase, moved.fid, typ)
	}
	if sdir == ddir {
		return reply, c.changedDir(t, sdir, reply.DstDir, u, func(d *Node) {
			d.delDentLocked(sbase)
			into(d)
		})
	}
	if err := c.changedDir(t, sdir, reply.SrcDir, u, func(d *Node) { d.delDentLocked(sbase) }); err != nil {
		return nil, err
	}
	return reply, c.changedDir(t, ddir, reply.DstDir, u, into)
}

// setattr changes status fields of an already resolved node, as u.
func (c *Client) setattr(n *Node, req *pb.SetAttrRequest, u User) error {
	return n.onServer(false, func(at *site.Site) error { return c.setattrHere(at, n, req, u) })
}

// setattrHere is setattr at site at, which holds n.
func (c *Client) setattrHere(at *site.Site, n *Node, req *pb.SetAttrRequest, u User) error {
	if err := c.settleFor(n); err != nil {
		return err
	}
	if n.entry != nil && req.Mask&(node.SetSize|node.SetMtime) != 0 {
		// Unstored writes go first: stored later, they would undo the
		// new size or modification time.
		n.wmu.Lock()
		defer n.wmu.Unlock()
		if err := c.storeBack(n, false, u); err != nil {
			return err
		}
	}
	req.Fid = pb.FromFID(n.fid)
	t := at.Begin()
	defer t.End()
	var reply *pb.SetAttrReply
	err := at.As(u.token).Call(func(ctx context.Context) (err error) {
		reply, err = at.RPC.SetAttr(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	_, err = c.learnPB(t, reply.Status, u)
	return err
}

func (c *Client) setattrPath(op, name string, req *pb.SetAttrRequest) error {
	n, err := c.resolve(name, true)
	if err == nil {
		err = c.setattr(n, req, c.self)
	}
	return site.ErrOf(op, name, err)
}

// Chmod changes the permission bits.
func (c *Client) Chmod(name string, mode os.FileMode) error {
	return c.setattrPath("chmod", name, &pb.SetAttrRequest{Mask: node.SetMode, Mode: unixMode(mode)})
}

// Chown changes the owner and group; -1 leaves one as it is.
func (c *Client) Chown(name string, uid, gid int) error {
	req := &pb.SetAttrRequest{}
	if uid >= 0 {
		req.Mask |= node.SetUID
		req.Uid = uint32(uid)
	}
	if gid >= 0 {
		req.Mask |= node.SetGID
		req.Gid = uint32(gid)
	}
	if req.Mask == 0 {
		return nil
	}
	return c.setattrPath("chown", name, req)
}

// Chtimes changes the access and modification times.
func (c *Client) Chtimes(name string, atime, mtime time.Time) error {
	return c.setattrPath("chtimes", name, &pb.SetAttrRequest{Mask: node.SetAtime | node.SetMtime, AtimeNs: atime.UnixNano(), MtimeNs: mtime.UnixNano()})
}

// Truncate changes a file's size: in the cache under a write delegation,
// otherwise at the server at once (after storing any local writes to it).
func (c *Client) Truncate(name string, size int64) error {
	if size < 0 {
		return site.ErrOf("truncate", name, syscall.EINVAL)
	}
	n, err := c.resolve(name, true)
	if err == nil {
		sz := uint64(size)
		var here bool
		if here, err = c.Nodes().TruncateHere(n, sz); err == nil && !here {
			_, err = c.Nodes().SetAttr(n, Attr{Size: &sz})
		}
	}
	return site.ErrOf("truncate", name, err)
}

// FSStat is the space of the server's file system.
type FSStat = node.FSStat

// StatFS reports the server's space.
func (c *Client) StatFS() (FSStat, error) {
	root, err := c.rootDir()
	if err != nil {
		return FSStat{}, site.ErrOf("statfs", "/", err)
	}
	fs, err := root.at().StatFS(root.fid.Volume, c.self.token)
	if err != nil {
		return FSStat{}, site.ErrOf("statfs", "/", err)
	}
	return fs, nil
}
