package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hoardfs/hoard/client/site"
	pb "github.com/hoardfs/hoard/hoardpb"
)

// MoveReport says what a move did.
type MoveReport struct {
	// Passes copied Bytes of data files; Freeze is how long the source
	// refused changes, Took the whole move.
	Passes int
	Bytes  int64
	Freeze time.Duration
	Took   time.Duration
	// Already: the volume was where it was asked to go; Undone: and an
	// unfinished move elsewhere was undone.
	Already, Undone bool
}

// maxFinalPasses bounds the frozen passes that may find files changing
// (none should: nothing changes while frozen).
const maxFinalPasses = 3

// MoveVolume moves volume name to server to while clients use it
// (server/move.go has the steps). A move that fails is undone: the volume
// stays where it was. Run again, it finishes a move a dead mover left;
// asked to move a volume to where it is while a move of it is unfinished,
// it undoes that move.
func (adm Admin) MoveVolume(name, to string) (MoveReport, error) {
	start := time.Now()
	var rep MoveReport
	l, err := adm.locate("move volume", name)
	if err != nil {
		return rep, err
	}
	src, err := adm.sites.For(l)
	if err != nil {
		return rep, err
	}
	if l.Rw.GetName() == to {
		rep.Already = true
		if l.Moving == "" {
			return rep, nil
		}
		rep.Undone = true
		return rep, adm.undoMove(src, name, l.Moving)
	}
	dst, err := adm.serverNamed(to)
	if err != nil {
		return rep, fmt.Errorf("move volume %s: %w", name, err)
	}
	if err := moveStep(src, name, to, pb.MoveVolumeRequest_BEGIN); err != nil {
		return rep, err
	}
	var frozen time.Time
	err = func() error {
		var have []*pb.FileVersion
		// A copy while it is in use, one after the holders stored what
		// they held, then the frozen ones.
		for pass := 0; ; pass++ {
			switch pass {
			case 1:
				if err := moveStep(src, name, to, pb.MoveVolumeRequest_QUIESCE); err != nil {
					return err
				}
			case 2:
				if err := moveStep(src, name, to, pb.MoveVolumeRequest_FREEZE); err != nil {
					return err
				}
				frozen = time.Now()
			}
			r, err := copyPass(src, dst, name, have, nil)
			if err != nil {
				return err
			}
			rep.Passes++
			rep.Bytes += int64(r.Bytes)
			have = r.Have
			switch {
			case pass >= 2 && r.Abandoned == 0:
				return moveStep(src, name, to, pb.MoveVolumeRequest_COMMIT)
			case pass >= 1+maxFinalPasses:
				return fmt.Errorf("move volume %s: files kept changing while frozen", name)
			}
		}
	}()
	if err != nil {
		if uerr := adm.undoMove(src, name, to); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return rep, err
	}
	rep.Freeze, rep.Took = time.Since(frozen), time.Since(start)
	adm.sites.Forget(name)
	return rep, nil
}

// undoMove ends an unfinished move of name to to: the source serves the
// volume as before, the target drops what it received.
func (adm Admin) undoMove(src *site.Site, name, to string) error {
	err := moveStep(src, name, "", pb.MoveVolumeRequest_ABORT)
	servers, serr := adm.Servers()
	for _, s := range servers {
		if s.Name == to {
			dst, derr := adm.sites.Server(&pb.Site{Name: s.Name, Addr: s.Addr})
			if derr == nil {
				derr = moveStep(dst, name, "", pb.MoveVolumeRequest_ABORT)
			}
			serr = errors.Join(serr, derr)
		}
	}
	return errors.Join(err, serr)
}

// movePatience is how long a move waits for a server it cannot reach
// before it fails (and is undone): a move is better run again than left
// waiting with the volume quiet or frozen.
const movePatience = 5 * time.Second

func moveStep(s *site.Site, name, to string, step pb.MoveVolumeRequest_Step) error {
	err := s.As(s.Self).CallPatient(movePatience, func(ctx context.Context) error {
		_, err := s.RPC.MoveVolume(ctx, &pb.MoveVolumeRequest{Name: name, To: to, Step: step})
		return err
	})
	return cellErrOf(fmt.Sprintf("move volume %s (%s)", name, step), "", err)
}

// copyPass pipes one dump of name from src into dst; mark, if set, sees
// each piece on its way (a release marks the first and the last).
func copyPass(src, dst *site.Site, name string, have []*pb.FileVersion, mark func(*pb.DumpPiece)) (*pb.RestoreVolumeReply, error) {
	var reply *pb.RestoreVolumeReply
	err := dst.As(dst.Self).CallPatient(movePatience, func(dctx context.Context) error {
		rs, err := dst.RPC.RestoreVolume(dctx)
		if err != nil {
			return err
		}
		err = src.As(src.Self).CallPatient(movePatience, func(sctx context.Context) error {
			ds, err := src.RPC.DumpVolume(sctx, &pb.DumpVolumeRequest{Name: name, Have: have})
			if err != nil {
				return err
			}
			for {
				p, err := ds.Recv()
				if err == io.EOF {
					return nil
				}
				if err != nil {
					return err
				}
				if mark != nil {
					mark(p)
				}
				if err := rs.Send(p); err == io.EOF {
					return nil // the target ended it: CloseAndRecv says why
				} else if err != nil {
					return err
				}
			}
		})
		if err != nil {
			rs.CloseSend()
			return err
		}
		reply, err = rs.CloseAndRecv()
		return err
	})
	return reply, cellErrOf("move volume", name, err)
}
