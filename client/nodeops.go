package client

import (
	"context"
	"github.com/hoardfs/hoard/client/site"
	"github.com/hoardfs/hoard/client/user"
	"os"
	"slices"
	"syscall"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/policy"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// What the views (Nodes, FIDs) share of making, opening, renaming and
// changing nodes already resolved.

// DirEntry is one name in a directory listing.
type DirEntry struct {
	Name string
	Type node.Type
	FID  node.FID
}

// Creator is who new files belong to (pathfs: the calling process).
type Creator struct{ UID, GID uint32 }

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
func (c *Client) create(m Make, u user.User) (*Node, bool, error) {
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
func (c *Client) createAt(m Make, u user.User) (*Node, *pb.CreateReply, error) {
	var n *Node
	var reply *pb.CreateReply
	err := m.Dir.onServer(false, func(at *site.Site) (err error) {
		n, reply, err = c.createAtHere(at, m, u)
		return err
	})
	return n, reply, err
}

// createAtHere is createAt at site at, which holds m.Dir.
func (c *Client) createAtHere(at *site.Site, m Make, u user.User) (*Node, *pb.CreateReply, error) {
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
	err := at.As(u.Token()).CallOnce(m.Op, func(ctx context.Context) (err error) {
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

// openedBy says how the Node an open opens was come by.
type openedBy int

const (
	resolved    openedBy = iota // by name: revalidated
	createMade                  // a create this moment made it: empty
	createFound                 // a create this moment found it: status current
)

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
func (c *Client) openFile(n *Node, parent *Node, base, name string, flag int, how openedBy, u user.User) (*File, error) {
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
func (c *Client) leaveCache(n *Node, u user.User) error {
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

// removed updates a vnode that lost a name by u's request: forgotten when
// it is gone, given the status the server replied with otherwise (a
// delegation would go on serving the one from before).
func (c *Client) removed(t site.Ticket, ps *pb.Status, u user.User) {
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

// renameAt renames as u and returns the server's reply; op names the
// request for its retries ("": a new name), keep is RenameKeeping's.
func (c *Client) renameAt(sdir *Node, sbase string, ddir *Node, dbase, keep, op string, u user.User) (*pb.RenameReply, error) {
	var reply *pb.RenameReply
	err := sdir.onServer(false, func(at *site.Site) (err error) {
		reply, err = c.renameAtHere(at, sdir, sbase, ddir, dbase, keep, op, u)
		return err
	})
	return reply, err
}

// renameAtHere is renameAt at site at, which holds sdir.
func (c *Client) renameAtHere(at *site.Site, sdir *Node, sbase string, ddir *Node, dbase, keep, op string, u user.User) (*pb.RenameReply, error) {
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
	err := at.As(u.Token()).CallOnce(op, func(ctx context.Context) (err error) {
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
		if r := keptBy(reply, keep); r != nil {
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

// keptBy is the file a rename asked to keep as keep (RenameKeeping) and
// the server kept, still linked, or nil.
func keptBy(reply *pb.RenameReply, keep string) *pb.Status {
	if r := reply.Replaced; keep != "" && r != nil && r.Nlink > 0 {
		return r
	}
	return nil
}

// setattr changes status fields of an already resolved node, as u.
func (c *Client) setattr(n *Node, req *pb.SetAttrRequest, u user.User) error {
	return n.onServer(false, func(at *site.Site) error { return c.setattrHere(at, n, req, u) })
}

// setattrHere is setattr at site at, which holds n.
func (c *Client) setattrHere(at *site.Site, n *Node, req *pb.SetAttrRequest, u user.User) error {
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
	err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
		reply, err = at.RPC.SetAttr(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	_, err = c.learnPB(t, reply.Status, u)
	return err
}
