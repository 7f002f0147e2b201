// Package site is a cache manager's session with one of the cell's file
// servers (Site), and the sessions of a cell with where its volumes are
// (Sites). A Site holds what belongs to the session: the connection, the
// callback table of the promises and delegations that server granted, the
// delegation lease, and the FIDs it reserved for files to be made by the
// client. What happens to the files is the cache manager's (package
// client): it hears the back channel through conn.Handler, and a Sites
// tells it through Cell when a volume's files change sites.
package site

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

// A Site is the session with one server.
type Site struct {
	// Addr is the server's address; Self the token of the client's own
	// user, whom the cell's administration acts as.
	Addr string
	Self string
	log  *slog.Logger
	// noDelegations: the client takes none (Options.NoDelegations).
	noDelegations bool
	// Conn is the connection, RPC its calls (made through Conn's callers).
	Conn Link
	RPC  pb.FileServerClient

	mu sync.Mutex // the table's
	cb *callback.Client
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
	// reserving shares one Reserve call per volume (Reserved).
	reserving singleflight.Group
}

// New is a session with the server at addr over link, whose calls are
// rpc; self is the client's own user's token.
func New(addr, self string, link Link, rpc pb.FileServerClient, noDelegations bool, log *slog.Logger) *Site {
	if log == nil {
		log = slog.Default()
	}
	return &Site{Addr: addr, Self: self, log: log, noDelegations: noDelegations, Conn: link, RPC: rpc,
		cb: callback.NewClient(), fids: map[uint64][]node.FID{}}
}

// A Link is what a site needs of its connection to the server: a
// conn.Conn (ConnLink), or a fake in tests.
type Link interface {
	// As makes calls as the user of token; Call as the connection's own.
	As(token string) Caller
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

// A Caller makes one user's calls on a link (conn.Caller).
type Caller interface {
	Call(fn func(ctx context.Context) error) error
	CallData(fn func(ctx context.Context) error) error
	CallPatient(patience time.Duration, fn func(ctx context.Context) error) error
	CallOnce(op string, fn func(ctx context.Context) error) error
}

// ConnLink is a conn.Conn as a Link.
type ConnLink struct{ *conn.Conn }

// As implements Link.
func (l ConnLink) As(token string) Caller { return l.Conn.As(token) }

// As is the session's connection calling as the user of token.
func (s *Site) As(token string) Caller { return s.Conn.As(token) }

// Table runs fn on the site's callback table, holding its lock: a leaf,
// under which fn takes no other lock and makes no call.
func (s *Site) Table(fn func(cb *callback.Client)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s.cb)
}

// A Ticket is a request's place in its site's callback table: what the
// reply grants is installed there, unless a break came in between.
type Ticket struct {
	At *Site
	T  callback.Ticket
}

// Begin takes a ticket before a request whose reply may carry a promise.
func (s *Site) Begin() Ticket {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Ticket{s, s.cb.Begin(time.Now())}
}

// End returns the ticket once its reply was learnt.
func (t Ticket) End() {
	t.At.mu.Lock()
	defer t.At.mu.Unlock()
	t.At.cb.End(t.T)
}

// Delegating reports whether the site takes delegations: the server
// grants them (it announced a lease) and the client wants them.
func (s *Site) Delegating() bool {
	return !s.noDelegations && s.lease.Load() > 0
}

// Delegation is the delegation held on fid now, if any.
func (s *Site) Delegation(fid node.FID) (callback.Held, bool) {
	if !s.Delegating() {
		return callback.Held{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cb.Delegation(fid, time.Now())
}

// Lease is the delegation lease the server announced (0: none).
func (s *Site) Lease() time.Duration { return time.Duration(s.lease.Load()) }

// MaxFile is the largest file size the server stores (0: unknown).
func (s *Site) MaxFile() uint64 { return s.maxFile.Load() }

// Welcome takes in a new session's terms, and reports whether the server
// restarted since the last one.
func (s *Site) Welcome(w *pb.Welcome) bool {
	lease := time.Duration(w.LeaseMs) * time.Millisecond
	s.mu.Lock()
	changed, _ := s.cb.SetEpoch(w.Epoch)
	s.cb.SetLease(lease)
	s.mu.Unlock()
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

// Answered extends the lease by a call the server answered, sent at
// sent, and returns the delegations that lapsed before it.
func (s *Site) Answered(sent time.Time) []callback.Held {
	if s.lease.Load() == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	lapsed := s.lapsedLocked(time.Now())
	s.cb.Answered(sent)
	return lapsed
}

// lapsedLocked drops the delegations whose lease ran out by now, and
// returns them.
func (s *Site) lapsedLocked(now time.Time) []callback.Held {
	if r, w := s.cb.Delegations(); r+w > 0 && !s.cb.LeaseEnd().After(now) {
		return s.cb.DropDelegations()
	}
	return nil
}

// KeepLease renews the lease when delegations are held and a third of it
// is gone, and returns the delegations that lapsed meanwhile.
func (s *Site) KeepLease(now time.Time) []callback.Held {
	lease := time.Duration(s.lease.Load())
	if lease == 0 {
		return nil
	}
	s.mu.Lock()
	lapsed := s.lapsedLocked(now)
	r, w := s.cb.Delegations()
	end := s.cb.LeaseEnd()
	s.mu.Unlock()
	if r+w > 0 && end.Sub(now) < lease*2/3 && s.renewing.CompareAndSwap(false, true) {
		go func() {
			defer s.renewing.Store(false)
			s.Renew()
		}()
	}
	return lapsed
}

// Renew asks the server to extend the lease.
func (s *Site) Renew() {
	s.Conn.Call(func(ctx context.Context) error {
		_, err := s.RPC.Renew(ctx, &pb.RenewRequest{})
		return err
	})
}

// reserveBatch is how many FIDs one Reserve asks for.
const reserveBatch = 64

// Reserved takes a FID the server reserved for a file to be made in dir,
// and the server life it was reserved in, asking the server as the user
// of token for a batch when none is left.
func (s *Site) Reserved(dir node.FID, token string) (node.FID, uint64, error) {
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
			err := s.As(token).Call(func(ctx context.Context) (err error) {
				reply, err = s.RPC.Reserve(ctx, &pb.ReserveRequest{Volume: volume, Count: reserveBatch, Dir: pb.FromFID(dir)})
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

// Unreserve puts back a FID reserved in server life life, unused.
func (s *Site) Unreserve(f node.FID, life uint64) {
	s.resMu.Lock()
	if life == s.fidsLife {
		s.fids[f.Volume] = append(s.fids[f.Volume], f)
	}
	s.resMu.Unlock()
}

// DropReserved forgets the FIDs reserved in volume vol: it moved away.
func (s *Site) DropReserved(vol uint64) {
	s.resMu.Lock()
	delete(s.fids, vol)
	s.resMu.Unlock()
}

// StatFS is the space of volume (its quota), or of the server, asked as
// the user of token.
func (s *Site) StatFS(volume uint64, token string) (node.FSStat, error) {
	var r *pb.StatFSReply
	err := s.As(token).Call(func(ctx context.Context) (err error) {
		r, err = s.RPC.StatFS(ctx, &pb.StatFSRequest{Volume: volume})
		return err
	})
	if err != nil {
		return node.FSStat{}, err
	}
	return node.FSStat{BlockSize: r.BlockSize, Blocks: r.Blocks, BlocksFree: r.BlocksFree, Files: r.Files, FilesFree: r.FilesFree}, nil
}

// CloseOne tells the server, as the user of token, that an open of fid
// it recorded closed.
func (s *Site) CloseOne(fid node.FID, write bool, token string) error {
	return s.As(token).Call(func(ctx context.Context) error {
		_, err := s.RPC.Close(ctx, &pb.CloseRequest{Fid: pb.FromFID(fid), Write: write})
		return err
	})
}

// Tick drops the promises expired by now, and returns their FIDs.
func (s *Site) Tick(now time.Time) []node.FID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cb.Tick(now)
}

// Reset drops every promise, and returns their FIDs.
func (s *Site) Reset() []node.FID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cb.Reset()
}

// Break drops the promises on fids.
func (s *Site) Break(fids ...node.FID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range fids {
		s.cb.Break(f)
	}
}

// DropDelegations forgets every delegation, and returns them.
func (s *Site) DropDelegations() []callback.Held {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cb.DropDelegations()
}

// Recall marks the delegation state on fid recalled, and reports whether
// it is held.
func (s *Site) Recall(fid node.FID, state uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.cb.Recall(fid, state)
	return ok
}

// Revoke forgets the delegation state on fid, and reports whether it was
// held.
func (s *Site) Revoke(fid node.FID, state uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cb.Revoke(fid, state)
}

// Returned forgets the delegation state on fid, given back.
func (s *Site) Returned(fid node.FID, state uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cb.Returned(fid, state)
}

// Expiry is when the promise on fid runs out, if one is held.
func (s *Site) Expiry(fid node.FID) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cb.Expiry(fid)
}

// Counts are the promises and the read and write delegations held.
func (s *Site) Counts() (promises, read, write int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	read, write = s.cb.Delegations()
	return s.cb.Len(), read, write
}
