package site

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/hoardfs/hoard/hoardpb"
)

// Sites are the file servers of a cell one client reaches: the server it
// was dialled to first, and a session with each other server it found a
// volume on. Locations are asked of the first server, which answers from
// its copy of the cell's location database (clients never talk to etcd),
// and kept until a server says the volume is not there (moved).
//
// A volume's read-only copy (docs/cell.md) is the same at each of its
// sites, FIDs included, so its files may be read from any: they belong to
// a session with one site, dialled apart from that server's own session
// with a short patience (roPatience), and when a request finds that site
// unreachable the copy's files go to the next site (Failover).
type Sites struct {
	cell  Cell
	first *Site

	mu     sync.Mutex
	byName map[string]*Site        // other servers' sessions, by server name (read-only copies': roKey)
	locs   map[string]*pb.Location // by volume name
	byID   map[uint64]*pb.Location
	asked  map[string]time.Time // when locs' entries were asked for
	// firstName is the first server's name in the cell, once a location
	// answered by it as its own said it.
	firstName string
	closed    bool
	// down: when a read-only copy's site (by address) last failed to
	// answer.
	down map[string]time.Time

	dialing singleflight.Group
	moving  singleflight.Group
}

// A Cell is what Sites needs of the cache manager above it.
type Cell interface {
	// Dial begins a session with server addr, kept under key, waiting
	// patience for it when unreachable (0: the RPC timeout).
	Dial(key, addr string, patience time.Duration) (*Site, error)
	// HandOver gives volume vol's files to site to, and reports whether
	// any belonged to another site.
	HandOver(vol uint64, to *Site) bool
	// Forget hears that what is kept of volume name is stale.
	Forget(name string)
}

// NewSites is the sites of the cell first is a server of.
func NewSites(cell Cell, first *Site) *Sites {
	return &Sites{cell: cell, first: first, byName: map[string]*Site{}, locs: map[string]*pb.Location{},
		byID: map[uint64]*pb.Location{}, asked: map[string]time.Time{}, down: map[string]time.Time{}}
}

// First is the session with the server the client was dialled to.
func (s *Sites) First() *Site { return s.first }

// Locate is where volume name lives, asked of the first server as the
// user of token. A server from before cells (no Locate) holds every
// volume it knows.
func (s *Sites) Locate(name, token string) (*pb.Location, error) {
	s.mu.Lock()
	l, asked := s.locs[name], s.asked[name]
	s.mu.Unlock()
	if l != nil && time.Since(asked) < locationTTL {
		return l, nil
	}
	return s.Ask(&pb.LocateRequest{Name: name}, token)
}

// locationTTL is how long a volume's location is kept before a mount
// point crossing asks again: a move is followed at once (the old server
// says so), but a first release, which makes the volume's mount points
// lead to its read-only copy, is learnt only by asking.
const locationTTL = time.Minute

// LocateID is Locate of the volume with id (a FID's, for a proxy).
func (s *Sites) LocateID(id uint64, token string) (*pb.Location, error) {
	s.mu.Lock()
	l := s.byID[id]
	s.mu.Unlock()
	if l != nil {
		return l, nil
	}
	return s.Ask(&pb.LocateRequest{Id: id}, token)
}

// Ask asks the first server where a volume is, and keeps the answer.
func (s *Sites) Ask(req *pb.LocateRequest, token string) (*pb.Location, error) {
	var l *pb.Location
	f := s.first
	err := f.As(token).Call(func(ctx context.Context) (err error) {
		l, err = f.RPC.Locate(ctx, req)
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

// Stale forgets what is kept of volume name when err says it is not
// where it was thought, and reports whether it should be located again.
func (s *Sites) Stale(name string, err error) bool {
	if WhereIs(err) == nil && pb.Errno(err) != syscall.ENOENT && pb.Errno(err) != syscall.ESTALE {
		return false
	}
	s.Forget(name)
	return true
}

// Forget drops what is kept of volume name: where it is, its root.
func (s *Sites) Forget(name string) {
	s.mu.Lock()
	if l := s.locs[name]; l != nil {
		delete(s.byID, l.Id)
	}
	delete(s.locs, name)
	delete(s.asked, name)
	s.mu.Unlock()
	s.cell.Forget(name)
}

// WhereIs is the location a server's refusal says the volume is at
// instead (it moved, or is a read-only copy), or nil.
func WhereIs(err error) *pb.Location {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return nil
	}
	for _, d := range st.Details() {
		if l, ok := d.(*pb.Location); ok && (l.Rw != nil || l.ReadOnly) {
			return l
		}
	}
	return nil
}

// Of is the site of the server holding volume name, located as the user
// of token.
func (s *Sites) Of(name, token string) (*Site, error) {
	l, err := s.Locate(name, token)
	if err != nil {
		return nil, err
	}
	return s.For(l)
}

// For is the site of the server holding the volume l names.
func (s *Sites) For(l *pb.Location) (*Site, error) {
	switch {
	case l.ReadOnly:
		return s.roSite(l)
	case l.Here:
		return s.first, nil
	}
	return s.Server(l.Rw)
}

// OfID is the site of the server holding volume id.
func (s *Sites) OfID(id uint64, token string) (*Site, error) {
	l, err := s.LocateID(id, token)
	if err != nil {
		return nil, err
	}
	return s.For(l)
}

// Server is the session with server to, begun on first use.
func (s *Sites) Server(to *pb.Site) (*Site, error) { return s.dial(to.GetName(), to, 0) }

// dial is the session kept as key, with server to, waiting patience for
// it when unreachable (0: the RPC timeout), begun on first use.
func (s *Sites) dial(key string, to *pb.Site, patience time.Duration) (*Site, error) {
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
		at, err := s.cell.Dial(key, to.Addr, patience)
		if err != nil {
			return nil, &DialError{Server: to.Name, Err: err}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			go at.Conn.Close()
			return nil, errors.New("client closed")
		}
		s.byName[key] = at
		return at, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Site), nil
}

// Moved follows a volume to the server holding it now, as l (another
// server's refusal) says: its files go to that server's site (Cell's
// HandOver), without their promises (the old server broke them before
// the move). The refusal is believed over the first server's copy of the
// location database, which may not have seen the move yet.
func (s *Sites) Moved(l *pb.Location) {
	s.moving.Do(fmt.Sprint(l.Id), func() (any, error) {
		to, err := s.ofRW(l.Rw)
		if l.ReadOnly {
			to, err = s.roSite(l)
		}
		if err != nil {
			return nil, err
		}
		s.MovedTo(l.Id, to)
		return nil, nil
	})
}

// MovedTo hands volume id's files to site to, and forgets where the
// volume was.
func (s *Sites) MovedTo(id uint64, to *Site) {
	s.mu.Lock()
	if old := s.byID[id]; old != nil {
		delete(s.locs, old.Name)
	}
	delete(s.byID, id)
	s.mu.Unlock()
	s.cell.HandOver(id, to)
}

// ofRW is the site of the server rw names: the first server's own when
// it is that one (by its name in the cell, or its address).
func (s *Sites) ofRW(rw *pb.Site) (*Site, error) {
	s.mu.Lock()
	first := s.firstName
	s.mu.Unlock()
	if rw.GetName() == first || rw.GetAddr() == s.first.Addr {
		return s.first, nil
	}
	return s.Server(rw)
}

// Each calls fn for every site, the first too.
func (s *Sites) Each(fn func(*Site)) {
	for _, at := range s.All() {
		fn(at)
	}
}

// All is every site, the first first.
func (s *Sites) All() []*Site {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allLocked()
}

func (s *Sites) allLocked() []*Site {
	all := []*Site{s.first}
	for _, at := range s.byName {
		all = append(all, at)
	}
	return all
}

// Close refuses new sites, and returns those there are, for the client
// to close.
func (s *Sites) Close() []*Site {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.allLocked()
}

// roPatience is how long a request to a read-only copy's site waits for
// it before it goes to another site.
const roPatience = time.Second

// downFor is how long a site that stopped answering is passed over.
const downFor = 30 * time.Second

// roKey keys the sessions with read-only copies' sites in byName.
func roKey(server string) string { return "ro:" + server }

// ReadOnly reports whether vol is a read-only copy, as far as the client
// has located it.
func (s *Sites) ReadOnly(vol uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.byID[vol]
	return l != nil && l.ReadOnly
}

// roSite is the site reading copy l: its first site not known to be down
// (all down: the one down longest, the likeliest back).
func (s *Sites) roSite(l *pb.Location) (*Site, error) {
	if len(l.Ro) == 0 {
		return nil, fmt.Errorf("volume %s: no read-only site: %w", l.Name, syscall.ENOENT)
	}
	s.mu.Lock()
	var pick *pb.Site
	var since time.Time
	for _, site := range l.Ro {
		t, down := s.down[site.Addr]
		if !down || time.Since(t) > downFor {
			pick = site
			break
		}
		if pick == nil || t.Before(since) {
			pick, since = site, t
		}
	}
	s.mu.Unlock()
	return s.dial(roKey(pick.Name), pick, roPatience)
}

// unreachable reports whether err says the server could not be reached
// (after the connection's patience).
func unreachable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// Failover follows copy vol from site at, which err says is unreachable,
// to another of its sites: the copy's files go to that site. It reports
// whether the request should be sent again: to the new site, or, when
// at's connection is up after all (the failure was the request's, not
// the site's), to the same.
func (s *Sites) Failover(vol uint64, at *Site, err error) bool {
	if !unreachable(err) {
		return false
	}
	s.mu.Lock()
	l := s.byID[vol]
	if l == nil || !l.ReadOnly {
		s.mu.Unlock()
		return false
	}
	if at.Conn.Ready() {
		s.mu.Unlock()
		return true
	}
	s.down[at.Addr] = time.Now()
	s.mu.Unlock()
	to, derr := s.roSite(l)
	if derr != nil || to == at {
		at.log.Warn("no other site of a read-only volume answers", "volume", l.Name, "site", at.Addr, "err", err, "dial", derr)
		return false
	}
	if s.cell.HandOver(vol, to) {
		at.log.Warn("a site of a read-only volume does not answer; reading from another", "volume", l.Name, "from", at.Addr, "to", to.Addr)
	}
	return true
}
