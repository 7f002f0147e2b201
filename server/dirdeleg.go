package server

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/vnode"
)

// Directory delegations. A client holding a write delegation on a
// directory makes files in it on its own: it names them with FIDs it
// reserved and tells the server later (CreateReserved), before it returns
// the delegation. Anybody else's request that reads or changes the
// directory recalls it first (recallFor on the directory in Lookup,
// ReadDir, GetStatus and the namespace changes), so nobody sees the
// directory without those files. Which directories are delegated, and
// when, is the callback machine's to decide (callback.DirDelegable).

// settledAlready reports whether every file of fs is in dir under its FID
// and no name of rm names its FID: an earlier attempt settled them, and
// its reply was lost (a restart in between: the delegation it named is
// gone, and the directory's version is past the base the retry names).
func (s *Server) settledAlready(dir node.FID, fs []node.Reserved, rm []node.Removed) bool {
	for _, f := range fs {
		if st, _, err := s.store.Lookup(dir, f.Name); err != nil || st.FID != f.FID {
			return false
		}
	}
	for _, f := range rm {
		if st, _, err := s.store.Lookup(dir, f.Name); err == nil && st.FID == f.FID {
			return false
		}
	}
	return true
}

// MaxReservedPerSession bounds the FIDs one session holds reserved and not
// yet used: a client making files faster than it settles them (a copy of
// a large flat directory within the write-back window) holds many; past
// the bound it creates them at the server.
const MaxReservedPerSession = 1 << 18

// MaxReservedPerUser bounds the FIDs one user holds reserved and not yet
// used, across sessions, in this server life: a sixteenth of the default
// bound in all, so that no one user takes every directory delegation's.
const MaxReservedPerUser = 1 << 18

// unreserved counts n reserved FIDs of id's, for user, as used (or never
// given).
func (s *Server) unreserved(id callback.ClientID, user string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reserved[id] -= n; s.reserved[id] <= 0 {
		delete(s.reserved, id)
	}
	if s.reservedBy[user] -= n; s.reservedBy[user] <= 0 {
		delete(s.reservedBy, user)
	}
	s.reservedAll = max(0, s.reservedAll-n)
}

// Reserve sets FIDs aside for files the caller will make under a
// directory delegation.
func (s *Server) Reserve(ctx context.Context, req *pb.ReserveRequest) (*pb.ReserveReply, error) {
	if req.Count == 0 || req.Count > vnode.MaxReserve {
		return nil, s.fail("Reserve", fmt.Errorf("reserve %d fids, want 1..%d: %w", req.Count, vnode.MaxReserve, syscall.EINVAL))
	}
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if o.id == 0 {
		return nil, s.fail("Reserve", fmt.Errorf("reserve: only for a connected client: %w", syscall.EINVAL))
	}
	if o.who.Anonymous() {
		return nil, refuse(o.who, "reserve file ids", syscall.EACCES)
	}
	dir, err := checkFID("reserve", req.Dir)
	if err != nil {
		return nil, s.fail("Reserve", err)
	}
	if dir.Volume != req.Volume {
		return nil, s.fail("Reserve", fmt.Errorf("reserve in volume %d for directory %v of another: %w", req.Volume, dir, syscall.EXDEV))
	}
	if err := o.may(dir, access.Insert, "reserve file ids for a directory"); err != nil {
		return nil, err
	}
	user := o.who.User
	s.mu.Lock()
	if s.reserved[o.id]+int(req.Count) > MaxReservedPerSession {
		s.mu.Unlock()
		return nil, status.Errorf(codes.ResourceExhausted, "reserve: %d fids reserved and not used by this client, the most it may hold", s.reserved[o.id])
	}
	if s.reservedBy[user]+int(req.Count) > MaxReservedPerUser {
		s.mu.Unlock()
		return nil, status.Errorf(codes.ResourceExhausted, "reserve: %d fids reserved and not used by %s, the most one user may hold", s.reservedBy[user], user)
	}
	if n := s.cfg.MaxReserved; n > 0 && s.reservedAll+int(req.Count) > n {
		s.mu.Unlock()
		return nil, status.Errorf(codes.ResourceExhausted, "reserve: %d fids reserved and not used on this server, the most it keeps", s.reservedAll)
	}
	s.reserved[o.id] += int(req.Count)
	s.reservedBy[user] += int(req.Count)
	s.reservedAll += int(req.Count)
	s.mu.Unlock()
	fids, err := s.store.Reserve(req.Volume, int(req.Count))
	if err != nil {
		s.unreserved(o.id, user, int(req.Count))
		return nil, s.fail("Reserve", err)
	}
	out := &pb.ReserveReply{Fids: make([]*pb.FID, len(fids))}
	for i, f := range fids {
		out.Fids[i] = pb.FromFID(f)
	}
	return out, nil
}

// CreateReserved makes the files a client made under its delegation on a
// directory, and removes those it removed there, all or none, and gives
// it a write delegation on each file made: their data is still in its
// cache. Made after the delegation was lost, they are refused
// (EKEYEXPIRED), unless this is the reclaim after a restart, in the grace
// period, with the directory unchanged since.
func (s *Server) CreateReserved(ctx context.Context, req *pb.CreateReservedRequest) (*pb.CreateReservedReply, error) {
	dir, err := checkFID("create reserved", req.Dir)
	if err != nil {
		return nil, s.fail("CreateReserved", err)
	}
	if n := len(req.Files) + len(req.Removed); n == 0 || n > vnode.MaxReserve {
		return nil, s.fail("CreateReserved", fmt.Errorf("settle %d files, want 1..%d: %w", n, vnode.MaxReserve, syscall.EINVAL))
	}
	fs := make([]node.Reserved, len(req.Files))
	for i, f := range req.Files {
		fid, err := checkFID("create reserved", f.Fid)
		if err != nil {
			return nil, s.fail("CreateReserved", err)
		}
		fs[i] = node.Reserved{Name: f.Name, FID: fid, Attr: node.Attr{Mode: f.Mode, UID: f.Uid, GID: f.Gid}, Mtime: time.Unix(0, f.MtimeNs)}
	}
	rm := make([]node.Removed, len(req.Removed))
	gone := make([]node.FID, len(req.Removed))
	for i, f := range req.Removed {
		fid, err := checkFID("remove reserved", f.Fid)
		if err != nil {
			return nil, s.fail("CreateReserved", err)
		}
		rm[i], gone[i] = node.Removed{Name: f.Name, FID: fid}, fid
	}
	o, err := s.beginChange(ctx, callback.Reclaiming)
	if err != nil {
		return nil, err
	}
	leave, err := s.enter(dir.Volume)
	if err != nil {
		return nil, err
	}
	defer leave()
	if len(rm) > 0 {
		if err := o.may(dir, access.Delete, "remove files"); err != nil {
			return nil, err
		}
	}
	if len(fs) > 0 {
		if err := o.may(dir, access.Insert, "create files"); err != nil {
			return nil, err
		}
	}
	for i := range fs {
		if err := o.own(fs[i].Name, node.TypeFile, &fs[i].Attr); err != nil {
			return nil, err
		}
	}
	if o.id == 0 || req.State == 0 {
		return nil, s.fail("CreateReserved", fmt.Errorf("create reserved in %v: no delegation named: %w", dir, syscall.EINVAL))
	}
	took, err := s.checkDelegation(o, dir, req.State, req.BaseVersion)
	if err != nil && !s.settledAlready(dir, fs, rm) {
		return nil, s.fail("CreateReserved", err)
	}
	if took {
		defer s.giveBackFor(o, dir, req.State)
	}
	out := &pb.CreateReservedReply{}
	var d node.Status
	// As for Remove: other clients' delegations on the files removed go
	// first (the remover held a write delegation on each when it removed
	// it; one recalled since may have let another client in).
	err = o.make(ctx, change{hold: gone, store: func(o *op) (_ []node.FID, err error) {
		d, err = s.settle(o, dir, fs, rm, out)
		return append(gone, dir), err
	}})
	if err != nil {
		return nil, err
	}
	out.Dir = o.status(d)
	return out, nil
}

// settle makes the files of fs in dir and removes those of rm, for
// CreateReserved, and fills in out but for the directory's status.
func (s *Server) settle(o *op, dir node.FID, fs []node.Reserved, rm []node.Removed, out *pb.CreateReservedReply) (node.Status, error) {
	sts, rsts, d, err := s.store.CreateReserved(dir, fs, rm, o.once)
	if err != nil {
		return d, s.fail("CreateReserved", err)
	}
	s.unreserved(o.id, o.who.User, len(fs))
	out.Files, out.States, out.Removed = make([]*pb.Status, len(sts)), make([]uint64, len(sts)), make([]*pb.Status, len(rsts))
	now := time.Now()
	s.mu.Lock()
	for i, st := range sts {
		// Nobody else knows these files yet: a grant, never a wait.
		if res, _ := s.cb.OpenWith(o.id, st.FID, callback.Opening{Write: true, Limit: callback.DelegWrite, Only: true}, now); res.Kind == callback.DelegWrite {
			out.States[i] = res.State
		}
	}
	s.mu.Unlock()
	for i, st := range sts {
		out.Files[i] = o.status(st)
	}
	for i, st := range rsts {
		s.gone(st)
		out.Removed[i] = pb.FromStatus(st, 0)
	}
	return d, nil
}
