package server

import (
	"context"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server/stage"
	"github.com/hoardfs/hoard/vnode"
)

// Limits on what one request may ask for.
const (
	maxBulkStatus = 4096
	maxPiece      = 1 << 20
	defaultPiece  = 256 << 10
	// minPiece: a fetch asking for pieces of a few bytes would cost the
	// server a reply per few bytes of a large file.
	minPiece = 4 << 10
)

func fromVolume(v node.Volume) *pb.Volume {
	return &pb.Volume{Id: v.ID, Name: v.Name, Root: pb.FromFID(v.Root), CreatedNs: v.Created.UnixNano(), Quota: v.Quota, Used: v.Used, Files: v.Files}
}

// GetVolume, ListVolumes and StatFS tell of a volume only those who may
// look in its root directory.
func (s *Server) GetVolume(ctx context.Context, req *pb.GetVolumeRequest) (*pb.Volume, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if (req.Name == "") == (req.Id == 0) {
		return nil, s.fail("GetVolume", fmt.Errorf("get volume: give exactly one of name and id: %w", syscall.EINVAL))
	}
	v, err := s.localVolume(req.Name, req.Id)
	if err != nil {
		return nil, s.fail("GetVolume", err)
	}
	if err := o.may(v.Root, access.Lookup, "look up volume "+v.Name); err != nil {
		return nil, err
	}
	return fromVolume(v), nil
}

func (s *Server) ListVolumes(ctx context.Context, req *pb.ListVolumesRequest) (*pb.ListVolumesReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	vs, err := s.store.Volumes()
	if err != nil {
		return nil, s.fail("ListVolumes", err)
	}
	out := &pb.ListVolumesReply{}
	for _, v := range vs {
		if o.may(v.Root, access.Lookup, "") == nil {
			out.Volumes = append(out.Volumes, fromVolume(v))
		}
	}
	return out, nil
}

func (s *Server) CreateVolume(ctx context.Context, req *pb.CreateVolumeRequest) (*pb.Volume, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := o.admin("create volume " + req.Name); err != nil {
		return nil, err
	}
	var v node.Volume
	if s.cfg.Cell != nil {
		v, err = s.createInCell(ctx, req)
	} else {
		v, err = s.store.CreateVolume(req.Name)
	}
	if err != nil {
		return nil, s.fail("CreateVolume", err)
	}
	s.log.Info("volume created", "name", v.Name, "id", v.ID)
	return fromVolume(v), nil
}

func (s *Server) Lookup(ctx context.Context, req *pb.LookupRequest) (*pb.LookupReply, error) {
	o, dir, err := s.beginRead(ctx, "Lookup", req.Dir, access.Lookup)
	if err != nil {
		return nil, err
	}
	child, d, err := s.store.Lookup(dir, req.Name)
	if err != nil {
		return nil, s.fail("Lookup", err)
	}
	if waited, err := s.recallFor(ctx, o, false, child.FID); err != nil {
		return nil, err
	} else if waited {
		if child, d, err = s.store.Lookup(dir, req.Name); err != nil {
			return nil, s.fail("Lookup", err)
		}
	}
	return &pb.LookupReply{Status: o.status(child), Dir: o.status(d)}, nil
}

func (s *Server) GetStatus(ctx context.Context, req *pb.GetStatusRequest) (*pb.GetStatusReply, error) {
	if len(req.Fids) == 0 || len(req.Fids) > maxBulkStatus {
		return nil, s.fail("GetStatus", fmt.Errorf("get status: %d fids, want 1..%d: %w", len(req.Fids), maxBulkStatus, syscall.EINVAL))
	}
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	fids := make([]node.FID, 0, len(req.Fids))
	for _, pf := range req.Fids {
		if f, err := checkFID("get status", pf); err == nil {
			fids = append(fids, f)
		}
	}
	if _, err := s.recallFor(ctx, o, false, fids...); err != nil {
		return nil, err
	}
	out := &pb.GetStatusReply{Results: make([]*pb.StatusResult, len(req.Fids))}
	for i, pf := range req.Fids {
		f, err := checkFID("get status", pf)
		var st node.Status
		if err == nil {
			st, err = s.store.GetStatus(f)
		}
		if err == nil {
			// A stat needs l on the directory, as in AFS.
			err = o.mayStatus(st, access.Lookup, "stat")
		}
		if err != nil {
			// A volume moved away (or moving) fails the request: the
			// client follows it and asks there.
			if w := s.wire(err); elsewhere(w) {
				return nil, w
			}
			out.Results[i] = &pb.StatusResult{Errno: int32(pb.Errno(err))}
			continue
		}
		out.Results[i] = &pb.StatusResult{Status: o.status(st)}
	}
	return out, nil
}

func (s *Server) ReadDir(ctx context.Context, req *pb.ReadDirRequest) (*pb.ReadDirReply, error) {
	o, dir, err := s.beginRead(ctx, "ReadDir", req.Dir, access.Lookup)
	if err != nil {
		return nil, err
	}
	ents, eof, d, err := s.store.ReadDir(dir, req.Cookie, int(req.MaxEntries))
	if err != nil {
		return nil, s.fail("ReadDir", err)
	}
	out := &pb.ReadDirReply{Eof: eof, Dir: o.status(d), Entries: make([]*pb.DirEntry, len(ents))}
	for i, e := range ents {
		out.Entries[i] = &pb.DirEntry{Name: e.Name, Fid: pb.FromFID(e.FID), Type: pb.FromType(e.Type), Cookie: e.Cookie}
	}
	return out, nil
}

func (s *Server) Create(ctx context.Context, req *pb.CreateRequest) (*pb.CreateReply, error) {
	dir, err := checkFID("create", req.Dir)
	if err != nil {
		return nil, s.fail("Create", err)
	}
	t := req.Type.ToType()
	if t == 0 {
		return nil, s.fail("Create", fmt.Errorf("create %q: unknown type %d: %w", req.Name, req.Type, syscall.EINVAL))
	}
	reply := &pb.CreateReply{}
	var st, d node.Status
	attr := node.Attr{Mode: req.Mode, UID: req.Uid, GID: req.Gid, Rdev: req.Rdev}
	o, err := s.change(ctx, change{hold: []node.FID{dir}, check: func(o *op) error {
		if t == node.TypeMountPoint {
			if err := s.volumeExists(req.Target); err != nil {
				return s.fail("Create", fmt.Errorf("mount point %s: %w", req.Name, err))
			}
		}
		return o.mayCreate(dir, req.Name, t, &attr)
	}, store: func(o *op) (_ []node.FID, err error) {
		st, d, reply.Created, err = s.store.Create(dir, req.Name, t, attr, req.Target, req.Exclusive, o.once)
		if err != nil {
			return nil, s.fail("Create", err)
		}
		if !reply.Created {
			return nil, nil
		}
		changed := []node.FID{dir}
		if req.Open && callback.Delegates(o.id, t, true, false) && s.cfg.Lease > 0 && s.openCreated(o, st.FID, reply) {
			changed = append(changed, st.FID)
		}
		return changed, nil
	}})
	if err != nil {
		return nil, err
	}
	if !reply.Created {
		// The file was there, maybe under another client's write
		// delegation: its status (and the promise on it) must include
		// what that client wrote, as a lookup's would.
		if waited, err := s.recallFor(ctx, o, false, st.FID); err != nil {
			return nil, err
		} else if waited {
			if st, err = s.store.GetStatus(st.FID); err != nil {
				return nil, s.fail("Create", err)
			}
		}
	}
	reply.Status, reply.Dir = o.status(st), o.status(d)
	return reply, nil
}

// openCreated opens f, just created by o's client, for writing, with the
// write delegation in reply, if the backend gives one. It is granted
// before the directory's promises are broken, so before anybody else can
// open the file: a grant, never a wait or a recorded open. A lookup may
// have found the name between the commit and the grant, and taken a
// promise on the file as created: it reports whether f's promises are to
// be broken with the directory's, since the holder may now write unseen.
func (s *Server) openCreated(o *op, f node.FID, reply *pb.CreateReply) bool {
	kind, still := s.store.Delegation(f, true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if kind != callback.DelegWrite || still != nil && !still() {
		return false
	}
	// Only: without a delegation (its maker backing off, say) nothing is
	// recorded; the maker opens the file as any client does.
	res, msgs := s.cb.OpenWith(o.id, f, callback.Opening{Write: true, Limit: callback.DelegWrite, Only: true}, time.Now())
	s.waitLocked(res.Wait, msgs)
	reply.Kind, reply.State = pb.DelegKind(res.Kind), res.State
	return true
}

func (s *Server) Link(ctx context.Context, req *pb.LinkRequest) (*pb.LinkReply, error) {
	fids, err := checkFIDs("link", req.Dir, req.Target)
	if err != nil {
		return nil, s.fail("Link", err)
	}
	dir, target := fids[0], fids[1]
	var st, d node.Status
	o, err := s.change(ctx, change{hold: []node.FID{dir}, recall: []node.FID{target}, check: func(o *op) error {
		return firstErr(o.may(dir, access.Insert, "link into a directory"), o.may(target, access.Lookup, "link to a file"), o.sameDir(target, dir))
	}, store: func(o *op) (_ []node.FID, err error) {
		if st, d, err = s.store.Link(dir, req.Name, target, o.once); err != nil {
			return nil, s.fail("Link", err)
		}
		return fids, nil
	}})
	if err != nil {
		return nil, err
	}
	return &pb.LinkReply{Status: o.status(st), Dir: o.status(d)}, nil
}

func (s *Server) Remove(ctx context.Context, req *pb.RemoveRequest) (*pb.RemoveReply, error) {
	dir, err := checkFID("remove", req.Dir)
	if err != nil {
		return nil, s.fail("Remove", err)
	}
	var d, st node.Status
	o, err := s.change(ctx, change{hold: []node.FID{dir}, check: func(o *op) error {
		return o.may(dir, access.Delete, "remove from a directory")
	}, store: func(o *op) (_ []node.FID, err error) {
		// A delegation granted on the file now could only be recalled
		// once it is removed: its holder's writes would be refused.
		if err := o.hold(ctx, s.named(dir, req.Name)); err != nil {
			return nil, err
		}
		if d, st, err = s.store.Remove(dir, req.Name, req.DirOnly, o.once); err != nil {
			return nil, s.fail("Remove", err)
		}
		s.gone(st)
		return []node.FID{dir, st.FID}, nil
	}})
	if err != nil {
		return nil, err
	}
	return &pb.RemoveReply{Dir: o.status(d), Status: pb.FromStatus(st, 0)}, nil
}

func (s *Server) Rename(ctx context.Context, req *pb.RenameRequest) (*pb.RenameReply, error) {
	fids, err := checkFIDs("rename", req.SrcDir, req.DstDir)
	if err != nil {
		return nil, s.fail("Rename", err)
	}
	src, dst := fids[0], fids[1]
	var res node.RenameResult
	out := &pb.RenameReply{}
	o, err := s.change(ctx, change{hold: fids, check: func(o *op) error {
		err := firstErr(o.may(src, access.Delete, "rename out of a directory"), o.may(dst, access.Insert, "rename into a directory"))
		if err == nil && len(s.named(dst, req.DstName)) > 0 {
			err = o.may(dst, access.Delete, "replace in a directory")
		}
		return err
	}, store: func(o *op) (_ []node.FID, err error) {
		// As for a remove: none is granted on the files while the rename
		// is under way, which may take the replaced one's last name.
		if err := o.hold(ctx, append(s.named(src, req.SrcName), s.named(dst, req.DstName)...)); err != nil {
			return nil, err
		}
		if res, err = s.store.Rename(src, req.SrcName, dst, req.DstName, req.KeepReplacedAs, o.once); err != nil {
			return nil, s.fail("Rename", err)
		}
		changed := []node.FID{src, dst, res.Moved.FID}
		if res.Replaced != nil {
			changed = append(changed, res.Replaced.FID)
			out.Replaced = pb.FromStatus(*res.Replaced, 0)
			s.gone(*res.Replaced)
		}
		return changed, nil
	}})
	if err != nil {
		return nil, err
	}
	out.SrcDir, out.DstDir, out.Status = o.status(res.SrcDir), o.status(res.DstDir), o.status(res.Moved)
	return out, nil
}

// named is the file name names in dir, if there is one: a change may take
// its last name.
func (s *Server) named(dir node.FID, name string) []node.FID {
	if child, _, err := s.store.Lookup(dir, name); err == nil {
		return []node.FID{child.FID}
	}
	return nil
}

func (s *Server) SetAttr(ctx context.Context, req *pb.SetAttrRequest) (*pb.SetAttrReply, error) {
	f, err := checkFID("setattr", req.Fid)
	if err != nil {
		return nil, s.fail("SetAttr", err)
	}
	if req.Mask == 0 || req.Mask >= 1<<6 {
		return nil, s.fail("SetAttr", fmt.Errorf("setattr %v: mask %#x: %w", f, req.Mask, syscall.EINVAL))
	}
	var st node.Status
	o, err := s.change(ctx, change{recall: []node.FID{f}, check: func(o *op) error {
		return o.maySetAttr(f, req)
	}, store: func(o *op) (_ []node.FID, err error) {
		st, err = s.store.SetAttr(f, node.Change{Mask: req.Mask, Mode: req.Mode, UID: req.Uid, GID: req.Gid,
			Size: req.Size, Atime: time.Unix(0, req.AtimeNs), Mtime: time.Unix(0, req.MtimeNs)})
		if err != nil {
			return nil, s.fail("SetAttr", err)
		}
		return []node.FID{f}, nil
	}})
	if err != nil {
		return nil, err
	}
	return &pb.SetAttrReply{Status: o.status(st)}, nil
}

// Xattr serves a file's extended attributes: reading them needs the right
// to read the file (to look in a directory), changing them the right to
// write it, as the mode bits ask on a local file system; a change moves
// the file's ctime and breaks its promises, as a setattr does.
func (s *Server) Xattr(ctx context.Context, req *pb.XattrRequest) (*pb.XattrReply, error) {
	f, err := checkFID("xattr", req.Fid)
	if err != nil {
		return nil, s.fail("Xattr", err)
	}
	if req.Op != pb.XattrOp_XATTR_LIST {
		if err := node.CheckXattrName(req.Name); err != nil {
			return nil, s.fail("Xattr", err)
		}
	}
	switch req.Op {
	case pb.XattrOp_XATTR_GET, pb.XattrOp_XATTR_LIST:
		o, err := s.begin(ctx)
		if err != nil {
			return nil, err
		}
		st, err := s.store.GetStatus(f)
		if err != nil {
			return nil, s.fail("Xattr", err)
		}
		need := access.Read
		if st.Type == node.TypeDir {
			need = access.Lookup
		}
		if err := o.mayStatus(st, need, "read extended attributes"); err != nil && !o.who.Admin {
			return nil, err
		}
		if req.Op == pb.XattrOp_XATTR_LIST {
			names, err := s.store.ListXattr(f)
			if err != nil {
				return nil, s.fail("Xattr", err)
			}
			return &pb.XattrReply{Names: names}, nil
		}
		val, err := s.store.GetXattr(f, req.Name)
		if err != nil {
			return nil, s.fail("Xattr", err)
		}
		return &pb.XattrReply{Value: val}, nil
	case pb.XattrOp_XATTR_SET, pb.XattrOp_XATTR_REMOVE:
	default:
		return nil, s.fail("Xattr", fmt.Errorf("xattr %v: op %d: %w", f, req.Op, syscall.EINVAL))
	}
	var st node.Status
	o, err := s.change(ctx, change{recall: []node.FID{f}, check: func(o *op) error {
		return o.mayStore(f)
	}, store: func(o *op) (_ []node.FID, err error) {
		if req.Op == pb.XattrOp_XATTR_SET {
			st, err = s.store.SetXattr(f, req.Name, req.Value, req.Flags)
		} else {
			st, err = s.store.RemoveXattr(f, req.Name)
		}
		if err != nil {
			return nil, s.fail("Xattr", err)
		}
		return []node.FID{f}, nil
	}})
	if err != nil {
		return nil, err
	}
	return &pb.XattrReply{Status: o.status(st)}, nil
}

func (s *Server) StatFS(ctx context.Context, req *pb.StatFSRequest) (*pb.StatFSReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	v, err := s.store.VolumeByID(req.Volume)
	if err != nil {
		return nil, s.fail("StatFS", err)
	}
	if err := o.may(v.Root, access.Lookup, "statfs"); err != nil {
		return nil, err
	}
	fs, err := s.store.StatFS(req.Volume)
	if err != nil {
		return nil, s.fail("StatFS", err)
	}
	return &pb.StatFSReply{BlockSize: fs.BlockSize, Blocks: fs.Blocks, BlocksFree: fs.BlocksFree, Files: fs.Files, FilesFree: fs.FilesFree}, nil
}

// Fetch streams a byte range. The promise is granted before any byte is
// read, and every piece says which data version it was read at, so a store
// committed mid-fetch shows as a version change, never as torn data.
func (s *Server) Fetch(req *pb.FetchRequest, stream pb.FileServer_FetchServer) error {
	f, err := checkFID("fetch", req.Fid)
	if err != nil {
		return s.fail("Fetch", err)
	}
	if req.Offset > 1<<62 || req.Length > 1<<62 {
		return s.fail("Fetch", fmt.Errorf("fetch %v: range out of bounds: %w", f, syscall.EINVAL))
	}
	piece := int(req.Piece)
	if piece <= 0 {
		piece = defaultPiece
	}
	piece = min(max(piece, minPiece), maxPiece)
	o, err := s.begin(stream.Context())
	if err != nil {
		return err
	}
	if err := o.may(f, access.Read, "read"); err != nil {
		return err
	}
	if _, err := s.recallFor(stream.Context(), o, false, f); err != nil {
		return err
	}
	st, err := s.store.GetStatus(f)
	if err != nil {
		return s.fail("Fetch", err)
	}
	if st.Type != node.TypeFile {
		return s.fail("Fetch", fmt.Errorf("fetch %v: %w", f, syscall.EISDIR))
	}
	first := &pb.FetchReply{Status: o.status(st)}
	end := min(req.Offset+req.Length, st.Size)
	buf := make([]byte, min(uint64(piece), max(end, req.Offset)-req.Offset))
	for off := req.Offset; off < end; {
		n, pst, err := s.store.ReadAt(f, buf[:min(uint64(len(buf)), end-off)], int64(off), o.user)
		if err == io.EOF || n == 0 && err == nil {
			break // truncated meanwhile: the version says so
		}
		if err != nil {
			return s.fail("Fetch", err)
		}
		m := &pb.FetchReply{Offset: off, Data: buf[:n], DataVersion: pst.DataVersion}
		if first != nil {
			first.Offset, first.Data, first.DataVersion = m.Offset, m.Data, m.DataVersion
			m, first = first, nil
		}
		if err := stream.Send(m); err != nil {
			return err
		}
		off += uint64(n)
	}
	if first != nil {
		first.DataVersion = st.DataVersion
		return stream.Send(first)
	}
	return nil
}

// Store receives a staged change and commits it at the end of the stream;
// a store of a stage (package stage) adds to the stage instead, or
// publishes it.
func (s *Server) Store(stream pb.FileServer_StoreServer) error {
	ctx := stream.Context()
	hdr, err := stream.Recv()
	if err != nil {
		return err
	}
	o, err := s.begin(ctx)
	if err != nil {
		return err
	}
	if err := s.storeGrace(ctx, hdr); err != nil {
		return err
	}
	x, err := s.beginStore(o, hdr)
	if err != nil {
		return s.fail("Store", err)
	}
	defer x.Release()
	f := x.f
	for m := hdr; ; {
		if len(m.Data) > 0 {
			if len(m.Data) > maxPiece*4 {
				return s.fail("Store", fmt.Errorf("store %v: piece of %d bytes: %w", f, len(m.Data), syscall.EINVAL))
			}
			if m.Offset > 1<<62 {
				return s.fail("Store", fmt.Errorf("store %v: offset %d: %w", f, m.Offset, syscall.EFBIG))
			}
			if err := x.Write(m.Data, int64(m.Offset)); err != nil {
				x.Fail(err)
				return s.fail("Store", err)
			}
		}
		m, err = stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			// The client went away: nothing is committed. A stage keeps
			// what came, which the store sent again writes once more.
			return err
		}
	}
	st, err := x.Finish(ctx)
	if err != nil {
		return s.fail("Store", err)
	}
	return stream.SendAndClose(&pb.StoreReply{Status: o.status(st)})
}

// storing is one store request's way into the update it stages: its own,
// or its stage's, which outlives the request. It is the data channel's
// datachan.Store.
type storing struct {
	o   *op
	hdr *pb.StoreRequest
	f   node.FID
	u   Update // the request's own; nil for a stage's
	// leave ends the store's count as a change of its volume (enter).
	leave func()
	st    *stage.Stage[Update]
	// replay: a publication sent again whose stage is gone because it was
	// made (its reply lost): answered with made, nothing staged.
	replay bool
	made   node.Status
}

// beginStore checks a store's header and starts staging it, or finds the
// stage it adds to; both data paths use it.
func (s *Server) beginStore(o *op, hdr *pb.StoreRequest) (*storing, error) {
	f, err := checkFID("store", hdr.Fid)
	if err != nil {
		return nil, err
	}
	if hdr.Size > 1<<44 || hdr.Truncate > 1<<44 {
		return nil, fmt.Errorf("store %v: size %d/%d: %w", f, hdr.Truncate, hdr.Size, syscall.EFBIG)
	}
	if err := vnode.CheckOp(node.Op(hdr.Op)); err != nil {
		return nil, fmt.Errorf("store %v: %w", f, err)
	}
	if err := o.mayStore(f); err != nil {
		return nil, err
	}
	leave, err := s.enter(f.Volume)
	if err != nil {
		return nil, err
	}
	x, err := s.stageOrUpdate(o, f, hdr)
	if err != nil {
		leave()
		return nil, err
	}
	x.leave = leave
	return x, nil
}

// stageOrUpdate starts staging a store: in its stage, or in an update of
// its own.
func (s *Server) stageOrUpdate(o *op, f node.FID, hdr *pb.StoreRequest) (*storing, error) {
	begin := func() (Update, error) { return s.store.BeginUpdate(f, hdr.BaseVersion, hdr.DelegState != 0) }
	if hdr.Stage != "" {
		st, err := s.stages.For(o.id, o.who, f, hdr, begin)
		if err == nil {
			st.Add(hdr)
			return &storing{o: o, hdr: hdr, f: f, st: st}, nil
		}
		if !hdr.Publish {
			return nil, err
		}
		if made, ok := s.madeBefore(f, hdr); ok {
			return &storing{o: o, hdr: hdr, f: f, replay: true, made: made}, nil
		}
		return nil, err
	}
	u, err := begin()
	if err != nil {
		return nil, err
	}
	if hdr.HasTruncate {
		u.Truncate(hdr.Truncate)
	}
	if hdr.HasSize {
		u.SetSize(hdr.Size)
	}
	return &storing{o: o, hdr: hdr, f: f, u: u}, nil
}

// madeBefore reports whether the store hdr names was made already, and
// the file's status if so (a backend that cannot tell says no).
func (s *Server) madeBefore(f node.FID, hdr *pb.StoreRequest) (node.Status, bool) {
	if hdr.Op == "" {
		return node.Status{}, false
	}
	u, err := s.store.BeginUpdate(f, hdr.BaseVersion, hdr.DelegState != 0)
	if err != nil {
		return node.Status{}, false
	}
	defer u.Abort()
	m, ok := u.(interface {
		Made(node.Op) (node.Status, bool, error)
	})
	if !ok {
		return node.Status{}, false
	}
	st, made, err := m.Made(node.Op(hdr.Op))
	return st, made && err == nil
}

// Status is st for the reply, as op.status.
func (x *storing) Status(st node.Status) *pb.Status { return x.o.status(st) }

func (x *storing) Write(p []byte, off int64) error {
	switch {
	case x.replay:
		return nil
	case x.st != nil:
		return x.st.WriteAt(p, off)
	}
	return x.u.WriteAt(p, off)
}

// Fail drops a stage whose store failed on the server's side: the writes
// it lost would be missing from the publication.
func (x *storing) Fail(err error) {
	if x.st != nil {
		x.o.s.stages.Fail(x.st, err)
	}
}

// Release ends the request's own update (a no-op once committed), and
// its count as a change of the volume.
func (x *storing) Release() {
	if x.u != nil {
		x.u.Abort()
	}
	x.leave()
}

// Finish commits the store, publishes its stage, or (a store of a stage
// that does not publish) only answers with the file's status as it is.
func (x *storing) Finish(ctx context.Context) (node.Status, error) {
	s, o, hdr := x.o.s, x.o, x.hdr
	switch {
	case x.replay:
		return x.made, nil
	case x.st != nil && !hdr.Publish:
		return s.store.GetStatus(x.f)
	case x.st != nil:
		u, err := s.stages.Take(x.st)
		if err != nil {
			return node.Status{}, err
		}
		defer u.Abort() // a no-op once committed
		return s.commitStore(ctx, o, x.f, u, hdr)
	}
	return s.commitStore(ctx, o, x.f, x.u, hdr)
}

// commitStore commits a staged store and breaks the promises on the file
// before the store is acknowledged.
func (s *Server) commitStore(ctx context.Context, o *op, f node.FID, u Update, hdr *pb.StoreRequest) (st node.Status, err error) {
	// A store under a delegation is accepted only while the client holds
	// it; any other store waits for other clients' delegations first.
	took, err := s.checkDelegation(o, f, hdr.DelegState, hdr.BaseVersion)
	if err != nil {
		return node.Status{}, err
	}
	if took {
		defer s.giveBackFor(o, f, hdr.DelegState)
	}
	var recall []node.FID
	if hdr.DelegState == 0 {
		recall = []node.FID{f}
	}
	var mtime time.Time
	if hdr.MtimeNs != 0 {
		mtime = time.Unix(0, hdr.MtimeNs)
	}
	err = o.make(ctx, change{recall: recall, store: func(*op) (_ []node.FID, err error) {
		st, err = u.Commit(hdr.Sync, mtime, node.Op(hdr.Op))
		return []node.FID{f}, err
	}})
	return st, err
}
