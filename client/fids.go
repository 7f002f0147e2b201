package client

import (
	"context"
	"fmt"
	"syscall"

	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// The FID-level API: what a protocol adapter needs that serves other
// clients by FID (the proxy). Nothing here crosses a mount point: the
// adapter's own clients do that. Every status returned is the one the
// answer belongs to, and every change is made at the server before it
// returns.

// NodeOf returns the Node for fid, known yet or not.
func (c *Client) NodeOf(fid node.FID) *Node { return c.node(fid) }

// StatusOf returns n's status, from the cache while a promise is held.
func (c *Client) StatusOf(n *Node) (node.Status, error) { return c.fresh(n) }

// LookupRaw finds name in dir, from the cache while a promise on dir is
// held, and returns the status of dir the answer belongs to (a later one
// could say a name is there that is gone); a mount point is returned as
// itself.
func (c *Client) LookupRaw(dir *Node, name string) (*Node, node.Status, error) {
	return c.lookupAt(dir, name)
}

// ListDir lists dir, from the cache while a promise on it is held, with
// the status of dir the listing belongs to.
func (c *Client) ListDir(dir *Node) ([]DirEntry, node.Status, error) {
	for attempt := 0; attempt < 5; attempt++ {
		ents, dv, err := c.readDir(dir)
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
func (c *Client) FetchChunk(n *Node, idx int64) (data []byte, dv uint64, err error) {
	return n.fetchChunk(idx)
}

// ChunkSize is the unit FetchChunk fetches.
func (c *Client) ChunkSize() int64 { return c.cache.ChunkSize() }

// The namespace changes below name the request op (for the server's
// retry check: a proxy passes its client's on) and return the statuses
// of the server's reply, which belong to the change; the Nodes may know
// later ones by the time they return.

// CreateOp is CreateAt returning the new (or existing) file's status,
// whether the create made it, and dir's status.
func (c *Client) CreateOp(dir *Node, name string, t node.Type, mode uint32, who Creator, target string, rdev uint64, excl bool, op string) (st, d node.Status, created bool, err error) {
	_, reply, err := c.createAt(dir, name, t, mode, who, target, rdev, excl, op)
	if err != nil {
		return st, d, false, err
	}
	st, d, err = twoStatuses(reply.Status, reply.Dir)
	return st, d, reply.Created, err
}

// LinkOp is LinkAt returning the file's status and dir's.
func (c *Client) LinkOp(dir *Node, name string, target *Node, op string) (st, d node.Status, err error) {
	_, reply, err := c.linkAt(dir, name, target, op)
	if err != nil {
		return st, d, err
	}
	return twoStatuses(reply.Status, reply.Dir)
}

// RemoveOp is RemoveAt returning dir's status and that of the vnode that
// lost the name (Nlink 0 if it is gone).
func (c *Client) RemoveOp(dir *Node, name string, dirOnly bool, op string) (d, st node.Status, err error) {
	reply, err := c.removeAt(dir, name, dirOnly, op)
	if err != nil {
		return d, st, err
	}
	return twoStatuses(reply.Dir, reply.Status)
}

// RenameOp is RenameAt returning the statuses of both directories, of the
// moved vnode, and of the one the rename replaced, if any.
func (c *Client) RenameOp(sdir *Node, sname string, ddir *Node, dname string, op string) (src, dst, moved node.Status, replaced *node.Status, err error) {
	reply, err := c.renameAt(sdir, sname, ddir, dname, op)
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

// SetAttrChange is SetAttr for a change in the server's own terms (the
// wire's mask bits).
func (c *Client) SetAttrChange(n *Node, ch node.Change) (node.Status, error) {
	req := &pb.SetAttrRequest{Mask: ch.Mask, Mode: ch.Mode, Uid: ch.UID, Gid: ch.GID, Size: ch.Size,
		AtimeNs: ch.Atime.UnixNano(), MtimeNs: ch.Mtime.UnixNano()}
	if err := c.setattr(n, req); err != nil {
		return node.Status{}, err
	}
	return n.status(), nil
}

// StoreThrough stores a change to a file made elsewhere (by a proxy's
// client): args.Read supplies its bytes. It returns the file's new status.
// The cached chunks of the old version are dropped.
func (c *Client) StoreThrough(args datapath.StoreArgs) (node.Status, error) {
	n := c.node(args.FID)
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if err := c.storeData(args, nil); err != nil {
		return node.Status{}, err
	}
	return n.status(), nil
}

// Volume finds a volume by name or, with name empty, by id. Volumes are
// remembered: their names and roots never change.
func (c *Client) Volume(name string, id uint64) (Volume, error) {
	c.volMu.Lock()
	for _, v := range c.vols {
		if name != "" && v.Name == name || name == "" && v.Id == id {
			c.volMu.Unlock()
			return toVolume(v), nil
		}
	}
	c.volMu.Unlock()
	var v *pb.Volume
	err := c.call(func(ctx context.Context) (err error) {
		v, err = c.rpc.GetVolume(ctx, &pb.GetVolumeRequest{Name: name, Id: id})
		return err
	})
	if err != nil {
		return Volume{}, err
	}
	c.volMu.Lock()
	c.vols[v.Name] = v
	c.volMu.Unlock()
	return toVolume(v), nil
}

// StatFSVolume reports the space of the server holding a volume.
func (c *Client) StatFSVolume(volume uint64) (node.FSStat, error) {
	var r *pb.StatFSReply
	err := c.call(func(ctx context.Context) (err error) {
		r, err = c.rpc.StatFS(ctx, &pb.StatFSRequest{Volume: volume})
		return err
	})
	if err != nil {
		return node.FSStat{}, err
	}
	return node.FSStat{BlockSize: r.BlockSize, Blocks: r.Blocks, BlocksFree: r.BlocksFree, Files: r.Files, FilesFree: r.FilesFree}, nil
}
