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
// was dialled to, and a Client of its own for each other server it found
// a volume on, all sharing the first's cache (FIDs are unique in a cell).
// A Node belongs to the Client of the server holding its volume, and
// every request about it goes there: the internal methods pass a node of
// another Client on to it.
//
// Locations are asked of the first server, which answers from its copy
// of the cell's location database (clients never talk to etcd), and kept
// until a server says the volume is not there (moved).
type sites struct {
	first *Client

	mu     sync.Mutex
	byName map[string]*Client      // other servers' Clients, by server name (read-only copies': roKey)
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

func newSites() *sites {
	return &sites{byName: map[string]*Client{}, locs: map[string]*pb.Location{}, byID: map[uint64]*pb.Location{},
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
	c := s.first
	err := c.as(u).Call(func(ctx context.Context) (err error) {
		l, err = c.rpc.Locate(ctx, req)
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
	s.each(func(c *Client) {
		c.volMu.Lock()
		delete(c.vols, name)
		c.volMu.Unlock()
	})
}

// siteOf is the Client of the server holding volume name.
func (c *Client) siteOf(name string, u User) (*Client, error) {
	s := c.sites
	l, err := s.locate(name, u)
	if err != nil {
		return nil, err
	}
	return c.siteFor(l)
}

// siteFor is the Client of the server holding the volume l names.
func (c *Client) siteFor(l *pb.Location) (*Client, error) {
	switch {
	case l.ReadOnly:
		return c.sites.roSite(l)
	case l.Here:
		return c.sites.first, nil
	}
	return c.sites.site(l.Rw)
}

// siteOfID is the Client of the server holding volume id.
func (c *Client) siteOfID(id uint64, u User) (*Client, error) {
	l, err := c.sites.locateID(id, u)
	if err != nil {
		return nil, err
	}
	return c.siteFor(l)
}

// site is the Client of server to, dialled on first use.
func (s *sites) site(to *pb.Site) (*Client, error) { return s.dial(to.GetName(), to, 0) }

// dial is the Client kept as key, of server to, waiting patience for it
// when unreachable (0: the RPC timeout), dialled on first use.
func (s *sites) dial(key string, to *pb.Site, patience time.Duration) (*Client, error) {
	if to.GetName() == "" || to.GetAddr() == "" {
		return nil, fmt.Errorf("the location database names no address for a server: %w", errors.ErrUnsupported)
	}
	s.mu.Lock()
	c := s.byName[key]
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	v, err, _ := s.dialing.Do(key, func() (any, error) {
		s.mu.Lock()
		if c := s.byName[key]; c != nil || s.closed {
			s.mu.Unlock()
			if c == nil {
				return nil, errors.New("client closed")
			}
			return c, nil
		}
		s.mu.Unlock()
		opts := s.first.opts
		opts.Server = to.Addr
		if patience > 0 {
			opts.Patience = patience
		}
		sessionFile := ""
		if opts.KeepSession && opts.CacheDir != "" {
			sessionFile = filepath.Join(opts.CacheDir, "session."+key)
		}
		c, err := start(opts, s.first.cache, sessionFile, s)
		if err != nil {
			return nil, fmt.Errorf("server %s of the cell: %w", to.Name, err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			go c.Close()
			return nil, errors.New("client closed")
		}
		s.byName[key] = c
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Client), nil
}

// moved follows a volume to the server holding it now, as l (another
// server's refusal) says: the nodes of the volume move to that server's
// Client, without their promises (the old server broke them before the
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

// movedTo hands volume id's nodes to Client to, and forgets where the
// volume was.
func (s *sites) movedTo(id uint64, to *Client) {
	s.mu.Lock()
	if old := s.byID[id]; old != nil {
		delete(s.locs, old.Name)
	}
	delete(s.byID, id)
	s.mu.Unlock()
	s.each(func(c *Client) {
		if c != to {
			c.handOver(id, to)
		}
	})
}

// siteOfRW is the Client of the server rw names: the first server's own
// when it is that one (by its name in the cell, or its address).
func (s *sites) siteOfRW(rw *pb.Site) (*Client, error) {
	s.mu.Lock()
	first := s.firstName
	s.mu.Unlock()
	if rw.GetName() == first || rw.GetAddr() == s.first.opts.Server {
		return s.first, nil
	}
	return s.site(rw)
}

// maxHops bounds how often one request follows its node: a site's
// connection may not yet know the site died (the request is sent there
// again, and fails over when it waits out its patience), and the volume
// may move once more meanwhile.
const maxHops = 3

// onServer runs f at the Client of the server holding n, and again
// wherever relocated (with stale) says n went, up to maxHops times.
func (n *Node) onServer(stale bool, f func(at *Client) error) error {
	for hop := 0; ; hop++ {
		at := n.at()
		err := f(at)
		if hop == maxHops || !relocated(n, at, err, stale) {
			return err
		}
	}
}

// relocated reports whether err, from Client at about node n, came of
// n's volume moving away from at's server, and n now belongs to another
// Client: its refusal said so (and moved followed it), or, where stale
// is set (requests about n itself, which its server should know), the
// server no longer has it, which the first server is asked about.
func relocated(n *Node, at *Client, err error, stale bool) bool {
	if err == nil {
		return false
	}
	if n.at() != at || at.sites.failover(n.fid.Volume, at, err) {
		return true
	}
	if stale && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESTALE) || pb.Errno(err) == syscall.ENOENT || pb.Errno(err) == syscall.ESTALE) {
		// The data channel says no more than that: the first server's
		// copy of the location database is asked.
		switch l, err := at.sites.ask(&pb.LocateRequest{Id: n.fid.Volume}, at.self); {
		case err != nil:
		case l.Here:
			at.sites.movedTo(l.Id, at.sites.first)
		default:
			at.sites.moved(l)
		}
	}
	return n.at() != at
}

// handOver gives c's nodes of volume vol to Client to, and reports
// whether it had any.
func (c *Client) handOver(vol uint64, to *Client) bool {
	var ns []*Node
	c.nodesMu.Lock()
	for fid, n := range c.nodes {
		if fid.Volume == vol {
			ns = append(ns, n)
			delete(c.nodes, fid)
			delete(c.forgotten, n)
		}
	}
	c.nodesMu.Unlock()
	if len(ns) == 0 {
		return false
	}
	c.cbMu.Lock()
	for _, n := range ns {
		c.cb.Break(n.fid)
	}
	c.cbMu.Unlock()
	c.resMu.Lock()
	delete(c.fids, vol)
	c.resMu.Unlock()
	to.nodesMu.Lock()
	for _, n := range ns {
		n.valid.Store(false)
		n.site.Store(to)
		if _, ok := to.nodes[n.fid]; !ok {
			to.nodes[n.fid] = n
		}
	}
	to.nodesMu.Unlock()
	c.log.Info("a volume's files follow it to another server", "volume", vol, "files", len(ns), "to", to.opts.Server)
	return true
}

// each calls fn for every Client of the cell's servers, the first too.
func (s *sites) each(fn func(*Client)) {
	s.mu.Lock()
	cs := []*Client{s.first}
	for _, c := range s.byName {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		fn(c)
	}
}

// close closes the other servers' Clients (the first's Close calls it
// before its own).
func (s *sites) close() error {
	s.mu.Lock()
	s.closed = true
	cs := make([]*Client, 0, len(s.byName))
	for _, c := range s.byName {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
