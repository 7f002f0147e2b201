package client

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/client/conn"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// A site is the client's session with one of the cell's servers: the
// connection, the promises and delegations that server granted (its
// callback table), the delegation lease, and the FIDs it reserved for
// files made here. What happens to the files (caching, storing, giving
// back) is the Client's, which routes each node's requests to the site
// of the server holding its volume (Node.at). A site reports what its
// back channel hears to the Client through handler.
type site struct {
	addr string
	log  *slog.Logger
	// self is the client's own user (Options.Token), whom the cell's
	// administration acts as.
	self User
	// noDelegations is Options.NoDelegations: the site takes none.
	noDelegations bool
	conn          link
	rpc           pb.FileServerClient // conn's; calls go through conn.Call

	cbMu sync.Mutex
	cb   *callback.Client
	// lease is the delegation lease the server announced (0: it grants
	// none); renewing is set while a Renew is in flight.
	lease    atomic.Int64
	renewing atomic.Bool
	// maxFile is the largest file size the server stores (its Welcome;
	// 0: unknown): a larger size is EFBIG at the call, not a store the
	// server refuses after the call succeeded.
	maxFile atomic.Uint64

	// resMu guards fids: FIDs reserved for files made here, by volume,
	// in server life fidsLife.
	resMu    sync.Mutex
	fids     map[uint64][]node.FID
	fidsLife uint64
	// reserving shares one Reserve call per volume (reserved).
	reserving singleflight.Group
}

// as is the site's connection calling as user u.
func (s *site) as(u User) caller { return s.conn.As(u.token) }

// A link is what a site needs of its connection to the server: a
// conn.Conn (connLink), or a fake in tests, which drive the back channel
// through handler.
type link interface {
	// As makes calls as the user of token; Call as the connection's own.
	As(token string) caller
	Call(fn func(ctx context.Context) error) error
	Ready() bool
	AwaitReady(deadline time.Time) error
	Data() datapath.Path
	Session() string
	AwaitSession(stale string, deadline time.Time) string
	GiveUp(t time.Time)
	GiveUpAt() time.Time
	RPCs() int64
	Close()
}

// caller makes one user's calls on a link (conn.Caller).
type caller interface {
	Call(fn func(ctx context.Context) error) error
	CallData(fn func(ctx context.Context) error) error
	CallPatient(patience time.Duration, fn func(ctx context.Context) error) error
	CallOnce(op string, fn func(ctx context.Context) error) error
}

// connLink is a conn.Conn as a link.
type connLink struct{ *conn.Conn }

func (l connLink) As(token string) caller { return l.Conn.As(token) }

// A ticket is a request's place in its site's callback table: what the
// reply grants is installed there, unless a break came in between.
type ticket struct {
	at *site
	t  callback.Ticket
}

// begin takes a ticket before a request whose reply may carry a promise.
func (s *site) begin() ticket {
	s.cbMu.Lock()
	defer s.cbMu.Unlock()
	return ticket{s, s.cb.Begin(time.Now())}
}

// end returns the ticket once its reply was learnt.
func (t ticket) end() {
	t.at.cbMu.Lock()
	defer t.at.cbMu.Unlock()
	t.at.cb.End(t.t)
}

// delegating reports whether the site takes delegations: the server
// grants them (it announced a lease) and the client wants them.
func (s *site) delegating() bool {
	return !s.noDelegations && s.lease.Load() > 0
}

func (s *site) promiseCount() int {
	s.cbMu.Lock()
	defer s.cbMu.Unlock()
	return s.cb.Len()
}

// welcome takes in a new session's terms, and reports whether the server
// restarted since the last one.
func (s *site) welcome(w *pb.Welcome) bool {
	lease := time.Duration(w.LeaseMs) * time.Millisecond
	s.cbMu.Lock()
	changed, _ := s.cb.SetEpoch(w.Epoch)
	s.cb.SetLease(lease)
	s.cbMu.Unlock()
	s.lease.Store(int64(lease))
	s.maxFile.Store(w.MaxFileSize)
	s.resMu.Lock()
	if s.fidsLife != w.Epoch {
		// The FIDs reserved in the server's last life are not reserved
		// in this one.
		clear(s.fids)
		s.fidsLife = w.Epoch
	}
	s.resMu.Unlock()
	return changed
}

// answered extends the lease by a call the server answered, sent at
// sent, and returns the delegations that lapsed before it.
func (s *site) answered(sent time.Time) []callback.Held {
	if s.lease.Load() == 0 {
		return nil
	}
	s.cbMu.Lock()
	defer s.cbMu.Unlock()
	lapsed := s.lapsedLocked(time.Now())
	s.cb.Answered(sent)
	return lapsed
}

// lapsedLocked drops the delegations whose lease ran out by now, and
// returns them.
func (s *site) lapsedLocked(now time.Time) []callback.Held {
	if r, w := s.cb.Delegations(); r+w > 0 && !s.cb.LeaseEnd().After(now) {
		return s.cb.DropDelegations()
	}
	return nil
}

// keepLease renews the lease when delegations are held and a third of it
// is gone, and returns the delegations that lapsed meanwhile.
func (s *site) keepLease(now time.Time) []callback.Held {
	lease := time.Duration(s.lease.Load())
	if lease == 0 {
		return nil
	}
	s.cbMu.Lock()
	lapsed := s.lapsedLocked(now)
	r, w := s.cb.Delegations()
	end := s.cb.LeaseEnd()
	s.cbMu.Unlock()
	if r+w > 0 && end.Sub(now) < lease*2/3 && s.renewing.CompareAndSwap(false, true) {
		go func() {
			defer s.renewing.Store(false)
			s.renew()
		}()
	}
	return lapsed
}

func (s *site) renew() {
	s.conn.Call(func(ctx context.Context) error {
		_, err := s.rpc.Renew(ctx, &pb.RenewRequest{})
		return err
	})
}

// reserveBatch is how many FIDs one Reserve asks for.
const reserveBatch = 64

// reserved takes a FID the server reserved for a file to be made in dir,
// and the server life it was reserved in, asking the server as u for a
// batch when none is left.
func (s *site) reserved(dir node.FID, u User) (node.FID, uint64, error) {
	volume := dir.Volume
	for {
		s.resMu.Lock()
		life := s.fidsLife
		if fs := s.fids[volume]; len(fs) > 0 {
			s.fids[volume] = fs[1:]
			s.resMu.Unlock()
			return fs[0], life, nil
		}
		s.resMu.Unlock()
		_, err, _ := s.reserving.Do(strconv.FormatUint(volume, 10), func() (any, error) {
			var reply *pb.ReserveReply
			err := s.as(u).Call(func(ctx context.Context) (err error) {
				reply, err = s.rpc.Reserve(ctx, &pb.ReserveRequest{Volume: volume, Count: reserveBatch, Dir: pb.FromFID(dir)})
				return err
			})
			if err != nil {
				return nil, err
			}
			s.resMu.Lock()
			defer s.resMu.Unlock()
			if s.fidsLife != life {
				return nil, nil
			}
			n := len(s.fids[volume])
			for _, f := range reply.Fids {
				if fid := f.ToFID(); fid.Volume == volume && fid.Vnode != 0 {
					s.fids[volume] = append(s.fids[volume], fid)
				}
			}
			if len(s.fids[volume]) == n {
				return nil, errors.New("protocol: reserve returned no fids")
			}
			return nil, nil
		})
		if err != nil {
			return node.FID{}, 0, err
		}
	}
}

// unreserve puts back a FID reserved in server life life, unused.
func (s *site) unreserve(f node.FID, life uint64) {
	s.resMu.Lock()
	if life == s.fidsLife {
		s.fids[f.Volume] = append(s.fids[f.Volume], f)
	}
	s.resMu.Unlock()
}

// dropReserved forgets the FIDs reserved in volume vol: it moved away.
func (s *site) dropReserved(vol uint64) {
	s.resMu.Lock()
	delete(s.fids, vol)
	s.resMu.Unlock()
}
