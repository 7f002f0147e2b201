package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/vldb"
	"github.com/hoardfs/hoard/vnode"
	"github.com/hoardfs/hoard/volhold"
)

// Moving a volume to another server (docs/cell.md, "Moving a volume").
// The mover (hoard vol move, an admin's client) drives it:
//
//  1. BEGIN records the move in the location database (Moving).
//  2. A first pass copies the volume while clients use it: DumpVolume at
//     the source piped into RestoreVolume at the target.
//  3. QUIESCE: the source grants no more promises or delegations on the
//     volume and breaks and recalls those held; writers store what they
//     held. A second pass copies what changed meanwhile.
//  4. FREEZE: the source refuses changes to the volume (clients wait and
//     send again) once those under way are done. A last pass copies what
//     is left; it must find nothing changing.
//  5. COMMIT: the location database names the target; the source drops
//     its copy and from then on answers requests for the volume with
//     where it is now (notHere), which clients follow.
//
// Nothing acknowledged is lost: every change acknowledged before the
// freeze is in the last pass, and none is acknowledged during it. A mover
// that dies leaves the volume at the source: the freeze and the quiet
// lapse after Config.MoveHold, and the move may be run again (or undone).

// moves is a server's part in the moves and releases of its volumes: the
// holds on them (volhold, whose rules they are), under mu, and cond,
// which a freeze waits on for the changes under way to drain.
type moves struct {
	mu   sync.Mutex
	cond *sync.Cond
	hold *volhold.State
	// passes are the dumps and restores under way (Underway lists them).
	passes map[*pass]struct{}
}

// pass is a dump sent from here or a restore received here, of the
// read-write volume vol's data.
type pass struct {
	vol   uint64
	send  bool
	since time.Time
}

func (m *moves) init() {
	m.cond = sync.NewCond(&m.mu)
	m.hold = volhold.New()
	m.passes = map[*pass]struct{}{}
}

// passing records a pass of vol under way, until done.
func (s *Server) passing(vol uint64, send bool) (done func()) {
	p := &pass{vol: vol, send: send, since: time.Now()}
	m := &s.moves
	m.mu.Lock()
	m.passes[p] = struct{}{}
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.passes, p)
		m.mu.Unlock()
	}
}

// errDeparting refuses a request about a volume whose move is being
// committed; the client sends it again and finds the volume elsewhere.
func errDeparting(vol uint64) error {
	return status.Errorf(codes.Unavailable, "volume %d is moving to another server; send the request again", vol)
}

// elsewhere reports whether err, as the wire has it (wire), says the
// volume is at another server (notHere) or is being handed over or
// frozen (sent again later): a request about several files fails whole
// on it, and the data channel sends the client to gRPC.
func elsewhere(w error) bool {
	st, ok := status.FromError(w)
	if !ok {
		return false
	}
	if st.Code() == codes.Unavailable {
		return true
	}
	for _, d := range st.Details() {
		if _, ok := d.(*pb.Location); ok {
			return true
		}
	}
	return false
}

// departed checks that vol is not being handed over (departing).
func (s *Server) departed(vol uint64) error {
	s.moves.mu.Lock()
	defer s.moves.mu.Unlock()
	if s.moves.hold.Departing(vol) {
		return errDeparting(vol)
	}
	return nil
}

// guarded is a file server's Backend, refusing the reads of volumes being
// handed over (writes are frozen already).
type guarded struct {
	Backend
	s *Server
}

func (g guarded) GetStatus(f node.FID) (node.Status, error) {
	if err := g.s.departed(f.Volume); err != nil {
		return node.Status{}, err
	}
	return g.Backend.GetStatus(f)
}

func (g guarded) Lookup(dir node.FID, name string) (child, d node.Status, err error) {
	if err := g.s.departed(dir.Volume); err != nil {
		return child, d, err
	}
	return g.Backend.Lookup(dir, name)
}

func (g guarded) ReadDir(dir node.FID, cookie uint64, max int) ([]node.DirEntry, bool, node.Status, error) {
	if err := g.s.departed(dir.Volume); err != nil {
		return nil, false, node.Status{}, err
	}
	return g.Backend.ReadDir(dir, cookie, max)
}

func (g guarded) ReadAt(f node.FID, p []byte, off int64, user string) (int, node.Status, error) {
	if err := g.s.departed(f.Volume); err != nil {
		return 0, node.Status{}, err
	}
	return g.Backend.ReadAt(f, p, off, user)
}

func (g guarded) GoverningACL(f node.FID) (node.FID, access.ACL, error) {
	if err := g.s.departed(f.Volume); err != nil {
		return node.FID{}, nil, err
	}
	return g.Backend.GoverningACL(f)
}

// enter counts a change of volume vol under way, or refuses it while the
// volume is frozen (UNAVAILABLE: the client sends it again), or is a
// read-only copy (EROFS).
func (s *Server) enter(vols ...uint64) (leave func(), err error) {
	for _, v := range vols {
		if s.readOnly(v) {
			return nil, errReadOnly(v)
		}
	}
	m := &s.moves
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.hold.Enter(time.Now(), vols...); !ok {
		return nil, status.Errorf(codes.Unavailable, "volume %d is moving to another server; send the change again", v)
	}
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.hold.Leave(vols...)
		m.cond.Broadcast()
	}, nil
}

// volumesOf are the distinct volumes of fids.
func volumesOf(fids ...node.FID) []uint64 {
	var vs []uint64
	for _, f := range fids {
		found := false
		for _, v := range vs {
			found = found || v == f.Volume
		}
		if !found {
			vs = append(vs, f.Volume)
		}
	}
	return vs
}

// freeze refuses new changes to vol and waits for those under way.
func (s *Server) freeze(ctx context.Context, vol uint64) error {
	m := &s.moves
	m.mu.Lock()
	m.hold.Freeze(vol, time.Now().Add(s.cfg.MoveHold))
	m.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		m.mu.Lock()
		m.cond.Broadcast()
		m.mu.Unlock()
	})
	defer stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	for !m.hold.Drained(vol) {
		if err := ctx.Err(); err != nil {
			m.hold.Unfreeze(vol)
			return err
		}
		m.cond.Wait()
	}
	return nil
}

// quiesce has the callback machine grant nothing on vol, and breaks and
// recalls what is held; after MoveHold without a commit it grants again.
func (s *Server) quiesce(vol uint64) {
	until := time.Now().Add(s.cfg.MoveHold)
	s.moves.mu.Lock()
	s.moves.hold.Quiet(vol, until)
	s.moves.mu.Unlock()
	s.mu.Lock()
	held := s.cb.Quiesce(vol)
	s.mu.Unlock()
	time.AfterFunc(s.cfg.MoveHold, func() {
		s.moves.mu.Lock()
		lapsed := s.moves.hold.QuietSince(vol, until)
		s.moves.mu.Unlock()
		if lapsed {
			s.log.Warn("a move of volume went silent; serving it as before", "volume", vol)
			s.thaw(vol)
		}
	})
	if len(held) > 0 {
		s.Invalidate(held)
	}
}

// thaw ends a freeze and a quiet of vol.
func (s *Server) thaw(vol uint64) {
	s.moves.mu.Lock()
	s.moves.hold.Thaw(vol)
	s.moves.mu.Unlock()
	s.mu.Lock()
	s.cb.Resume(vol)
	s.mu.Unlock()
}

func (s *Server) setDeparting(vol uint64, on bool) {
	s.moves.mu.Lock()
	defer s.moves.mu.Unlock()
	s.moves.hold.Depart(vol, on)
}

// frozenNow reports whether vol is frozen and quiet, neither lapsed.
func (s *Server) frozenNow(vol uint64) bool {
	s.moves.mu.Lock()
	defer s.moves.mu.Unlock()
	return s.moves.hold.FrozenAt(vol, time.Now())
}

// volumeMover is what a file server's own store offers a move.
type volumeMover interface {
	volumeStore
	DumpMeta(id uint64) (string, []vnode.KV, []vnode.DataFile, error)
	ReadVersion(f node.FID, dv uint64, p []byte, off int64) (int, error)
	Receive(vol uint64, copy bool) *vnode.Receiving
	RestoreMeta(id uint64, name string, kvs []vnode.KV) error
	CopyHas(id uint64) ([]vnode.DataFile, error)
	PublishCopy(id uint64, name string, kvs []vnode.KV) error
}

// mover is the store as a volumeMover, and the cell: moves are between
// file servers of one.
func (s *Server) mover(o *op, what string) (volumeMover, *Cell, error) {
	if err := o.admin(what); err != nil {
		return nil, nil, err
	}
	vm, ok := s.local.(volumeMover)
	if !ok || s.cfg.Cell == nil {
		return nil, nil, status.Error(codes.FailedPrecondition, "volumes move between file servers of a cell")
	}
	return vm, s.cfg.Cell, nil
}

// moving begins a request (rpc) that moves or releases volume name (an
// admin's, what), at a file server of a cell: the store's mover, the
// cell, and the volume's location.
func (s *Server) moving(ctx context.Context, rpc, what, name string) (volumeMover, *Cell, vldb.Volume, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, nil, vldb.Volume{}, err
	}
	vm, c, err := s.mover(o, what+" "+name)
	if err != nil {
		return nil, nil, vldb.Volume{}, err
	}
	v, ok := c.DB.ByName(name)
	if !ok {
		return nil, nil, vldb.Volume{}, s.fail(rpc, fmt.Errorf("volume %s: %w", name, syscall.ENOENT))
	}
	return vm, c, v, nil
}

// aliveIn refuses a server the cell does not have (NOT_FOUND) or that is
// not alive now (ABORTED): one a volume cannot go to.
func aliveIn(c *Cell, name string) error {
	srv, ok := c.DB.Server(name)
	switch {
	case !ok:
		return status.Errorf(codes.NotFound, "no server %s in the cell", name)
	case !srv.Alive:
		return status.Errorf(codes.Aborted, "server %s is not alive", name)
	}
	return nil
}

// stepFailed is the error a step of a move or release (rpc) answers
// with: a refusal as it was made, a failure of the location database as
// cellErr says it.
func (s *Server) stepFailed(rpc string, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return s.fail(rpc, cellErr(err))
}

const dumpPiece = 1 << 20

// DumpVolume sends a volume held here: its metadata, then the data files
// the receiver does not have at their current version.
func (s *Server) DumpVolume(req *pb.DumpVolumeRequest, stream pb.FileServer_DumpVolumeServer) error {
	o, err := s.begin(stream.Context())
	if err != nil {
		return err
	}
	vm, _, err := s.mover(o, "dump volume "+req.Name)
	if err != nil {
		return err
	}
	v, err := s.store.VolumeByName(req.Name)
	if err != nil {
		return s.fail("DumpVolume", err)
	}
	defer s.passing(v.ID, true)()
	name, kvs, files, err := vm.DumpMeta(v.ID)
	if err != nil {
		return s.fail("DumpVolume", err)
	}
	first := &pb.DumpPiece{Volume: v.ID, Name: name}
	size := 0
	for _, kv := range kvs {
		first.Meta = append(first.Meta, &pb.MetaKV{Bucket: kv.Bucket, Key: kv.Key, Value: kv.Value})
		if size += len(kv.Key) + len(kv.Value) + 16; size >= dumpPiece {
			if err := stream.Send(first); err != nil {
				return err
			}
			first, size = &pb.DumpPiece{Volume: v.ID, Name: name}, 0
		}
	}
	if err := stream.Send(first); err != nil {
		return err
	}
	have := map[vnode.DataFile]bool{}
	for _, h := range req.Have {
		have[vnode.DataFile{Vnode: h.Vnode, Unique: h.Unique, Gen: h.Gen, DV: h.Dv}] = true
	}
	end := &pb.DumpPiece{End: true}
	buf := make([]byte, dumpPiece)
	for _, df := range files {
		fv := &pb.FileVersion{Vnode: df.Vnode, Unique: df.Unique, Gen: df.Gen, Dv: df.DV}
		if have[df] {
			end.Kept = append(end.Kept, fv)
			continue
		}
		f := node.FID{Volume: v.ID, Vnode: df.Vnode, Unique: df.Unique}
		for off := int64(0); ; {
			n, err := vm.ReadVersion(f, df.DV, buf, off)
			if errors.Is(err, vnode.ErrChanged) {
				if err := stream.Send(&pb.DumpPiece{File: fv, Abandoned: true}); err != nil {
					return err
				}
				break
			}
			if err != nil {
				return s.fail("DumpVolume", err)
			}
			if err := stream.Send(&pb.DumpPiece{File: fv, Offset: uint64(off), Data: buf[:n]}); err != nil {
				return err
			}
			if off += int64(n); n < len(buf) {
				break
			}
		}
	}
	return stream.Send(end)
}

// maxMeta bounds the metadata a RestoreVolume holds in memory.
const maxMeta = 1 << 30

// RestoreVolume receives a volume's dump and makes this server's copy of
// it hold exactly that. A volume the cell says this server holds is never
// overwritten: only a copy on its way here.
func (s *Server) RestoreVolume(stream pb.FileServer_RestoreVolumeServer) error {
	o, err := s.begin(stream.Context())
	if err != nil {
		return err
	}
	vm, c, err := s.mover(o, "restore volume")
	if err != nil {
		return err
	}
	var (
		id       uint64
		name     string
		kvs      []vnode.KV
		metaSize int
		cur      *vnode.RestoreFile
		curFile  *pb.FileVersion
		reply    = &pb.RestoreVolumeReply{}
		// release: the dump is of the read-write volume copyOf, for its
		// read-only copy here (id).
		release bool
		copyOf  vldb.Volume
		rv      *vnode.Receiving
	)
	defer func() {
		if cur != nil {
			cur.Abort()
		}
	}()
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			return s.fail("RestoreVolume", fmt.Errorf("restore volume %s: the dump ended early: %w", name, syscall.EIO))
		}
		if err != nil {
			return err
		}
		if id == 0 {
			if p.Volume == 0 || node.CheckVolumeName(p.Name) != nil {
				return s.fail("RestoreVolume", fmt.Errorf("restore: the dump names no volume: %w", syscall.EINVAL))
			}
			id, name = p.Volume, p.Name
			if release = p.Release; release {
				if copyOf, err = s.restoreCopy(c, id); err != nil {
					return err
				}
				id = copyOf.ROID
				done, err := s.receive(copyOf)
				if err != nil {
					return err
				}
				defer done()
			} else if !s.caughtUp(func() bool {
				v, ok := c.DB.Volume(id)
				return ok && v.Name == name && v.RW != c.Name && v.Moving == c.Name
			}) {
				return status.Errorf(codes.FailedPrecondition, "volume %s (id %d) is not moving here", name, id)
			}
			if release {
				defer s.passing(copyOf.ID, false)()
			} else {
				defer s.passing(id, false)()
			}
			rv = vm.Receive(id, release)
		}
		for _, kv := range p.Meta {
			if metaSize += len(kv.Key) + len(kv.Value); metaSize > maxMeta {
				return s.fail("RestoreVolume", fmt.Errorf("restore volume %s: metadata past %d bytes: %w", name, maxMeta, syscall.EFBIG))
			}
			kvs = append(kvs, vnode.KV{Bucket: kv.Bucket, Key: kv.Key, Value: kv.Value})
		}
		if p.File != nil && (curFile == nil || p.File.Vnode != curFile.Vnode || p.File.Gen != curFile.Gen) {
			if err := s.finishFile(cur, curFile, reply); err != nil {
				return s.fail("RestoreVolume", err)
			}
			cur, curFile = nil, p.File
			if !p.Abandoned {
				df := vnode.DataFile{Vnode: p.File.Vnode, Unique: p.File.Unique, Gen: p.File.Gen, DV: p.File.Dv}
				if cur, err = rv.File(df); err != nil {
					return s.fail("RestoreVolume", err)
				}
			}
		}
		switch {
		case p.Abandoned:
			if cur != nil {
				cur.Abort()
				cur = nil
			}
			reply.Abandoned++
		case len(p.Data) > 0 && cur != nil:
			if err := cur.WriteAt(p.Data, int64(p.Offset)); err != nil {
				return s.fail("RestoreVolume", err)
			}
			reply.Bytes += uint64(len(p.Data))
		}
		if p.End {
			if err := s.finishFile(cur, curFile, reply); err != nil {
				return s.fail("RestoreVolume", err)
			}
			cur = nil
			reply.Have = append(reply.Have, p.Kept...)
			if err := rv.Sync(); err != nil {
				return s.fail("RestoreVolume", err)
			}
			switch {
			case !release:
				err = vm.RestoreMeta(id, name, kvs)
			case p.Publish && reply.Abandoned == 0:
				err = s.publishCopy(vm, copyOf, kvs)
			}
			if err != nil {
				return s.fail("RestoreVolume", err)
			}
			return stream.SendAndClose(reply)
		}
	}
}

// finishFile commits a received data file and counts it had.
func (s *Server) finishFile(f *vnode.RestoreFile, fv *pb.FileVersion, reply *pb.RestoreVolumeReply) error {
	if f == nil {
		return nil
	}
	if err := f.Commit(); err != nil {
		return err
	}
	reply.Have = append(reply.Have, fv)
	return nil
}

// MoveVolume steps a move of one of this server's volumes (the source),
// or undoes what a target received (ABORT at the target).
func (s *Server) MoveVolume(ctx context.Context, req *pb.MoveVolumeRequest) (*pb.MoveVolumeReply, error) {
	vm, c, v, err := s.moving(ctx, "MoveVolume", "move volume", req.Name)
	if err != nil {
		return nil, err
	}
	if v.RW != c.Name {
		if req.Step == pb.MoveVolumeRequest_ABORT {
			// A target's copy of an unfinished move: dropped.
			if _, err := s.store.VolumeByID(v.ID); err == nil {
				if err := vm.RemoveVolume(v.ID); err != nil {
					return nil, s.fail("MoveVolume", err)
				}
			}
			return &pb.MoveVolumeReply{Location: s.location(v)}, nil
		}
		return nil, notHere(s.location(v))
	}
	dctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	switch req.Step {
	case pb.MoveVolumeRequest_BEGIN:
		if req.To == c.Name {
			return nil, status.Errorf(codes.InvalidArgument, "volume %s is on %s already", v.Name, req.To)
		}
		if err := aliveIn(c, req.To); err != nil {
			return nil, err
		}
		v, err = c.DB.Update(dctx, v.ID, func(w *vldb.Volume) error {
			if w.Moving != "" && w.Moving != req.To {
				return status.Errorf(codes.Aborted, "a move of volume %s to %s is unfinished: run it again, or move the volume to %s to undo it", w.Name, w.Moving, c.Name)
			}
			w.Moving = req.To
			return nil
		})
	case pb.MoveVolumeRequest_QUIESCE:
		if v.Moving == "" {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not moving", v.Name)
		}
		s.quiesce(v.ID)
	case pb.MoveVolumeRequest_FREEZE:
		if v.Moving == "" {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not moving", v.Name)
		}
		// Quiet again: a second pass longer than MoveHold let it lapse,
		// and promises granted since must not outlive the move.
		s.quiesce(v.ID)
		err = s.freeze(ctx, v.ID)
	case pb.MoveVolumeRequest_COMMIT:
		if !s.frozenNow(v.ID) || v.Moving == "" {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not frozen for a move (the last pass took longer than --move-hold?): run the move again", v.Name)
		}
		id := v.ID
		s.setDeparting(id, true)
		v, err = c.DB.Update(dctx, id, func(w *vldb.Volume) error {
			if w.RW != c.Name || w.Moving == "" {
				return status.Errorf(codes.Aborted, "volume %s changed during the move", w.Name)
			}
			w.RW, w.Moving = w.Moving, ""
			return nil
		})
		if err == nil {
			if rerr := vm.RemoveVolume(id); rerr != nil {
				s.log.Error("a moved volume's copy not dropped; it is dropped at the next start", "volume", v.Name, "err", rerr)
			}
			s.thaw(id)
			s.log.Info("volume moved", "name", v.Name, "id", id, "to", v.RW)
		}
		s.setDeparting(id, false)
	case pb.MoveVolumeRequest_ABORT:
		id := v.ID
		v, err = c.DB.Update(dctx, id, func(w *vldb.Volume) error {
			w.Moving = ""
			return nil
		})
		s.thaw(id)
	default:
		return nil, status.Errorf(codes.InvalidArgument, "move step %d", req.Step)
	}
	if err != nil {
		return nil, s.stepFailed("MoveVolume", err)
	}
	return &pb.MoveVolumeReply{Location: s.location(v)}, nil
}
