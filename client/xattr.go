package client

import (
	"context"
	"github.com/hoardfs/hoard/client/site"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Extended attributes of the user namespace live at the server with the
// file (vnode's xattr.go); every call asks it, as u. They are not cached:
// a tool reads them once a file (cp -a, tar --xattrs), and the mount asks
// only for user.* names, so the kernel's own (security.capability, asked
// at every write) cost no round trip.

// xattr makes one Xattr request for n at its server, as u, and learns the
// status a change returns.
func (c *Client) xattr(n *Node, req *pb.XattrRequest, u User) (*pb.XattrReply, error) {
	var reply *pb.XattrReply
	err := n.onServer(false, func(at *site.Site) error {
		if err := c.checkToken(u); err != nil {
			return err
		}
		if err := c.settleFor(n); err != nil {
			return err
		}
		req.Fid = pb.FromFID(n.fid)
		t := at.Begin()
		defer t.End()
		err := at.As(u.token).Call(func(ctx context.Context) (err error) {
			reply, err = at.RPC.Xattr(ctx, req)
			return err
		})
		if err == nil && reply.Status != nil {
			_, err = c.learnPB(t, reply.Status, u)
		}
		return err
	})
	return reply, err
}

// GetXattr is the value of n's extended attribute name (ENODATA: none).
func (k *Nodes) GetXattr(n *Node, name string) ([]byte, error) {
	r, err := k.c.xattr(n, &pb.XattrRequest{Op: pb.XattrOp_XATTR_GET, Name: name}, k.u)
	if err != nil {
		return nil, err
	}
	return r.Value, nil
}

// ListXattr lists n's extended attribute names.
func (k *Nodes) ListXattr(n *Node) ([]string, error) {
	r, err := k.c.xattr(n, &pb.XattrRequest{Op: pb.XattrOp_XATTR_LIST}, k.u)
	if err != nil {
		return nil, err
	}
	return r.Names, nil
}

// SetXattr sets n's extended attribute name to val, with setxattr(2)'s
// flags, and returns n's status.
func (k *Nodes) SetXattr(n *Node, name string, val []byte, flags uint32) (node.Status, error) {
	if _, err := k.c.xattr(n, &pb.XattrRequest{Op: pb.XattrOp_XATTR_SET, Name: name, Value: val, Flags: flags}, k.u); err != nil {
		return node.Status{}, err
	}
	return n.status(), nil
}

// RemoveXattr removes n's extended attribute name (ENODATA: none).
func (k *Nodes) RemoveXattr(n *Node, name string) (node.Status, error) {
	if _, err := k.c.xattr(n, &pb.XattrRequest{Op: pb.XattrOp_XATTR_REMOVE, Name: name}, k.u); err != nil {
		return node.Status{}, err
	}
	return n.status(), nil
}

// GetXattr, ListXattr, SetXattr and RemoveXattr serve a proxy's clients,
// as the proxy.
func (p *FIDs) GetXattr(n *Node, name string) ([]byte, error) { return p.c.Nodes().GetXattr(n, name) }
func (p *FIDs) ListXattr(n *Node) ([]string, error)           { return p.c.Nodes().ListXattr(n) }
func (p *FIDs) SetXattr(n *Node, name string, val []byte, flags uint32) (node.Status, error) {
	return p.c.Nodes().SetXattr(n, name, val, flags)
}
func (p *FIDs) RemoveXattr(n *Node, name string) (node.Status, error) {
	return p.c.Nodes().RemoveXattr(n, name)
}
