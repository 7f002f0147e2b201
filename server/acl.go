package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/principal"
)

// The access-control RPCs: who am I, ACLs, groups, revoked tokens.

// WhoAmI says whom the request's token makes its caller.
func (s *Server) WhoAmI(ctx context.Context, req *pb.WhoAmIRequest) (*pb.WhoAmIReply, error) {
	who, err := s.identify(ctx)
	if err != nil {
		return nil, err
	}
	out := &pb.WhoAmIReply{User: who.User, Uid: who.UID, Admin: who.Admin, Groups: who.Groups, Id: uint32(who.ID)}
	for _, g := range who.GroupIDs {
		out.GroupIds = append(out.GroupIds, uint32(g))
	}
	return out, nil
}

// fromACL is a's reply, its entries named from the registry (a proxy's
// come named from its origin).
func (s *Server) fromACL(dir node.FID, a access.ACL, mine access.Rights) *pb.ACLReply {
	out := &pb.ACLReply{Dir: pb.FromFID(dir), Rights: uint32(mine)}
	for _, e := range a {
		if e.Who == "" && s.cfg.Principals != nil {
			e.Who = s.cfg.Principals.Name(e.ID)
		}
		out.Entries = append(out.Entries, &pb.ACLEntry{Who: e.Who, Id: uint32(e.ID), Rights: uint32(e.Rights)})
	}
	return out
}

// principal is the ACL entry name refers to: a user or group of the
// registry, or "#N", a principal that no longer exists (to remove its
// entries). A proxy passes the name on.
func (s *Server) principal(name string) (access.Entry, error) {
	reg := s.cfg.Principals
	if reg == nil {
		return access.Entry{Who: name}, access.CheckName(name)
	}
	if n, ok := strings.CutPrefix(name, "#"); ok {
		id, err := strconv.ParseUint(n, 10, 32)
		if err != nil || id == 0 {
			return access.Entry{}, fmt.Errorf("%q: want a name, or #N for a principal's number: %w", name, syscall.EINVAL)
		}
		return access.Entry{ID: access.ID(id), Who: name}, nil
	}
	if err := access.CheckName(name); err != nil {
		return access.Entry{}, err
	}
	p, ok := reg.Lookup(name)
	if !ok {
		return access.Entry{}, fmt.Errorf("no user or group named %q in the cell's registry (a user is registered by the first use of their token, or by hoard user create): %w", name, syscall.ENOENT)
	}
	return access.Entry{ID: p.ID, Who: p.Name}, nil
}

// GetACL reads the ACL governing a file or directory: anyone who may look
// in that directory may read it, as in AFS.
func (s *Server) GetACL(ctx context.Context, req *pb.GetACLRequest) (*pb.ACLReply, error) {
	o, f, err := s.beginOn(ctx, "GetACL", req.Fid)
	if err != nil {
		return nil, err
	}
	dir, acl, err := s.store.GoverningACL(f)
	if err != nil {
		return nil, s.fail("GetACL", err)
	}
	if err := o.may(dir, access.Lookup, "read the ACL"); err != nil {
		return nil, err
	}
	r, err := o.aclRights(dir, acl)
	if err != nil {
		return nil, s.fail("GetACL", err)
	}
	return s.fromACL(dir, acl, r), nil
}

// aclRights is what the caller may do in dir, whose ACL is acl, with a
// directory owner's implicit rights.
func (o *op) aclRights(dir node.FID, acl access.ACL) (access.Rights, error) {
	st, err := o.s.store.GetStatus(dir)
	if err != nil {
		return 0, err
	}
	return access.Effective(o.who, acl.Of(o.who), access.Object{Dir: true, Mode: st.Mode, UID: st.UID}), nil
}

// SetACL changes one entry of a directory's ACL (a right it needs is a).
// The rights of every file governed by it change with it: the promises
// on the directory and on its entries are broken before the reply, so no
// client serves a user cached bytes under rights that are gone.
func (s *Server) SetACL(ctx context.Context, req *pb.SetACLRequest) (*pb.ACLReply, error) {
	dir, err := checkFID("set acl", req.Dir)
	if err != nil {
		return nil, s.fail("SetACL", err)
	}
	who, err := s.principal(req.Who)
	if err != nil {
		return nil, s.fail("SetACL", err)
	}
	if req.Rights&^uint32(access.All) != 0 {
		return nil, s.fail("SetACL", fmt.Errorf("set acl: rights %#x: %w", req.Rights, syscall.EINVAL))
	}
	var acl access.ACL
	o, err := s.change(ctx, change{hold: []node.FID{dir}, check: func(o *op) error {
		return o.may(dir, access.Administer, "change the ACL")
	}, store: func(o *op) (_ []node.FID, err error) {
		if acl, err = s.store.SetACLEntry(dir, who, access.Rights(req.Rights)); err != nil {
			return nil, s.fail("SetACL", err)
		}
		return s.governed(dir)
	}})
	if err != nil {
		return nil, err
	}
	s.log.Info("acl changed", "dir", dir, "who", req.Who, "rights", access.Rights(req.Rights), "by", o.who)
	r, err := o.aclRights(dir, acl)
	if err != nil {
		return nil, s.fail("SetACL", err)
	}
	return s.fromACL(dir, acl, r), nil
}

// governed is dir and its entries: what an ACL change of dir changes the
// rights on.
func (s *Server) governed(dir node.FID) ([]node.FID, error) {
	fids := []node.FID{dir}
	for cookie, eof := uint64(0), false; !eof; {
		var ents []node.DirEntry
		var err error
		if ents, eof, _, err = s.store.ReadDir(dir, cookie, 4096); err != nil {
			return nil, s.fail("SetACL", err)
		}
		for _, e := range ents {
			fids = append(fids, e.FID)
			cookie = e.Cookie
		}
		if len(ents) == 0 {
			break
		}
	}
	return fids, nil
}

// ChangeGroup creates or deletes a group, or changes its members: any
// user may create groups named after themselves (owner:name), admins
// any; a group's owner or an admin changes it (AFS's pts). Admins also
// register users ahead of their tokens' first use.
func (s *Server) ChangeGroup(ctx context.Context, req *pb.ChangeGroupRequest) (*pb.ChangeGroupReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if o.who.Anonymous() {
		return nil, refuse(o.who, "change groups", syscall.EACCES)
	}
	reg := s.cfg.Principals
	if reg == nil {
		return nil, s.fail("ChangeGroup", fmt.Errorf("groups: change them at a file server of the cell: %w", syscall.ENOTSUP))
	}
	by := principal.Caller{ID: o.who.ID, Name: o.who.User, Admin: o.who.Admin}
	switch req.Change {
	case pb.ChangeGroupRequest_CHANGE_CREATE:
		err = reg.CreateGroup(ctx, by, req.Group)
	case pb.ChangeGroupRequest_CHANGE_DELETE:
		err = reg.DeleteGroup(ctx, by, req.Group)
	case pb.ChangeGroupRequest_CHANGE_ADD, pb.ChangeGroupRequest_CHANGE_REMOVE:
		err = reg.SetMember(ctx, by, req.Group, req.Member, req.Change == pb.ChangeGroupRequest_CHANGE_ADD)
	case pb.ChangeGroupRequest_CHANGE_CREATE_USER:
		if err = o.admin("register users"); err != nil {
			return nil, err
		}
		_, err = reg.Create(ctx, req.Group, req.Uid)
	default:
		err = fmt.Errorf("change group: unknown change %d: %w", req.Change, syscall.EINVAL)
	}
	if err != nil {
		return nil, s.fail("ChangeGroup", err)
	}
	s.log.Info("principals changed", "name", req.Group, "change", req.Change, "member", req.Member, "by", o.who)
	return &pb.ChangeGroupReply{}, nil
}

// ListGroups lists the groups and their members, for any user; and the
// users with their uids, for admins.
func (s *Server) ListGroups(ctx context.Context, req *pb.ListGroupsRequest) (*pb.ListGroupsReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if o.who.Anonymous() {
		return nil, refuse(o.who, "list groups", syscall.EACCES)
	}
	reg := s.cfg.Principals
	if reg == nil {
		return &pb.ListGroupsReply{}, nil
	}
	out := &pb.ListGroupsReply{}
	for _, g := range reg.All(principal.Group) {
		pg := &pb.Group{Name: g.Name, Owner: reg.Name(g.Owner)}
		for _, m := range g.Members {
			pg.Members = append(pg.Members, reg.Name(m))
		}
		out.Groups = append(out.Groups, pg)
	}
	if o.who.Admin {
		for _, u := range reg.All(principal.User) {
			out.Users = append(out.Users, &pb.User{Name: u.Name, Id: uint32(u.ID), Uid: u.UID})
		}
	}
	return out, nil
}

// maxTokenLife is the longest a revocation is kept when the token's own
// expiry is not given: longer than any token the cell issues lives.
const maxTokenLife = 10 * 366 * 24 * time.Hour

// RevokeToken refuses a token from now on (admins only).
func (s *Server) RevokeToken(ctx context.Context, req *pb.RevokeTokenRequest) (*pb.RevokeTokenReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := o.admin("revoke tokens"); err != nil {
		return nil, err
	}
	if s.cfg.Principals == nil {
		return nil, s.fail("RevokeToken", fmt.Errorf("revoke: this server keeps no revocations: %w", syscall.ENOTSUP))
	}
	until := time.Now().Add(maxTokenLife)
	if req.ExpiresNs > 0 {
		until = time.Unix(0, req.ExpiresNs)
	}
	if err := s.cfg.Principals.Revoke(ctx, req.Id, until); err != nil {
		return nil, s.fail("RevokeToken", err)
	}
	s.log.Info("token revoked", "id", req.Id, "by", o.who)
	return &pb.RevokeTokenReply{}, nil
}
