package admin

import (
	"context"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/site"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Access control: who the client's token makes it, ACLs, groups and
// revoked tokens, all decided by the server.

// WhoAmI is whom the server takes this client's requests to come from.
func (adm Admin) WhoAmI() (access.Identity, error) {
	id, err := adm.WhoIs(adm.self)
	return id, site.ErrTold("whoami", "", err)
}

// WhoIs is whom the server takes the bearer of token to be.
func (adm Admin) WhoIs(token string) (access.Identity, error) {
	var r *pb.WhoAmIReply
	err := adm.sites.First().Conn.As(token).Call(func(ctx context.Context) (err error) {
		r, err = adm.sites.First().RPC.WhoAmI(ctx, &pb.WhoAmIRequest{})
		return err
	})
	if err != nil {
		return access.Identity{}, err
	}
	id := access.Identity{User: r.User, ID: access.ID(r.Id), UID: r.Uid, Admin: r.Admin, Groups: r.Groups}
	for _, g := range r.GroupIds {
		id.GroupIDs = append(id.GroupIDs, access.ID(g))
	}
	return id, nil
}

// ACL is the access control list governing a file or directory.
type ACL struct {
	// Dir is the directory whose list it is (a file's own directory).
	Dir node.FID
	// Entries are its entries; Mine the caller's own rights there.
	Entries access.ACL
	Mine    access.Rights
}

func toACL(r *pb.ACLReply) ACL {
	a := ACL{Dir: r.Dir.ToFID(), Mine: access.Rights(r.Rights)}
	for _, e := range r.Entries {
		a.Entries = append(a.Entries, access.Entry{ID: access.ID(e.Id), Who: e.Who, Rights: access.Rights(e.Rights)})
	}
	return a
}

// GroupChange is what ChangeGroup does.
type GroupChange = pb.ChangeGroupRequest_Change

// Group changes, as ChangeGroup names them.
const (
	GroupCreate = pb.ChangeGroupRequest_CHANGE_CREATE
	GroupDelete = pb.ChangeGroupRequest_CHANGE_DELETE
	GroupAdd    = pb.ChangeGroupRequest_CHANGE_ADD
	GroupRemove = pb.ChangeGroupRequest_CHANGE_REMOVE
)

// CreateUser registers user name with uid in the cell's registry, ahead
// of their token's first use (admins only).
func (adm Admin) CreateUser(name string, uid uint32) error {
	err := adm.sites.First().Conn.Call(func(ctx context.Context) error {
		_, err := adm.sites.First().RPC.ChangeGroup(ctx, &pb.ChangeGroupRequest{Change: pb.ChangeGroupRequest_CHANGE_CREATE_USER, Group: name, Uid: uid})
		return err
	})
	return site.ErrTold("user", name, err)
}

// ChangeGroup creates or deletes group, or adds or removes member.
func (adm Admin) ChangeGroup(change GroupChange, group, member string) error {
	err := adm.sites.First().Conn.Call(func(ctx context.Context) error {
		_, err := adm.sites.First().RPC.ChangeGroup(ctx, &pb.ChangeGroupRequest{Change: change, Group: group, Member: member})
		return err
	})
	return site.ErrTold("group", group, err)
}

// Group is a protection group and its members.
type Group struct {
	Name, Owner string
	Members     []string
}

// Principal is a user of the cell's registry.
type Principal struct {
	Name string
	ID   access.ID
	UID  uint32
}

// Groups lists the cell's groups, and to an admin its users.
func (adm Admin) Groups() ([]Group, []Principal, error) {
	var r *pb.ListGroupsReply
	err := adm.sites.First().Conn.Call(func(ctx context.Context) (err error) {
		r, err = adm.sites.First().RPC.ListGroups(ctx, &pb.ListGroupsRequest{})
		return err
	})
	if err != nil {
		return nil, nil, site.ErrTold("groups", "", err)
	}
	gs := make([]Group, len(r.Groups))
	for i, g := range r.Groups {
		gs[i] = Group{Name: g.Name, Owner: g.Owner, Members: g.Members}
	}
	us := make([]Principal, len(r.Users))
	for i, u := range r.Users {
		us[i] = Principal{Name: u.Name, ID: access.ID(u.Id), UID: u.Uid}
	}
	return gs, us, nil
}

// RevokeToken has the server refuse the token id from now on; expires is
// when it lapses anyway (zero: unknown).
func (adm Admin) RevokeToken(id string, expires time.Time) error {
	var ns int64
	if !expires.IsZero() {
		ns = expires.UnixNano()
	}
	err := adm.sites.First().Conn.Call(func(ctx context.Context) error {
		_, err := adm.sites.First().RPC.RevokeToken(ctx, &pb.RevokeTokenRequest{Id: id, ExpiresNs: ns})
		return err
	})
	return site.ErrTold("revoke token", id, err)
}
