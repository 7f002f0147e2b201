package server

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// The access-control RPCs: who am I, ACLs, groups, revoked tokens.

// WhoAmI says whom the request's token makes its caller.
func (s *Server) WhoAmI(ctx context.Context, req *pb.WhoAmIRequest) (*pb.WhoAmIReply, error) {
	who, err := s.identify(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.WhoAmIReply{User: who.User, Uid: who.UID, Admin: who.Admin, Groups: who.Groups}, nil
}

func fromACL(dir node.FID, a access.ACL, mine access.Rights) *pb.ACLReply {
	out := &pb.ACLReply{Dir: pb.FromFID(dir), Rights: uint32(mine)}
	for _, e := range a {
		out.Entries = append(out.Entries, &pb.ACLEntry{Who: e.Who, Rights: uint32(e.Rights)})
	}
	return out
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
	return fromACL(dir, acl, r), nil
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
	if err := access.CheckName(req.Who); err != nil {
		return nil, s.fail("SetACL", fmt.Errorf("set acl: %v: %w", err, syscall.EINVAL))
	}
	if req.Rights&^uint32(access.All) != 0 {
		return nil, s.fail("SetACL", fmt.Errorf("set acl: rights %#x: %w", req.Rights, syscall.EINVAL))
	}
	var acl access.ACL
	o, err := s.change(ctx, change{hold: []node.FID{dir}, check: func(o *op) error {
		return o.may(dir, access.Administer, "change the ACL")
	}, store: func(o *op) (_ []node.FID, err error) {
		if acl, err = s.store.SetACLEntry(dir, req.Who, access.Rights(req.Rights)); err != nil {
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
	return fromACL(dir, acl, r), nil
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
// user may create one, and its owner or an admin changes it (AFS's pts).
func (s *Server) ChangeGroup(ctx context.Context, req *pb.ChangeGroupRequest) (*pb.ChangeGroupReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if o.who.Anonymous() {
		return nil, refuse(o.who, "change groups", syscall.EACCES)
	}
	if s.cfg.Principals == nil {
		return nil, s.fail("ChangeGroup", fmt.Errorf("groups: this server keeps none: %w", syscall.ENOTSUP))
	}
	p := s.cfg.Principals
	if req.Change != pb.ChangeGroupRequest_CHANGE_CREATE {
		g, err := p.Group(req.Group)
		if err != nil {
			return nil, s.fail("ChangeGroup", err)
		}
		if g.Owner != o.who.User && !o.who.Admin {
			return nil, refuse(o.who, "change group "+req.Group+" of "+g.Owner, syscall.EPERM)
		}
	}
	switch req.Change {
	case pb.ChangeGroupRequest_CHANGE_CREATE:
		err = p.CreateGroup(req.Group, o.who.User)
	case pb.ChangeGroupRequest_CHANGE_DELETE:
		err = p.DeleteGroup(req.Group)
	case pb.ChangeGroupRequest_CHANGE_ADD:
		err = p.AddMember(req.Group, req.Member)
	case pb.ChangeGroupRequest_CHANGE_REMOVE:
		err = p.RemoveMember(req.Group, req.Member)
	default:
		err = fmt.Errorf("change group: unknown change %d: %w", req.Change, syscall.EINVAL)
	}
	if err != nil {
		return nil, s.fail("ChangeGroup", err)
	}
	s.users.forget()
	s.log.Info("group changed", "group", req.Group, "change", req.Change, "member", req.Member, "by", o.who)
	return &pb.ChangeGroupReply{}, nil
}

// ListGroups lists the groups and their members, for any user.
func (s *Server) ListGroups(ctx context.Context, req *pb.ListGroupsRequest) (*pb.ListGroupsReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if o.who.Anonymous() {
		return nil, refuse(o.who, "list groups", syscall.EACCES)
	}
	if s.cfg.Principals == nil {
		return &pb.ListGroupsReply{}, nil
	}
	gs, err := s.cfg.Principals.Groups()
	if err != nil {
		return nil, s.fail("ListGroups", err)
	}
	out := &pb.ListGroupsReply{}
	for _, g := range gs {
		out.Groups = append(out.Groups, &pb.Group{Name: g.Name, Owner: g.Owner, Members: g.Members})
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
	if req.Id == "" || len(req.Id) > 64 {
		return nil, s.fail("RevokeToken", fmt.Errorf("revoke: token id of %d bytes: %w", len(req.Id), syscall.EINVAL))
	}
	if s.cfg.Principals == nil {
		return nil, s.fail("RevokeToken", fmt.Errorf("revoke: this server keeps no revocations: %w", syscall.ENOTSUP))
	}
	until := time.Now().Add(maxTokenLife)
	if req.ExpiresNs > 0 {
		until = time.Unix(0, req.ExpiresNs)
	}
	if err := s.cfg.Principals.Revoke(req.Id, until); err != nil {
		return nil, s.fail("RevokeToken", err)
	}
	s.users.forget()
	s.log.Info("token revoked", "id", req.Id, "by", o.who)
	return &pb.RevokeTokenReply{}, nil
}
