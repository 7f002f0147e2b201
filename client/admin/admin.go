// Package admin is the cell's administration as a client sees it:
// volumes, their sites and quotas, locations and servers, moves and
// releases, ACLs, groups, users and tokens. A program that reads and
// writes files needs none of it; client.Client.Admin is the way in.
package admin

import (
	"context"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/site"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Admin is the cell's administration through a client's sites, as the
// client's own user.
type Admin struct {
	sites *site.Sites
	self  string // the client's own user's token
	tree  Namespace
}

// A Namespace is what the administration needs of the client's tree.
type Namespace interface {
	// Resolve is the FID of path name (an ACL is a directory's).
	Resolve(name string) (node.FID, error)
	// Writable is the FID of path name where it can be changed: in a
	// volume's read-only copy, the same file of the read-write volume,
	// whose name it returns ("" otherwise).
	Writable(name string) (node.FID, string, error)
	// MountPoint makes name a mount point for volume, in the read-write
	// volume if name's directory is in a copy (Writable).
	MountPoint(name, volume string) error
}

// New is the administration of the cell sites reach, as the user of
// token self, in tree.
func New(sites *site.Sites, self string, tree Namespace) Admin {
	return Admin{sites: sites, self: self, tree: tree}
}

// MountVolume makes name a mount point for volume: the volume's root
// appears there, and the tree spans volumes as in AFS. In a volume's
// read-only copy (a replicated root, as AFS's root.afs) it is made in
// the read-write volume, and reaches readers at its next release:
// CopyOf says so.
func (adm Admin) MountVolume(name, volume string) error { return adm.tree.MountPoint(name, volume) }

// CopyOf names the volume whose read-only copy holds path name, or ""
// when name is not in a copy: what the administration changes there
// (MountVolume, SetACL) is changed in that volume, and readers of the
// copy see it after its next release.
func (adm Admin) CopyOf(name string) (string, error) {
	_, rw, err := adm.tree.Writable(name)
	return rw, err
}

// ACLOf reads the ACL governing f, at the server holding its volume.
func (adm Admin) ACLOf(f node.FID) (ACL, error) {
	s, err := adm.sites.OfID(f.Volume, adm.self)
	if err != nil {
		return ACL{}, err
	}
	var r *pb.ACLReply
	err = s.Conn.Call(func(ctx context.Context) (err error) {
		r, err = s.RPC.GetACL(ctx, &pb.GetACLRequest{Fid: pb.FromFID(f)})
		return err
	})
	if err != nil {
		return ACL{}, err
	}
	return toACL(r), nil
}

// SetACLOf gives who the rights r in directory dir, at the server
// holding its volume.
func (adm Admin) SetACLOf(dir node.FID, who string, r access.Rights) (ACL, error) {
	s, err := adm.sites.OfID(dir.Volume, adm.self)
	if err != nil {
		return ACL{}, err
	}
	var out *pb.ACLReply
	err = s.Conn.Call(func(ctx context.Context) (err error) {
		out, err = s.RPC.SetACL(ctx, &pb.SetACLRequest{Dir: pb.FromFID(dir), Who: who, Rights: uint32(r)})
		return err
	})
	if err != nil {
		return ACL{}, err
	}
	return toACL(out), nil
}
