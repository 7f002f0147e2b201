package client

import (
	"bytes"
	"context"
	"github.com/hoardfs/hoard/client/user"
	"slices"
	"syscall"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/client/site"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Extended attributes of the user namespace live at the server with the
// file (vnode's xattr.go). What the server answers is kept with the node
// under the promise held, as the users' rights are (user.go): a change
// to them moves the file's ctime and breaks the promises on it, so a
// reply learnt while the promise holds stays true until it breaks. A
// tool reading them once a file (cp -a, rsync -X, tar --xattrs) asks the
// server once a file, then never while the promise holds. The mount asks
// only for user.* names, so the kernel's own (security.capability, asked
// at every write) cost no round trip either.

// xattrs are what a node's server said of its extended attributes.
type xattrs struct {
	// names is the list, when listed is set.
	names  []string
	listed bool
	// vals are values by name; a nil value: none of that name (ENODATA).
	vals map[string][]byte
}

// maxKeptXattr bounds a value kept with a node: larger ones (up to
// node.MaxXattrValue) are asked for each time.
const maxKeptXattr = 4 << 10

// xattr makes one Xattr request for n at its server, as u, and learns the
// status a change returns; a GET's or LIST's answer is kept under the
// promise held (keepXattr).
func (c *Client) xattr(n *Node, req *pb.XattrRequest, u user.User) (*pb.XattrReply, error) {
	var reply *pb.XattrReply
	err := n.onServer(false, func(at *site.Site) error {
		if err := c.checkToken(u); err != nil {
			return err
		}
		if err := c.settleFor(n); err != nil {
			return err
		}
		req.Fid = pb.FromFID(n.fid)
		n.mu.Lock()
		changes := n.xattrChanges
		n.mu.Unlock()
		t := at.Begin()
		defer t.End()
		err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
			reply, err = at.RPC.Xattr(ctx, req)
			return err
		})
		switch {
		case req.Op == pb.XattrOp_XATTR_GET && (err == nil || pb.Errno(err) == syscall.ENODATA):
			c.keepXattr(t, n, changes, func(x *xattrs) {
				if v := reply.GetValue(); err != nil || len(v) <= maxKeptXattr {
					x.vals[req.Name] = keptValue(v, err == nil)
				}
			})
		case req.Op == pb.XattrOp_XATTR_LIST && err == nil:
			c.keepXattr(t, n, changes, func(x *xattrs) { x.names, x.listed = slices.Clone(reply.Names), true })
		case err == nil:
			n.mu.Lock()
			n.xattrs = nil // changed here: the status learnt next moves ctime
			n.xattrChanges++
			n.mu.Unlock()
			if reply.Status != nil {
				_, err = c.learnPB(t, reply.Status, u)
			}
		}
		return err
	})
	return reply, err
}

// keptValue is a GET's answer as xattrs keeps it: never nil when found.
func keptValue(v []byte, found bool) []byte {
	if !found {
		return nil
	}
	return append([]byte{}, v...)
}

// keepXattr records what a reply on ticket t said of n's attributes
// (with), if n's promise, from t's site, held throughout the request (no
// break of it came in between) and this client changed none of them
// since the request began (changes: xattrChanges then; the server breaks
// no promise of the client that made a change).
func (c *Client) keepXattr(t site.Ticket, n *Node, changes uint64, with func(*xattrs)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t.At.Table(func(cb *callback.Client) {
		if !n.valid.Load() || n.at() != t.At || n.xattrChanges != changes || !cb.Intact(t.T, n.fid) {
			return
		}
		if n.xattrs == nil {
			n.xattrs = &xattrs{vals: map[string][]byte{}}
		}
		with(n.xattrs)
	})
}

// keptXattrs calls with n's kept attributes when u may be answered from
// them: a promise held, and u's rights known to allow reading them.
func (c *Client) keptXattrs(n *Node, u user.User, with func(*xattrs) bool) bool {
	st, ok := c.cachedAs(n, u)
	need := access.Read
	if st.Type == node.TypeDir {
		need = access.Lookup
	}
	if !ok || st.Rights&node.RightsKnown == 0 || !allows(st, need) {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.xattrs != nil && with(n.xattrs)
}

// GetXattr is the value of n's extended attribute name (ENODATA: none).
func (k *Nodes) GetXattr(n *Node, name string) ([]byte, error) {
	var v []byte
	var found bool
	if k.c.keptXattrs(n, k.u, func(x *xattrs) bool {
		kept, ok := x.vals[name]
		switch {
		case ok:
			v, found = bytes.Clone(kept), kept != nil
		case x.listed && !slices.Contains(x.names, name):
		default:
			return false
		}
		return true
	}) {
		if !found {
			return nil, syscall.ENODATA
		}
		return v, nil
	}
	r, err := k.c.xattr(n, &pb.XattrRequest{Op: pb.XattrOp_XATTR_GET, Name: name}, k.u)
	if err != nil {
		return nil, err
	}
	return r.Value, nil
}

// ListXattr lists n's extended attribute names.
func (k *Nodes) ListXattr(n *Node) ([]string, error) {
	var names []string
	if k.c.keptXattrs(n, k.u, func(x *xattrs) bool { names = slices.Clone(x.names); return x.listed }) {
		return names, nil
	}
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
