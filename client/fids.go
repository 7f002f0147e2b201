package client

import (
	"context"
	"fmt"
	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/admin"
	"github.com/hoardfs/hoard/client/site"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// FIDs is the FID-level API: what a protocol adapter needs that serves
// other clients by FID (the proxy). It acts as the client's own user (a
// proxy checks its own clients' rights itself). Nothing here crosses a
// mount point:
// the adapter's own clients do that. Every status returned is the one the
// answer belongs to, and every change is made at the server before it
// returns.
type FIDs struct{ c *Client }

// FIDs is c's FID-level API.
func (c *Client) FIDs() *FIDs { return &FIDs{c} }

// Node returns the Node for fid, known yet or not, at the server of the
// cell holding its volume. A volume that cannot be located yet gets a
// Node at the first server, which answers for it with an error.
func (p *FIDs) Node(fid node.FID) *Node {
	s, err := p.c.sites.OfID(fid.Volume, p.c.self.Token())
	if err != nil {
		s = p.c.sites.First()
	}
	return p.c.node(fid, s)
}

// Status returns n's status, from the cache while a promise is held.
func (p *FIDs) Status(n *Node) (node.Status, error) { return p.c.fresh(n, p.c.self) }

// Lookup finds name in dir, from the cache while a promise on dir is
// held, and returns the status of dir the answer belongs to (a later one
// could say a name is there that is gone); a mount point is returned as
// itself.
func (p *FIDs) Lookup(dir *Node, name string) (*Node, node.Status, error) {
	return p.c.lookupAt(dir, name, p.c.self)
}

// List lists dir, from the cache while a promise on it is held, with
// the status of dir the listing belongs to.
func (p *FIDs) List(dir *Node) ([]DirEntry, node.Status, error) {
	for attempt := 0; attempt < 5; attempt++ {
		ents, dv, err := p.c.readDir(dir, p.c.self)
		if err != nil {
			return nil, node.Status{}, err
		}
		if st := dir.status(); dv != 0 && st.DataVersion == dv {
			return ents, st, nil
		}
	}
	return nil, node.Status{}, fmt.Errorf("list %v: the directory kept changing: %w", dir.fid, syscall.EAGAIN)
}

// FetchChunk fetches chunk idx of n from the server, past the cache: the
// bytes of data version dv, whole (short only at the end of the file).
func (p *FIDs) FetchChunk(n *Node, idx int64) (data []byte, dv uint64, err error) {
	return n.fetchChunk(idx, p.c.self)
}

// ChunkSize is the unit FetchChunk fetches.
func (p *FIDs) ChunkSize() int64 { return p.c.cache.ChunkSize() }

// The namespace changes below name the request op (for the server's
// retry check: a proxy passes its client's on) and return the statuses
// of the server's reply, which belong to the change; the Nodes may know
// later ones by the time they return.

// Create makes m at the server, returning the new (or existing) file's
// status, whether the create made it, and its directory's status.
func (p *FIDs) Create(m Make) (st, d node.Status, created bool, err error) {
	_, reply, err := p.c.createAt(m, p.c.self)
	if err != nil {
		return st, d, false, err
	}
	st, d, err = twoStatuses(reply.Status, reply.Dir)
	return st, d, reply.Created, err
}

// Link makes name in dir a hard link to target at the server, returning
// the file's status and dir's; op names the request.
func (p *FIDs) Link(dir *Node, name string, target *Node, op string) (st, d node.Status, err error) {
	_, reply, err := p.c.linkAt(dir, name, target, op, p.c.self)
	if err != nil {
		return st, d, err
	}
	return twoStatuses(reply.Status, reply.Dir)
}

// Remove removes name from dir at the server (an empty directory, with
// dirOnly), returning dir's status and that of the vnode that lost the
// name (Nlink 0 if it is gone).
func (p *FIDs) Remove(dir *Node, name string, dirOnly bool, op string) (d, st node.Status, err error) {
	reply, err := p.c.removeAt(dir, name, dirOnly, op, p.c.self)
	if err != nil {
		return d, st, err
	}
	return twoStatuses(reply.Dir, reply.Status)
}

// Rename renames sdir/sname to ddir/dname at the server, returning the
// statuses of both directories, of the moved vnode, and of the one the
// rename replaced, if any (kept as ddir/keep if keep is set, as
// Nodes.RenameKeeping keeps it).
func (p *FIDs) Rename(sdir *Node, sname string, ddir *Node, dname, keep, op string) (src, dst, moved node.Status, replaced *node.Status, err error) {
	reply, err := p.c.renameAt(sdir, sname, ddir, dname, keep, op, p.c.self)
	if err != nil {
		return src, dst, moved, nil, err
	}
	if reply.Replaced != nil {
		r, _, err := reply.Replaced.ToStatus()
		if err != nil {
			return src, dst, moved, nil, err
		}
		replaced = &r
	}
	if src, dst, err = twoStatuses(reply.SrcDir, reply.DstDir); err != nil {
		return src, dst, moved, nil, err
	}
	moved, _, err = reply.Status.ToStatus()
	return src, dst, moved, replaced, err
}

func twoStatuses(a, b *pb.Status) (sa, sb node.Status, err error) {
	if sa, _, err = a.ToStatus(); err != nil {
		return sa, sb, err
	}
	sb, _, err = b.ToStatus()
	return sa, sb, err
}

// SetAttr changes n's attributes at the server, in the server's own
// terms (node.Change's mask bits).
func (p *FIDs) SetAttr(n *Node, ch node.Change) (node.Status, error) {
	req := &pb.SetAttrRequest{Mask: ch.Mask, Mode: ch.Mode, Uid: ch.UID, Gid: ch.GID, Size: ch.Size,
		AtimeNs: ch.Atime.UnixNano(), MtimeNs: ch.Mtime.UnixNano()}
	if err := p.c.setattr(n, req, p.c.self); err != nil {
		return node.Status{}, err
	}
	return n.status(), nil
}

// StoreThrough stores a change to a file made elsewhere (by a proxy's
// client): args.Read supplies its bytes. It returns the file's new status.
// The cached chunks of the old version are dropped.
func (p *FIDs) StoreThrough(args datapath.StoreArgs) (node.Status, error) {
	n := p.Node(args.FID)
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if err := n.c.storeData(n.at(), args, p.c.self, nil); err != nil {
		return node.Status{}, err
	}
	return n.status(), nil
}

// Volume finds a volume by name or, with name empty, by id. Volumes are
// remembered: their names and roots never change.
func (p *FIDs) Volume(name string, id uint64) (admin.Volume, error) {
	c := p.c
	c.volMu.Lock()
	for _, v := range c.vols {
		if name != "" && v.Name == name || name == "" && v.Id == id {
			c.volMu.Unlock()
			return admin.VolumeOf(v), nil
		}
	}
	c.volMu.Unlock()
	var s *site.Site
	var err error
	if name != "" {
		s, err = c.sites.Of(name, c.self.Token())
	} else {
		s, err = c.sites.OfID(id, c.self.Token())
	}
	if err != nil {
		return admin.Volume{}, err
	}
	var v *pb.Volume
	err = s.Conn.Call(func(ctx context.Context) (err error) {
		v, err = s.RPC.GetVolume(ctx, &pb.GetVolumeRequest{Name: name, Id: id})
		return err
	})
	if err != nil {
		return admin.Volume{}, err
	}
	c.volMu.Lock()
	c.vols[v.Name] = v
	c.volMu.Unlock()
	return admin.VolumeOf(v), nil
}

// StatFS reports the space of a volume (its quota), or of the server
// holding it.
func (p *FIDs) StatFS(volume uint64) (node.FSStat, error) {
	s, err := p.c.sites.OfID(volume, p.c.self.Token())
	if err != nil {
		return node.FSStat{}, err
	}
	return s.StatFS(volume, p.c.self.Token())
}

// PromiseLeft is how long n's callback promise still holds: how long the
// proxy may promise n to its own clients.
func (p *FIDs) PromiseLeft(n *Node) time.Duration { return p.c.promiseLeft(n) }

// Held is the delegation this client holds on n now, unless none is or
// it is being recalled: a proxy passes on what it holds without asking.
func (p *FIDs) Held(n *Node) (callback.Held, bool) { return p.c.held(n) }

// Delegate gets this client a delegation on file n, as an open for writing
// (if write) would, without opening it: a proxy holds the origin's
// delegations for its own clients, whose opens are its to count. It
// returns the delegation held afterwards, or none (the server refused, or
// grants none).
func (p *FIDs) Delegate(n *Node, write bool) (callback.Held, bool) {
	return p.c.delegate(n, write, p.c.self)
}

// MaxFileSize is the largest file size the server stores (0: unknown):
// a proxy tells its own clients the same.
func (p *FIDs) MaxFileSize() uint64 { return p.c.sites.First().MaxFile() }

// Lease is the delegation lease the server announced (0: it grants none).
func (p *FIDs) Lease() time.Duration { return p.c.sites.First().Lease() }

// ACL reads the ACL governing f, at the server holding its volume.
func (p *FIDs) ACL(f node.FID) (admin.ACL, error) { return p.c.Admin().ACLOf(f) }

// SetACL gives who the rights r in directory dir, at the server holding
// its volume.
func (p *FIDs) SetACL(dir node.FID, who string, r access.Rights) (admin.ACL, error) {
	return p.c.Admin().SetACLOf(dir, who, r)
}
