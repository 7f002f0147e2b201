package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/vldb"
	"github.com/hoardfs/hoard/vnode"
)

// Cell is what a file server of a cell knows of it: its copy of the
// location database and its own name there.
type Cell struct {
	DB   *vldb.DB
	Name string
}

// dbTimeout bounds a location change: an etcd without a quorum is an
// error in seconds, not a request hanging.
const dbTimeout = 5 * time.Second

// volumeStore is what a file server's own store adds for the cell.
type volumeStore interface {
	CreateVolumeID(id uint64, name string) (node.Volume, error)
	RemoveVolume(id uint64) error
}

// Locate answers where a volume lives from this server's copy of the
// location database; a server outside a cell (or a proxy) answers for
// its own volumes, as here.
//
// An anonymous caller is told only where a volume of this server lives
// whose root system:anyuser may look in (a public volume), unless the
// cell lets anonymous callers list it (Config.AnonymousListing): the
// names of a cell's volumes and servers are for its users.
func (s *Server) Locate(ctx context.Context, req *pb.LocateRequest) (*pb.Location, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if (req.Name == "") == (req.Id == 0) {
		return nil, s.fail("Locate", fmt.Errorf("locate: give exactly one of name and id: %w", syscall.EINVAL))
	}
	what := req.Name
	if what == "" {
		what = fmt.Sprintf("id %d", req.Id)
	}
	if s.mayListCell(o) != nil {
		v, err := s.localVolume(req.Name, req.Id)
		if err != nil || o.may(v.Root, access.Lookup, "") != nil {
			// The same refusal whether or not it exists.
			return nil, refuse(o.who, "look up volume "+what, syscall.EACCES)
		}
	}
	c := s.cfg.Cell
	if c == nil {
		v, err := s.localVolume(req.Name, req.Id)
		if err != nil {
			return nil, s.fail("Locate", err)
		}
		return &pb.Location{Id: v.ID, Name: v.Name, CreatedNs: v.Created.UnixNano(), Here: true}, nil
	}
	v, ro, ok := s.cellByName(req.Name)
	if req.Id != 0 {
		if v, ok = c.DB.Volume(req.Id); !ok {
			v, ok = c.DB.ByROID(req.Id)
			ro = ok
		}
	}
	if ro && len(v.RO) == 0 {
		ok = false // no release yet
	}
	if !ok {
		return nil, s.fail("Locate", fmt.Errorf("volume %s: %w", what, syscall.ENOENT))
	}
	if ro {
		return s.roLocation(v), nil
	}
	return s.location(v), nil
}

// mayListCell refuses an anonymous caller the cell's volumes and
// servers, unless the cell lets them list it.
func (s *Server) mayListCell(o *op) error {
	if !o.who.Anonymous() || s.cfg.AnonymousListing {
		return nil
	}
	return refuse(o.who, "learn the cell's volumes and servers without a token (a cell may allow it: hoard server --anonymous-listing)", syscall.EACCES)
}

// volumeExists checks that a mount point's target is a volume: of the
// cell, or of this server outside one.
func (s *Server) volumeExists(name string) error {
	name, _, _ = node.MountTarget(name)
	if c := s.cfg.Cell; c != nil {
		if _, _, ok := s.cellByName(name); !ok {
			return fmt.Errorf("volume %q: %w", name, syscall.ENOENT)
		}
		return nil
	}
	_, err := s.store.VolumeByName(name)
	return err
}

// caughtUp reports whether ok holds of this server's copy of the
// location database, or holds once the copy has caught up with etcd: a
// change made at another server a moment ago (a move begun, a site
// added) may not have reached it yet.
func (s *Server) caughtUp(ok func() bool) bool {
	if ok() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	return s.cfg.Cell.DB.CatchUp(ctx) == nil && ok()
}

// cellByName is the cell's volume named name; ro: the name is of its
// read-only copy. A name missing from this server's copy of the
// location database is looked for again once the copy has caught up
// with etcd: it may have been made at another server a moment ago.
func (s *Server) cellByName(name string) (v vldb.Volume, ro, ok bool) {
	if node.CheckVolumeName(strings.TrimSuffix(name, node.ReadOnlySuffix)) != nil {
		return byName(s.cfg.Cell.DB, name)
	}
	ok = s.caughtUp(func() bool {
		var found bool
		v, ro, found = byName(s.cfg.Cell.DB, name)
		return found
	})
	return v, ro, ok
}

func (s *Server) localVolume(name string, id uint64) (node.Volume, error) {
	if id != 0 {
		return s.store.VolumeByID(id)
	}
	return s.store.VolumeByName(name)
}

// location is v as the wire has it, with each site's address.
func (s *Server) location(v vldb.Volume) *pb.Location {
	c := s.cfg.Cell
	site := func(name string) *pb.Site {
		srv, _ := c.DB.Server(name)
		return &pb.Site{Name: name, Addr: srv.Addr}
	}
	l := &pb.Location{Id: v.ID, Name: v.Name, Rw: site(v.RW), Released: v.Released,
		CreatedNs: v.Created.UnixNano(), Here: v.RW == c.Name, Moving: v.Moving, RoId: v.ROID}
	for _, ro := range v.RO {
		l.Ro = append(l.Ro, site(ro))
	}
	for _, p := range v.Pending {
		l.Pending = append(l.Pending, site(p))
	}
	return l
}

// notHere refuses a request for a volume another server holds, telling
// the client where it is (the Location travels as the status's detail).
func notHere(l *pb.Location) error {
	st := status.New(codes.FailedPrecondition, fmt.Sprintf("volume %s is at server %s (%s)", l.Name, l.Rw.GetName(), l.Rw.GetAddr()))
	if d, err := st.WithDetails(l); err == nil {
		st = d
	}
	return st.Err()
}

// notHereByName refuses a request about volume name when another server
// of the cell holds it (notHere).
func (s *Server) notHereByName(name string) error {
	if c := s.cfg.Cell; c != nil {
		if v, ok := c.DB.ByName(name); ok && v.RW != c.Name {
			return notHere(s.location(v))
		}
	}
	return nil
}

// ListLocations lists every volume of the cell.
func (s *Server) ListLocations(ctx context.Context, req *pb.ListLocationsRequest) (*pb.ListLocationsReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.mayListCell(o); err != nil {
		return nil, err
	}
	out := &pb.ListLocationsReply{}
	if s.cfg.Cell == nil {
		vs, err := s.store.Volumes()
		if err != nil {
			return nil, s.fail("ListLocations", err)
		}
		for _, v := range vs {
			out.Locations = append(out.Locations, &pb.Location{Id: v.ID, Name: v.Name, CreatedNs: v.Created.UnixNano(), Here: true})
		}
		return out, nil
	}
	for _, v := range s.cfg.Cell.DB.Volumes() {
		out.Locations = append(out.Locations, s.location(v))
	}
	return out, nil
}

// ListServers lists the cell's servers with their liveness, space and
// how many volumes each holds read-write.
func (s *Server) ListServers(ctx context.Context, req *pb.ListServersRequest) (*pb.ListServersReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.mayListCell(o); err != nil {
		return nil, err
	}
	c := s.cfg.Cell
	if c == nil {
		return nil, status.Error(codes.FailedPrecondition, "this server is in no cell (a proxy, or a test server)")
	}
	count := map[string]uint32{}
	for _, v := range c.DB.Volumes() {
		count[v.RW]++
	}
	// Without its own lease this server cannot tell a server alive from
	// one whose key etcd could not expire for want of a quorum.
	out := &pb.ListServersReply{Stale: !c.DB.Holding()}
	for _, srv := range c.DB.Servers() {
		out.Servers = append(out.Servers, &pb.ServerInfo{Site: &pb.Site{Name: srv.Name, Addr: srv.Addr}, Alive: srv.Alive,
			Capacity: srv.Capacity, Free: srv.Free, Volumes: count[srv.Name], StartedNs: srv.Started.UnixNano()})
	}
	return out, nil
}

// createInCell places a new volume: on the server req.On names, or the
// alive one with the most free space. Another server's placement is
// answered with where to ask (notHere); this server's takes an id from
// the location database, then makes the volume, and if it cannot, gives
// the name back.
func (s *Server) createInCell(ctx context.Context, req *pb.CreateVolumeRequest) (node.Volume, error) {
	c := s.cfg.Cell
	if err := node.CheckVolumeName(req.Name); err != nil {
		return node.Volume{}, err
	}
	if _, ok := c.DB.ByName(req.Name); ok {
		return node.Volume{}, fmt.Errorf("volume %s: %w", req.Name, syscall.EEXIST)
	}
	on := req.On
	if on == "" {
		best, ok := c.DB.Place()
		if !ok {
			return node.Volume{}, status.Error(codes.Aborted, "no server of the cell is alive to place the volume on")
		}
		on = best.Name
	}
	target, ok := c.DB.Server(on)
	switch {
	case !ok:
		return node.Volume{}, status.Errorf(codes.NotFound, "no server %s in the cell", on)
	case on != c.Name:
		return node.Volume{}, notHere(&pb.Location{Name: req.Name, Rw: &pb.Site{Name: on, Addr: target.Addr}})
	}
	vs, ok := s.local.(volumeStore)
	if !ok {
		return node.Volume{}, status.Error(codes.FailedPrecondition, "volumes are made at file servers")
	}
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	v, err := c.DB.Create(ctx, vldb.Volume{Name: req.Name, RW: c.Name})
	if err != nil {
		return node.Volume{}, cellErr(err)
	}
	made, err := vs.CreateVolumeID(v.ID, v.Name)
	if err != nil {
		if rerr := c.DB.Remove(context.WithoutCancel(ctx), v.ID); rerr != nil {
			s.log.Error("volume not made, and its location not given back", "name", v.Name, "id", v.ID, "err", rerr)
		}
		return node.Volume{}, err
	}
	return made, nil
}

// cellErr is a location database error as the wire carries it.
func cellErr(err error) error {
	switch {
	case errors.Is(err, vldb.ErrExists):
		return fmt.Errorf("%v: %w", err, syscall.EEXIST)
	case errors.Is(err, vldb.ErrNotFound):
		return fmt.Errorf("%v: %w", err, syscall.ENOENT)
	}
	// Aborted, not Unavailable: the server answered, and a client must
	// not wait out its timeout sending it again.
	return status.Error(codes.Aborted, err.Error())
}

// RemoveVolume deletes a volume (admins): its location first, so that
// nobody is sent to it, then its files. The root volume stays.
func (s *Server) RemoveVolume(ctx context.Context, req *pb.RemoveVolumeRequest) (*pb.RemoveVolumeReply, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := o.admin("remove volume " + req.Name); err != nil {
		return nil, err
	}
	if req.Name == node.RootVolume {
		return nil, s.fail("RemoveVolume", fmt.Errorf("volume %s holds the cell's tree and is not removed: %w", req.Name, syscall.EPERM))
	}
	vs, ok := s.local.(volumeStore)
	if !ok {
		return nil, status.Error(codes.FailedPrecondition, "volumes are removed at file servers")
	}
	var id uint64
	if c := s.cfg.Cell; c != nil {
		v, ok := c.DB.ByName(req.Name)
		if !ok {
			return nil, s.fail("RemoveVolume", fmt.Errorf("volume %s: %w", req.Name, syscall.ENOENT))
		}
		if err := s.notHereByName(req.Name); err != nil {
			return nil, err
		}
		if v.Moving != "" {
			return nil, status.Errorf(codes.FailedPrecondition, "a move of volume %s to %s is unfinished: run it again, or move the volume to %s to undo it, first", v.Name, v.Moving, c.Name)
		}
		if len(v.RO)+len(v.Pending) > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s has read-only sites: remove them first (hoard vol remsite)", v.Name)
		}
		ctx, cancel := context.WithTimeout(ctx, dbTimeout)
		defer cancel()
		if err := c.DB.Remove(ctx, v.ID); err != nil {
			return nil, s.fail("RemoveVolume", cellErr(err))
		}
		id = v.ID
	} else {
		v, err := s.store.VolumeByName(req.Name)
		if err != nil {
			return nil, s.fail("RemoveVolume", err)
		}
		id = v.ID
	}
	if err := vs.RemoveVolume(id); err != nil {
		return nil, s.fail("RemoveVolume", err)
	}
	s.log.Info("volume removed", "name", req.Name, "id", id)
	return &pb.RemoveVolumeReply{}, nil
}

// JoinCell makes store's volumes and the location database agree at a
// server's start, as the server named self:
//   - a volume here the database does not know is registered, with its id;
//   - a volume the database places here but that is missing (a creation a
//     crash interrupted) is made, empty: nothing was acknowledged in it;
//   - the empty root volume a new store makes is dropped when the cell's
//     root is elsewhere (a server joining a cell);
//   - a copy of a volume the cell holds elsewhere (left by a move) is
//     dropped;
//   - any other disagreement (a name or id the cell gives another server)
//     stops the start: serving it would give clients two versions.
func JoinCell(store *vnode.Store, db *vldb.DB, self string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	local, err := store.Volumes()
	if err != nil {
		return err
	}
	here := map[uint64]bool{}
	for _, v := range local {
		if rw, isCopy := db.ByROID(v.ID); isCopy {
			// A read-only copy: kept while this server is one of its sites.
			if !slices.Contains(rw.RO, self) && !slices.Contains(rw.Pending, self) {
				slog.Warn("dropping a read-only copy this server is no longer a site of", "volume", rw.Name+node.ReadOnlySuffix, "id", v.ID)
				if err := store.RemoveVolume(v.ID); err != nil {
					return err
				}
			}
			continue
		}
		cv, known := db.Volume(v.ID)
		byName, named := db.ByName(v.Name)
		switch {
		case known && cv.Name == v.Name && cv.RW == self:
			here[v.ID] = true
		case v.Name == node.RootVolume && named && byName.RW != self && store.Pristine(v.ID):
			if err := store.RemoveVolume(v.ID); err != nil {
				return err
			}
		case !known && !named:
			if _, err := db.Create(ctx, vldb.Volume{ID: v.ID, Name: v.Name, RW: self, Created: v.Created}); err != nil {
				return fmt.Errorf("registering volume %s (id %d): %w", v.Name, v.ID, err)
			}
			here[v.ID] = true
		case known && cv.Name == v.Name:
			// Moved away (the copy outlived the move's end), or received by
			// a move that did not finish: the cell's copy is elsewhere.
			slog.Warn("dropping a copy of a volume the cell holds at another server (a move's)", "volume", v.Name, "id", v.ID, "at", cv.RW)
			if err := store.RemoveVolume(v.ID); err != nil {
				return err
			}
		case known:
			return fmt.Errorf("volume %s (id %d) here, but the cell's volume %d is %s at server %s: this data directory is not of this cell", v.Name, v.ID, v.ID, cv.Name, cv.RW)
		default:
			return fmt.Errorf("volume %s (id %d) here, but the cell's %s is id %d at server %s: this data directory is not of this cell", v.Name, v.ID, v.Name, byName.ID, byName.RW)
		}
	}
	for _, v := range db.Volumes() {
		if v.RW == self && !here[v.ID] {
			if _, err := store.CreateVolumeID(v.ID, v.Name); err != nil {
				return fmt.Errorf("making volume %s (id %d), placed here: %w", v.Name, v.ID, err)
			}
		}
	}
	if _, ok := db.ByName(node.RootVolume); !ok {
		v, err := store.CreateVolume(node.RootVolume)
		if err != nil {
			return err
		}
		if _, err := db.Create(ctx, vldb.Volume{ID: v.ID, Name: v.Name, RW: self, Created: v.Created}); err != nil {
			return fmt.Errorf("registering volume %s: %w", v.Name, err)
		}
	}
	return nil
}
