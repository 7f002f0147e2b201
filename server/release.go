package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/vldb"
	"github.com/hoardfs/hoard/vnode"
)

// Read-only copies (docs/cell.md, "Read-only copies"). A volume's
// read-only sites each hold one copy of it, with an id of its own (ROID)
// and the name NAME.readonly, as the last release left it. The releaser
// (hoard vol release, an admin's client) drives a release:
//
//  1. HAVE at each site: the data files its copy holds.
//  2. A first pass to each site while the volume is in use brings the
//     data files that changed (DumpVolume at the read-write site piped
//     into RestoreVolume at the site, release set), published to nobody.
//  3. QUIESCE at the read-write site, as for a move: delegations are
//     recalled, so that what clients closed is in the release; a second
//     pass brings what they stored.
//  4. FREEZE at the read-write site, as for a move: changes wait.
//  5. A last pass to each site, published: each site swaps its copy for
//     the new one in one transaction and breaks its clients' promise on
//     the volume, one per client.
//  6. COMMIT: changes go on; the location database records the release.
//
// A copy's files never change, so its clients hold one promise on the
// whole volume (on its vnode 0) rather than one per file, and a client
// reads it from any site: when one dies, from another.

// readOnly reports whether vol is a read-only copy.
func (s *Server) readOnly(vol uint64) bool {
	c := s.cfg.Cell
	if c == nil {
		return false
	}
	_, ok := c.DB.ByROID(vol)
	return ok
}

// promiseOn is the FID a promise on f is kept on: the volume's for a
// read-only copy, whose files change only all together.
func (s *Server) promiseOn(f node.FID) node.FID {
	if s.readOnly(f.Volume) {
		return node.FID{Volume: f.Volume}
	}
	return f
}

// errReadOnly refuses a change to a read-only copy.
func errReadOnly(vol uint64) error {
	return pb.Err(fmt.Errorf("volume %d is a read-only copy (reach the read-write volume by a %sNAME mount point): %w", vol, node.ReadWritePrefix, syscall.EROFS))
}

// roLocation is where v's read-only copy is: the sites holding its last
// release.
func (s *Server) roLocation(v vldb.Volume) *pb.Location {
	c := s.cfg.Cell
	l := &pb.Location{Id: v.ROID, Name: v.Name + node.ReadOnlySuffix, Released: v.Released,
		CreatedNs: v.ReleasedAt.UnixNano(), ReadOnly: true, RoId: v.ROID, Here: slices.Contains(v.RO, c.Name)}
	for _, ro := range v.RO {
		srv, _ := c.DB.Server(ro)
		l.Ro = append(l.Ro, &pb.Site{Name: ro, Addr: srv.Addr})
	}
	return l
}

// byName finds a volume of the cell by a name, which may be of its
// read-only copy (ro).
func byName(db *vldb.DB, name string) (v vldb.Volume, ro, ok bool) {
	if rw, found := strings.CutSuffix(name, node.ReadOnlySuffix); found {
		v, ok = db.ByName(rw)
		return v, true, ok && v.ROID != 0
	}
	v, ok = db.ByName(name)
	return v, false, ok
}

// ReleaseVolume steps a release of one of this server's volumes, or
// answers for a read-only site (HAVE, and REMOVE_SITE of itself).
func (s *Server) ReleaseVolume(ctx context.Context, req *pb.ReleaseVolumeRequest) (*pb.ReleaseVolumeReply, error) {
	vm, c, v, err := s.moving(ctx, "ReleaseVolume", "release volume", req.Name)
	if err != nil {
		return nil, err
	}
	switch req.Step {
	case pb.ReleaseVolumeRequest_HAVE:
		reply := &pb.ReleaseVolumeReply{Location: s.location(v)}
		if v.ROID == 0 {
			return reply, nil
		}
		has, err := vm.CopyHas(v.ROID)
		if err != nil {
			return nil, s.fail("ReleaseVolume", err)
		}
		for _, df := range has {
			reply.Have = append(reply.Have, &pb.FileVersion{Vnode: df.Vnode, Unique: df.Unique, Gen: df.Gen, Dv: df.DV})
		}
		return reply, nil
	case pb.ReleaseVolumeRequest_REMOVE_SITE:
		if v.RW != c.Name {
			// At the site itself, once the database no longer names it
			// (the change was made at another server a moment ago).
			if !s.caughtUp(func() bool {
				v, _ = c.DB.ByName(req.Name)
				return !slices.Contains(v.RO, c.Name) && !slices.Contains(v.Pending, c.Name)
			}) {
				return nil, status.Errorf(codes.FailedPrecondition, "server %s is still a read-only site of volume %s", c.Name, v.Name)
			}
			if _, err := s.store.VolumeByID(v.ROID); err == nil && v.ROID != 0 {
				if err := vm.RemoveVolume(v.ROID); err != nil {
					return nil, s.fail("ReleaseVolume", err)
				}
			}
			return &pb.ReleaseVolumeReply{Location: s.roLocation(v)}, nil
		}
	}
	if v.RW != c.Name {
		return nil, notHere(s.location(v))
	}
	dctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	switch req.Step {
	case pb.ReleaseVolumeRequest_ADD_SITE:
		if err := aliveIn(c, req.Site); err != nil {
			return nil, err
		}
		if slices.Contains(v.RO, req.Site) || slices.Contains(v.Pending, req.Site) {
			return nil, status.Errorf(codes.AlreadyExists, "server %s is a read-only site of volume %s already", req.Site, v.Name)
		}
		v, err = c.DB.Update(dctx, v.ID, func(w *vldb.Volume) error {
			if w.ROID == 0 {
				w.ROID = vldb.NewID
			}
			if !slices.Contains(w.Pending, req.Site) && !slices.Contains(w.RO, req.Site) {
				w.Pending = append(w.Pending, req.Site)
			}
			return nil
		})
	case pb.ReleaseVolumeRequest_REMOVE_SITE:
		v, err = c.DB.Update(dctx, v.ID, func(w *vldb.Volume) error {
			if !slices.Contains(w.Pending, req.Site) && !slices.Contains(w.RO, req.Site) {
				return status.Errorf(codes.NotFound, "server %s is not a read-only site of volume %s", req.Site, w.Name)
			}
			w.RO = slices.DeleteFunc(w.RO, func(n string) bool { return n == req.Site })
			w.Pending = slices.DeleteFunc(w.Pending, func(n string) bool { return n == req.Site })
			return nil
		})
	case pb.ReleaseVolumeRequest_QUIESCE, pb.ReleaseVolumeRequest_FREEZE:
		if v.Moving != "" {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is moving to %s: finish or undo the move first", v.Name, v.Moving)
		}
		s.quiesce(v.ID)
		if req.Step == pb.ReleaseVolumeRequest_FREEZE {
			err = s.freeze(ctx, v.ID)
		}
	case pb.ReleaseVolumeRequest_COMMIT:
		published := req.Site // the sites the last pass reached, comma-separated
		v, err = c.DB.Update(dctx, v.ID, func(w *vldb.Volume) error {
			for _, site := range strings.Split(published, ",") {
				if slices.Contains(w.Pending, site) {
					w.Pending = slices.DeleteFunc(w.Pending, func(n string) bool { return n == site })
					w.RO = append(w.RO, site)
				}
			}
			w.Released, w.ReleasedAt = w.Released+1, time.Now()
			return nil
		})
		s.thaw(v.ID)
	case pb.ReleaseVolumeRequest_ABORT:
		s.thaw(v.ID)
	default:
		return nil, status.Errorf(codes.InvalidArgument, "release step %d", req.Step)
	}
	if err != nil {
		return nil, s.stepFailed("ReleaseVolume", err)
	}
	return &pb.ReleaseVolumeReply{Location: s.location(v)}, nil
}

// restoreCopy is where a release's pass goes at a read-only site: the
// copy of volume rw, if this server is one of its sites.
func (s *Server) restoreCopy(c *Cell, rw uint64) (vldb.Volume, error) {
	var v vldb.Volume
	if !s.caughtUp(func() bool {
		var ok bool
		v, ok = c.DB.Volume(rw)
		return ok && v.ROID != 0 && (slices.Contains(v.RO, c.Name) || slices.Contains(v.Pending, c.Name))
	}) {
		return v, status.Errorf(codes.FailedPrecondition, "this server (%s) is not a read-only site of volume %d", c.Name, rw)
	}
	return v, nil
}

// receive marks v's copy as receiving a release here, or refuses a
// second release at once: their passes would drop each other's files.
func (s *Server) receive(v vldb.Volume) (done func(), err error) {
	m := &s.moves
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.hold.Receive(v.ROID) {
		return nil, status.Errorf(codes.Aborted, "a release of volume %s is under way at %s: wait for it, then release again", v.Name, s.cfg.Cell.Name)
	}
	return func() {
		m.mu.Lock()
		m.hold.Received(v.ROID)
		m.mu.Unlock()
	}, nil
}

// publishCopy makes a release's last pass what the copy's readers see,
// and breaks their promise on it.
func (s *Server) publishCopy(vm volumeMover, v vldb.Volume, kvs []vnode.KV) error {
	if err := vm.PublishCopy(v.ROID, v.Name+node.ReadOnlySuffix, kvs); err != nil {
		return err
	}
	s.Invalidate([]node.FID{{Volume: v.ROID}})
	s.log.Info("release published", "volume", v.Name, "copy", v.ROID)
	return nil
}
