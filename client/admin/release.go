package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hoardfs/hoard/client/site"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// ReleaseReport says what a release did.
type ReleaseReport struct {
	// Sites are the read-only sites the release reached; Bytes the data
	// files' bytes sent to them and MetaBytes the metadata's (sent whole
	// at each pass: small files' bytes are in it), in Passes passes each;
	// Freeze how long changes to the read-write volume waited; Took the
	// whole release.
	Sites     []string
	Passes    int
	Bytes     int64
	MetaBytes int64
	Freeze    time.Duration
	Took      time.Duration
}

// AddSite makes server a read-only site of volume name; the next release
// reaches it.
func (adm Admin) AddSite(name, server string) error {
	return adm.siteStep(name, server, pb.ReleaseVolumeRequest_ADD_SITE)
}

// RemoveSite makes server no longer a read-only site of volume name, and
// drops its copy there.
func (adm Admin) RemoveSite(name, server string) error {
	if err := adm.siteStep(name, server, pb.ReleaseVolumeRequest_REMOVE_SITE); err != nil {
		return err
	}
	dst, err := adm.serverNamed(server)
	if err == nil {
		_, err = releaseStep(dst, &pb.ReleaseVolumeRequest{Name: name, Step: pb.ReleaseVolumeRequest_REMOVE_SITE, Site: server})
	}
	if err != nil {
		return fmt.Errorf("volume %s: %s is no longer a read-only site, but its copy there stays until it restarts: %w", name, server, err)
	}
	return nil
}

// siteStep runs an ADD_SITE or REMOVE_SITE at the volume's server.
func (adm Admin) siteStep(name, server string, step pb.ReleaseVolumeRequest_Step) error {
	src, err := adm.rwSite(name)
	if err != nil {
		return err
	}
	_, err = releaseStep(src, &pb.ReleaseVolumeRequest{Name: name, Step: step, Site: server})
	return err
}

// rwSite is the site of the server holding volume name read-write.
func (adm Admin) rwSite(name string) (*site.Site, error) {
	l, err := adm.locate("volume", name)
	if err != nil {
		return nil, err
	}
	return adm.sites.For(l)
}

// serverNamed is the site of the cell's server named name.
func (adm Admin) serverNamed(name string) (*site.Site, error) {
	servers, err := adm.Servers()
	if err != nil {
		return nil, err
	}
	for _, s := range servers {
		if s.Name == name {
			return adm.sites.Server(&pb.Site{Name: s.Name, Addr: s.Addr})
		}
	}
	return nil, fmt.Errorf("no server %s in the cell", name)
}

func releaseStep(s *site.Site, req *pb.ReleaseVolumeRequest) (*pb.ReleaseVolumeReply, error) {
	var reply *pb.ReleaseVolumeReply
	err := s.As(s.Self).CallPatient(movePatience, func(ctx context.Context) (err error) {
		reply, err = s.RPC.ReleaseVolume(ctx, req)
		return err
	})
	return reply, cellErrOf(fmt.Sprintf("release volume %s (%s)", req.Name, req.Step), "", err)
}

// Release publishes volume name as it is now to its read-only sites
// (server/release.go has the steps). Only what changed since a site's
// last release is sent to it. A site the release does not reach (down)
// keeps the copy it had, and the release says so in its error: each site
// has one release or the next, never a mix.
func (adm Admin) Release(name string) (ReleaseReport, error) {
	start := time.Now()
	var rep ReleaseReport
	l, err := adm.locate("release volume", name)
	if err != nil {
		return rep, err
	}
	all := append(slices.Clone(l.Ro), l.Pending...)
	if len(all) == 0 {
		return rep, fmt.Errorf("release volume %s: it has no read-only sites: add one with hoard vol addsite %s SERVER", name, name)
	}
	src, err := adm.sites.For(l)
	if err != nil {
		return rep, err
	}
	type target struct {
		name string
		c    *site.Site
		have []*pb.FileVersion
	}
	var targets []*target
	var missed []error
	for _, site := range all {
		t := &target{name: site.Name}
		hr, err := func() (*pb.ReleaseVolumeReply, error) {
			if t.c, err = adm.sites.Server(site); err != nil {
				return nil, err
			}
			return releaseStep(t.c, &pb.ReleaseVolumeRequest{Name: name, Step: pb.ReleaseVolumeRequest_HAVE})
		}()
		if err != nil {
			missed = append(missed, fmt.Errorf("read-only site %s keeps its last release: %w", site.Name, err))
			continue
		}
		t.have = hr.Have
		targets = append(targets, t)
	}
	if len(targets) == 0 {
		return rep, errors.Join(missed...)
	}
	// passAll sends a pass to each target, and returns those it reached;
	// a site it did not reach keeps its copy and is in missed. Files
	// changing while frozen (none should) are sent again.
	passAll := func(targets []*target, publish bool) (reached []*target) {
		for _, t := range targets {
			var err error
			for try := 0; try <= maxFinalPasses; try++ {
				var r *pb.RestoreVolumeReply
				r, err = copyPass(src, t.c, name, t.have, func(p *pb.DumpPiece) {
					p.Release = true
					p.Publish = p.End && publish
					for _, kv := range p.Meta {
						rep.MetaBytes += int64(len(kv.Key) + len(kv.Value))
					}
				})
				if err != nil {
					break
				}
				rep.Bytes += int64(r.Bytes)
				t.have = r.Have
				if !publish || r.Abandoned == 0 {
					break
				}
				err = fmt.Errorf("release volume %s: files kept changing while frozen", name)
			}
			if err != nil {
				missed = append(missed, fmt.Errorf("read-only site %s keeps its last release: %w", t.name, err))
				continue
			}
			reached = append(reached, t)
		}
		return reached
	}
	// A first pass while the volume is in use brings what changed, a
	// second what the writers stored when recalled; the last, frozen,
	// brings what changed since and publishes.
	var frozen time.Time
	var published []string
	err = func() error {
		for _, step := range []pb.ReleaseVolumeRequest_Step{pb.ReleaseVolumeRequest_QUIESCE, pb.ReleaseVolumeRequest_FREEZE} {
			if targets = passAll(targets, false); len(targets) == 0 {
				return errors.Join(missed...)
			}
			rep.Passes++
			if _, err := releaseStep(src, &pb.ReleaseVolumeRequest{Name: name, Step: step}); err != nil {
				return err
			}
		}
		frozen = time.Now()
		for _, t := range passAll(targets, true) {
			published = append(published, t.name)
		}
		rep.Passes++
		return errors.Join(missed...)
	}()
	if !frozen.IsZero() {
		rep.Freeze = time.Since(frozen)
	}
	step := pb.ReleaseVolumeRequest_COMMIT
	if len(published) == 0 {
		step = pb.ReleaseVolumeRequest_ABORT
	}
	if _, cerr := releaseStep(src, &pb.ReleaseVolumeRequest{Name: name, Step: step, Site: strings.Join(published, ",")}); err == nil {
		err = cerr
	}
	rep.Sites, rep.Took = published, time.Since(start)
	adm.sites.Forget(name + node.ReadOnlySuffix)
	return rep, err
}
