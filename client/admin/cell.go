package admin

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/client/site"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Site is a file server of the cell.
type Site struct {
	Name, Addr string
}

// Location is where a volume lives.
type Location struct {
	ID   uint64
	Name string
	// RW holds the read-write volume; RO the read-only copies of the
	// last release, Pending the sites added since.
	RW      Site
	RO      []Site
	Pending []Site
	// Released counts the releases (0: never); ROID is the read-only
	// copies' id.
	Released uint64
	ROID     uint64
	Created  time.Time
	// Moving names the server an unfinished move is taking it to.
	Moving string
}

// Server is a file server as the location database has it.
type Server struct {
	Site
	// Alive: it holds its lease in the location database, as the server
	// answering saw last; Unknown: that server has lost its own lease
	// (etcd unreachable from it, or without a quorum), so Alive may be
	// out of date.
	Alive, Unknown bool
	Capacity, Free uint64
	Volumes        int
	Started        time.Time
}

func toSite(s *pb.Site) Site { return Site{Name: s.GetName(), Addr: s.GetAddr()} }

func toLocation(l *pb.Location) Location {
	out := Location{ID: l.Id, Name: l.Name, RW: toSite(l.Rw), Released: l.Released, ROID: l.RoId, Created: time.Unix(0, l.CreatedNs), Moving: l.Moving}
	for _, ro := range l.Ro {
		out.RO = append(out.RO, toSite(ro))
	}
	for _, p := range l.Pending {
		out.Pending = append(out.Pending, toSite(p))
	}
	return out
}

// atVolume runs call at the first server and, if it answers that the
// volume is at another, there: call is told which server it asks (on).
func (adm Admin) atVolume(call func(s *site.Site, on string) error) error {
	err := call(adm.sites.First(), "")
	if l := site.WhereIs(err); l != nil {
		s, serr := adm.sites.Server(l.Rw)
		if serr != nil {
			return serr
		}
		return call(s, l.Rw.Name)
	}
	return err
}

// CreateVolume makes a new volume on the server of the cell with the most
// free space; MountVolume attaches it to the tree.
func (adm Admin) CreateVolume(name string) (Volume, error) { return adm.CreateVolumeOn(name, "") }

// CreateVolumeOn makes a new volume on server on ("": where the cell
// places it).
func (adm Admin) CreateVolumeOn(name, on string) (Volume, error) {
	var v *pb.Volume
	err := adm.atVolume(func(s *site.Site, there string) error {
		if there != "" {
			on = there
		}
		return s.Conn.Call(func(ctx context.Context) (err error) {
			v, err = s.RPC.CreateVolume(ctx, &pb.CreateVolumeRequest{Name: name, On: on})
			return err
		})
	})
	if err != nil {
		return Volume{}, cellErrOf("create volume", name, err)
	}
	return VolumeOf(v), nil
}

// RemoveVolume deletes a volume and everything in it, wherever it is.
func (adm Admin) RemoveVolume(name string) error {
	err := adm.atVolume(func(s *site.Site, _ string) error {
		return s.Conn.Call(func(ctx context.Context) error {
			_, err := s.RPC.RemoveVolume(ctx, &pb.RemoveVolumeRequest{Name: name})
			return err
		})
	})
	adm.sites.Forget(name)
	return cellErrOf("remove volume", name, err)
}

// ask calls the first server, which answers for the cell from its copy
// of the location database; a refusal is an error of op on name.
func ask[T any](adm Admin, op, name string, call func(context.Context, pb.FileServerClient) (T, error)) (T, error) {
	var out T
	f := adm.sites.First()
	err := f.Conn.Call(func(ctx context.Context) (err error) {
		out, err = call(ctx, f.RPC)
		return err
	})
	return out, cellErrOf(op, name, err)
}

// locate asks the first server where volume name lives, for op.
func (adm Admin) locate(op, name string) (*pb.Location, error) {
	return ask(adm, op, name, func(ctx context.Context, rpc pb.FileServerClient) (*pb.Location, error) {
		return rpc.Locate(ctx, &pb.LocateRequest{Name: name})
	})
}

// Locate says where volume name lives, asking the server (not the
// locations this client keeps).
func (adm Admin) Locate(name string) (Location, error) {
	l, err := adm.locate("locate volume", name)
	if err != nil {
		return Location{}, err
	}
	return toLocation(l), nil
}

// Servers lists the cell's file servers.
func (adm Admin) Servers() ([]Server, error) {
	r, err := ask(adm, "list servers", "", func(ctx context.Context, rpc pb.FileServerClient) (*pb.ListServersReply, error) {
		return rpc.ListServers(ctx, &pb.ListServersRequest{})
	})
	if err != nil {
		return nil, err
	}
	out := make([]Server, len(r.Servers))
	for i, s := range r.Servers {
		out[i] = Server{Site: toSite(s.Site), Alive: s.Alive, Unknown: r.Stale, Capacity: s.Capacity, Free: s.Free,
			Volumes: int(s.Volumes), Started: time.Unix(0, s.StartedNs)}
	}
	return out, nil
}

// VolumeInfo is a volume as its server has it (sizes, quota) and where
// it lives.
type VolumeInfo struct {
	Volume
	Location
	// Unknown says why the sizes are missing: its server did not answer
	// (VolumeInfos lists the volume all the same).
	Unknown error
}

// VolumeInfos lists every volume of the cell with its sizes: one request
// to each server holding some.
func (adm Admin) VolumeInfos() ([]VolumeInfo, error) {
	r, err := ask(adm, "list volumes", "", func(ctx context.Context, rpc pb.FileServerClient) (*pb.ListLocationsReply, error) {
		return rpc.ListLocations(ctx, &pb.ListLocationsRequest{})
	})
	if err != nil {
		return nil, err
	}
	// Each server is asked for its volumes' sizes once; one that does not
	// answer leaves its volumes listed without them.
	sizes := map[string]map[uint64]*pb.Volume{}
	failed := map[string]error{}
	out := make([]VolumeInfo, 0, len(r.Locations))
	for _, l := range r.Locations {
		info := VolumeInfo{Location: toLocation(l), Volume: Volume{ID: l.Id, Name: l.Name, Created: time.Unix(0, l.CreatedNs)}}
		key := info.RW.Name
		if l.ReadOnly {
			key = fmt.Sprint("ro", info.RO)
		}
		if sizes[key] == nil && failed[key] == nil {
			sizes[key], failed[key] = adm.volumeSizes(l)
		}
		if v := sizes[key][l.Id]; v != nil {
			info.Volume = VolumeOf(v)
		}
		info.Unknown = failed[key]
		out = append(out, info)
	}
	return out, nil
}

// volumeSizes asks the server holding the volume l names for all its
// volumes' sizes, by id.
func (adm Admin) volumeSizes(l *pb.Location) (map[uint64]*pb.Volume, error) {
	s, err := adm.sites.For(l)
	if err != nil {
		return nil, err
	}
	var vr *pb.ListVolumesReply
	if err := s.Conn.Call(func(ctx context.Context) (err error) {
		vr, err = s.RPC.ListVolumes(ctx, &pb.ListVolumesRequest{})
		return err
	}); err != nil {
		return nil, cellErrOf("list volumes", l.Rw.GetName(), err)
	}
	vs := map[uint64]*pb.Volume{}
	for _, v := range vr.Volumes {
		vs[v.Id] = v
	}
	return vs, nil
}

// Examine is one volume with its sizes and where it lives.
func (adm Admin) Examine(name string) (VolumeInfo, error) {
	l, err := adm.locate("examine volume", name)
	if err != nil {
		return VolumeInfo{}, err
	}
	s, err := adm.sites.For(l)
	if err != nil {
		return VolumeInfo{}, err
	}
	var v *pb.Volume
	if err := s.Conn.Call(func(ctx context.Context) (err error) {
		v, err = s.RPC.GetVolume(ctx, &pb.GetVolumeRequest{Name: name})
		return err
	}); err != nil {
		return VolumeInfo{}, cellErrOf("examine volume", name, err)
	}
	return VolumeInfo{Volume: VolumeOf(v), Location: toLocation(l)}, nil
}

// cellError is a refusal of a cell operation in the server's words (no
// such server, the name taken, the lease lost say more than an errno),
// still an errno to errors.Is.
type cellError struct {
	msg   string
	errno syscall.Errno
}

func (e *cellError) Error() string { return e.msg }
func (e *cellError) Unwrap() error { return e.errno }

func cellErrOf(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if name != "" {
		op += " " + name
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", op, err)
	}
	return &cellError{op + ": " + st.Message(), pb.Errno(err)}
}

// Volume describes a volume of the cell.
type Volume struct {
	ID      uint64
	Name    string
	Root    node.FID
	Created time.Time
	// Quota bounds the bytes of the volume's files (0: none); Used is
	// what they hold, Files how many files and directories it has.
	Quota, Used, Files uint64
}

// VolumeOf is v as a Volume.
func VolumeOf(v *pb.Volume) Volume {
	return Volume{ID: v.Id, Name: v.Name, Root: v.Root.ToFID(), Created: time.Unix(0, v.CreatedNs), Quota: v.Quota, Used: v.Used, Files: v.Files}
}

// Volumes lists the cell's volumes.
func (adm Admin) Volumes() ([]Volume, error) {
	var r *pb.ListVolumesReply
	err := adm.sites.First().Conn.Call(func(ctx context.Context) (err error) {
		r, err = adm.sites.First().RPC.ListVolumes(ctx, &pb.ListVolumesRequest{})
		return err
	})
	if err != nil {
		return nil, site.ErrOf("list volumes", "", err)
	}
	out := make([]Volume, len(r.Volumes))
	for i, v := range r.Volumes {
		out[i] = VolumeOf(v)
	}
	return out, nil
}

// SetQuota bounds the bytes of volume's files (0: no bound); only an
// administrator may. Stores past it fail with EDQUOT.
func (adm Admin) SetQuota(volume string, quota uint64) (Volume, error) {
	var v *pb.Volume
	err := adm.atVolume(func(s *site.Site, _ string) error {
		return s.Conn.Call(func(ctx context.Context) (err error) {
			v, err = s.RPC.SetVolume(ctx, &pb.SetVolumeRequest{Name: volume, Quota: quota})
			return err
		})
	})
	if err != nil {
		return Volume{}, cellErrOf("set quota of volume", volume, err)
	}
	return VolumeOf(v), nil
}
