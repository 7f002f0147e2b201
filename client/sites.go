package client

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/hoardfs/hoard/hoardpb"
)

// sites are the file servers of a cell one client reaches: the server it
// was dialled to, and a session with each other server it found a volume
// on (FIDs are unique in a cell). A Node belongs to the site of the server
// holding its volume, and every request about it goes there.
//
// Locations are asked of the first server, which answers from its copy
// of the cell's location database (clients never talk to etcd), and kept
// until a server says the volume is not there (moved).
type sites struct {
	c     *Client
	first *site

	mu     sync.Mutex
	byName map[string]*site        // other servers' sessions, by server name (read-only copies': roKey)
	locs   map[string]*pb.Location // by volume name
	byID   map[uint64]*pb.Location
	asked  map[string]time.Time // when locs' entries were asked for
	// firstName is the first server's name in the cell, once a location
	// answered by it as its own said it.
	firstName string
	closed    bool
	// down: when a read-only copy's site (by address) last failed to
	// answer (replica.go).
	down map[string]time.Time

	dialing singleflight.Group
	moving  singleflight.Group
}

func newSites(c *Client) *sites {
	return &sites{c: c, byName: map[string]*site{}, locs: map[string]*pb.Location{}, byID: map[uint64]*pb.Location{},
		asked: map[string]time.Time{}, down: map[string]time.Time{}}
}

// locate is where volume name lives, asked of the first server as u.
// A server from before cells (no Locate) holds every volume it knows.
func (s *sites) locate(name string, u User) (*pb.Location, error) {
	s.mu.Lock()
	l, asked := s.locs[name], s.asked[name]
	s.mu.Unlock()
	if l != nil && time.Since(asked) < locationTTL {
		return l, nil
	}
	return s.ask(&pb.LocateRequest{Name: name}, u)
}

// locationTTL is how long a volume's location is kept before a mount
// point crossing asks again: a move is followed at once (the old server
// says so), but a first release, which makes the volume's mount points
// lead to its read-only copy, is learnt only by asking.
const locationTTL = time.Minute

// locateID is locate of the volume with id (a FID's, for a proxy).
func (s *sites) locateID(id uint64, u User) (*pb.Location, error) {
	s.mu.Lock()
	l := s.byID[id]
	s.mu.Unlock()
	if l != nil {
		return l, nil
	}
	return s.ask(&pb.LocateRequest{Id: id}, u)
}

// ask asks the first server where a volume is, and keeps the answer.
func (s *sites) ask(req *pb.LocateRequest, u User) (*pb.Location, error) {
	var l *pb.Location
	f := s.first
	err := f.as(u).Call(func(ctx context.Context) (err error) {
		l, err = f.rpc.Locate(ctx, req)
		return err
	})
	if status.Code(err) == codes.Unimplemented {
		l, err = &pb.Location{Id: req.Id, Name: req.Name, Here: true}, nil
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if l.Here && l.Rw.GetName() != "" {
		s.firstName = l.Rw.Name
	}
	if l.Name != "" {
		s.locs[l.Name], s.asked[l.Name] = l, time.Now()
	}
	if l.Id != 0 {
		s.byID[l.Id] = l
	}
	s.mu.Unlock()
	return l, nil
}

// stale forgets what is kept of volume name when err says it is not
// where it was thought, and reports whether it should be located again.
func (s *sites) stale(name string, err error) bool {
	if whereIs(err) == nil && pb.Errno(err) != syscall.ENOENT && pb.Errno(err) != syscall.ESTALE {
		return false
	}
	s.forget(name)
	return true
}

// forget drops what is kept of volume name: where it is, its root.
func (s *sites) forget(name string) {
	s.mu.Lock()
	if l := s.locs[name]; l != nil {
		delete(s.byID, l.Id)
	}
	delete(s.locs, name)
	delete(s.asked, name)
	s.mu.Unlock()
	s.c.volMu.Lock()
	delete(s.c.vols, name)
	s.c.volMu.Unlock()
}

// siteOf is the site of the server holding volume name.
func (s *sites) siteOf(name string, u User) (*site, error) {
	l, err := s.locate(name, u)
	if err != nil {
		return nil, err
	}
	return s.siteFor(l)
}

// siteFor is the site of the server holding the volume l names.
func (s *sites) siteFor(l *pb.Location) (*site, error) {
	switch {
	case l.ReadOnly:
		return s.roSite(l)
	case l.Here:
		return s.first, nil
	}
	return s.site(l.Rw)
}

// siteOfID is the site of the server holding volume id.
func (s *sites) siteOfID(id uint64, u User) (*site, error) {
	l, err := s.locateID(id, u)
	if err != nil {
		return nil, err
	}
	return s.siteFor(l)
}

// site is the session with server to, begun on first use.
func (s *sites) site(to *pb.Site) (*site, error) { return s.dial(to.GetName(), to, 0) }

// dial is the session kept as key, with server to, waiting patience for
// it when unreachable (0: the RPC timeout), begun on first use.
func (s *sites) dial(key string, to *pb.Site, patience time.Duration) (*site, error) {
	if to.GetName() == "" || to.GetAddr() == "" {
		return nil, fmt.Errorf("the location database names no address for a server: %w", errors.ErrUnsupported)
	}
	s.mu.Lock()
	at := s.byName[key]
	s.mu.Unlock()
	if at != nil {
		return at, nil
	}
	v, err, _ := s.dialing.Do(key, func() (any, error) {
		s.mu.Lock()
		if at := s.byName[key]; at != nil || s.closed {
			s.mu.Unlock()
			if at == nil {
				return nil, errors.New("client closed")
			}
			return at, nil
		}
		s.mu.Unlock()
		opts := s.c.opts
		if patience == 0 {
			patience = opts.Patience
		}
		sessionFile := ""
		if opts.KeepSession && opts.CacheDir != "" {
			sessionFile = filepath.Join(opts.CacheDir, "session."+key)
		}
		at, err := s.c.start(to.Addr, sessionFile, patience)
		if err != nil {
			return nil, fmt.Errorf("server %s of the cell: %w", to.Name, err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			go at.conn.Close()
			return nil, errors.New("client closed")
		}
		s.byName[key] = at
		return at, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*site), nil
}

// moved follows a volume to the server holding it now, as l (another
// server's refusal) says: the nodes of the volume move to that server's
// site, without their promises (the old server broke them before the
// move) and without taking their locks (the caller may hold one). The
// refusal is believed over the first server's copy of the location
// database, which may not have seen the move yet.
func (s *sites) moved(l *pb.Location) {
	s.moving.Do(fmt.Sprint(l.Id), func() (any, error) {
		to, err := s.siteOfRW(l.Rw)
		if l.ReadOnly {
			to, err = s.roSite(l)
		}
		if err != nil {
			return nil, err
		}
		s.movedTo(l.Id, to)
		return nil, nil
	})
}

// movedTo hands volume id's nodes to site to, and forgets where the
// volume was.
func (s *sites) movedTo(id uint64, to *site) {
	s.mu.Lock()
	if old := s.byID[id]; old != nil {
		delete(s.locs, old.Name)
	}
	delete(s.byID, id)
	s.mu.Unlock()
	s.c.handOver(id, to)
}

// siteOfRW is the site of the server rw names: the first server's own
// when it is that one (by its name in the cell, or its address).
func (s *sites) siteOfRW(rw *pb.Site) (*site, error) {
	s.mu.Lock()
	first := s.firstName
	s.mu.Unlock()
	if rw.GetName() == first || rw.GetAddr() == s.first.addr {
		return s.first, nil
	}
	return s.site(rw)
}

// maxHops bounds how often one request follows its node: a site's
// connection may not yet know the site died (the request is sent there
// again, and fails over when it waits out its patience), and the volume
// may move once more meanwhile.
const maxHops = 3

// onServer runs f at the site of the server holding n, and again
// wherever relocated (with stale) says n went, up to maxHops times.
func (n *Node) onServer(stale bool, f func(at *site) error) error {
	for hop := 0; ; hop++ {
		at := n.at()
		err := f(at)
		if hop == maxHops || !n.c.sites.relocated(n, at, err, stale) {
			return err
		}
	}
}

// relocated reports whether err, from site at about node n, came of n's
// volume moving away from at's server, and n now belongs to another
// site: its refusal said so (and moved followed it), or, where stale is
// set (requests about n itself, which its server should know), the
// server no longer has it, which the first server is asked about.
func (s *sites) relocated(n *Node, at *site, err error, stale bool) bool {
	if err == nil {
		return false
	}
	if n.at() != at || s.failover(n.fid.Volume, at, err) {
		return true
	}
	if stale && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESTALE) || pb.Errno(err) == syscall.ENOENT || pb.Errno(err) == syscall.ESTALE) {
		// The data channel says no more than that: the first server's
		// copy of the location database is asked.
		switch l, err := s.ask(&pb.LocateRequest{Id: n.fid.Volume}, s.c.self); {
		case err != nil:
		case l.Here:
			s.movedTo(l.Id, s.first)
		default:
			s.moved(l)
		}
	}
	return n.at() != at
}

// handOver gives the nodes of volume vol to site to, and reports whether
// any belonged to another site. Their promises there are dropped: the
// server they came from broke them, or cannot be reached.
func (c *Client) handOver(vol uint64, to *site) bool {
	var ns []*Node
	c.nodesMu.Lock()
	for fid, n := range c.nodes {
		if fid.Volume == vol && n.at() != to {
			ns = append(ns, n)
		}
	}
	c.nodesMu.Unlock()
	c.sites.each(func(s *site) {
		if s != to {
			s.dropReserved(vol)
		}
	})
	if len(ns) == 0 {
		return false
	}
	from := map[*site]bool{}
	for _, n := range ns {
		at := n.at()
		at.cbMu.Lock()
		at.cb.Break(n.fid)
		at.cbMu.Unlock()
		n.valid.Store(false)
		n.site.Store(to)
		from[at] = true
	}
	for at := range from {
		c.log.Info("a volume's files follow it to another server", "volume", vol, "files", len(ns), "from", at.addr, "to", to.addr)
	}
	return true
}

// each calls fn for every site, the first too.
func (s *sites) each(fn func(*site)) {
	for _, at := range s.all() {
		fn(at)
	}
}

// all is every site, the first first.
func (s *sites) all() []*site {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allLocked()
}

func (s *sites) allLocked() []*site {
	all := []*site{s.first}
	for _, at := range s.byName {
		all = append(all, at)
	}
	return all
}

// close refuses new sites, and returns those there are (Client.Close
// closes them).
func (s *sites) close() []*site {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.allLocked()
}
