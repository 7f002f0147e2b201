package server

import (
	"context"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// SetVolume sets a volume's quota (0 removes it); only an administrator
// may. A quota below what the volume uses already is taken: its files
// may then only shrink.
func (s *Server) SetVolume(ctx context.Context, req *pb.SetVolumeRequest) (*pb.Volume, error) {
	o, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if err := o.admin("set volume " + req.Name); err != nil {
		return nil, err
	}
	if err := s.notHereByName(req.Name); err != nil {
		return nil, err
	}
	// A quota is the volume's: a move's last pass must carry it.
	cur, err := s.store.VolumeByName(req.Name)
	if err != nil {
		return nil, s.fail("SetVolume", err)
	}
	leave, err := s.enter(cur.ID)
	if err != nil {
		return nil, err
	}
	defer leave()
	v, err := s.store.SetQuota(req.Name, req.Quota)
	if err != nil {
		return nil, s.fail("SetVolume", err)
	}
	s.log.Info("volume quota set", "name", v.Name, "quota", v.Quota, "used", v.Used)
	return fromVolume(v), nil
}

// withQuota is fs as seen from volume v: a volume with a quota is as
// large as its quota, and as full as its files make it, so that df on a
// mount shows what a writer there has left.
func withQuota(fs node.FSStat, v node.Volume) node.FSStat {
	if v.Quota == 0 || fs.BlockSize == 0 {
		return fs
	}
	fs.Blocks = v.Quota / fs.BlockSize
	fs.BlocksFree = (v.Quota - min(v.Quota, v.Used)) / fs.BlockSize
	return fs
}
