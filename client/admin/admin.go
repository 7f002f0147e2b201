// Package admin is the cell's administration as a client sees it:
// volumes, their sites and quotas, locations and servers, moves and
// releases, ACLs, groups, users and tokens. A program that reads and
// writes files needs none of it; client.Client.Admin is the way in, and
// pathfs.FS.Admin for the changes that name a path.
package admin

import (
	"context"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/site"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Admin is the cell's administration through a client's sites, as the
// client's own user. What names a path in the cell (mount points, a
// directory's ACL) is pathfs.Admin's.
type Admin struct {
	sites *site.Sites
	self  string // the client's own user's token
}

// New is the administration of the cell sites reach, as the user of
// token self.
func New(sites *site.Sites, self string) Admin { return Admin{sites: sites, self: self} }

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
