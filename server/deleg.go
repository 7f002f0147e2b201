package server

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/latency"
	"github.com/hoardfs/hoard/node"
)

// Delegations: the RPCs that grant, close and return them, and the waits
// that make other clients' operations go after a recall. The logic is in
// callback.Server; this file only feeds it and waits.

// ErrRevoked is the errno of a store made under a delegation the client no
// longer holds (its lease ran out, or the recall went unanswered): the
// client keeps the data under lost/ and reports EIO.
const ErrRevoked = syscall.EKEYEXPIRED

// Open opens fid for id, with a delegation when one can be had. The reply
// waits until conflicting delegations of other clients are returned or
// revoked (at most a lease after their recall).
func (s *Server) Open(ctx context.Context, req *pb.OpenRequest) (*pb.OpenReply, error) {
	o, f, err := s.beginOn(ctx, "Open", req.Fid)
	if err != nil {
		return nil, err
	}
	st, err := s.store.GetStatus(f)
	if err != nil {
		return nil, s.fail("Open", err)
	}
	if err := o.mayOpen(st, req.Write); err != nil {
		return nil, err
	}
	if s.readOnly(f.Volume) {
		if req.Write {
			return nil, s.fail("Open", errReadOnly(f.Volume))
		}
		return &pb.OpenReply{Status: o.status(st)}, nil // nothing to delegate: the copy never changes
	}
	if !callback.Delegates(o.id, st.Type, req.Write, req.DelegationOnly) {
		return &pb.OpenReply{Status: o.status(st)}, nil
	}
	if req.Reclaim != 0 {
		if reply, err := s.reclaim(ctx, o, f, st, req); reply != nil || err != nil {
			return reply, err
		}
	} else if err := s.waitGrace(ctx, callback.Reading); err != nil {
		return nil, err
	}
	if st.Type == node.TypeDir {
		s.mu.Lock()
		ok := s.cb.DirDelegable(o.id, f, time.Now())
		s.mu.Unlock()
		if !ok {
			return &pb.OpenReply{Status: o.status(st)}, nil
		}
	}
	// A reclaim not handed back as it was goes on as an open for writing.
	return s.open(ctx, o, f, callback.Opening{Write: req.Write || req.Reclaim != 0, Only: req.DelegationOnly})
}

// reclaim hands o's client back the delegation state req.Reclaim on f
// (status st): one a gone session of its line left (Reclaim), or, in the
// grace period after a restart, one of the server's last life on a file
// still as that delegation left it (Restore). nil, nil: the reclaim goes
// on as an open (a directory, or a file another client holds a
// delegation on).
func (s *Server) reclaim(ctx context.Context, o *op, f node.FID, st node.Status, req *pb.OpenRequest) (*pb.OpenReply, error) {
	s.mu.Lock()
	h, msgs, ok := s.cb.Reclaim(o.id, f, req.Reclaim, time.Now())
	s.sendLocked(msgs)
	s.mu.Unlock()
	if !ok {
		if err := s.grace.Reclaim(time.Now(), s.restarted(o.id), st.DataVersion, req.BaseVersion); err != nil {
			return nil, s.fail("Open", fmt.Errorf("reclaim %v: delegation %d is gone, and %v: %w", f, req.Reclaim, err, ErrRevoked))
		}
		if st.Type != node.TypeFile {
			return nil, nil
		}
		s.store.Delegation(f, true) // a proxy asks its origin; had or not, the client's is
		s.mu.Lock()
		h, ok = s.cb.Restore(o.id, f, time.Now())
		s.mu.Unlock()
		if !ok {
			return nil, nil
		}
		// As for any write delegation: promises others took since the
		// restart are void.
		o.changed(ctx, f)
	}
	return &pb.OpenReply{Status: o.status(st), Kind: pb.DelegKind(h.Kind), State: h.State}, nil
}

// open records an open of f by o's client, with a delegation if the
// machine and the backend allow one, once other clients' conflicting
// delegations are returned or revoked.
func (s *Server) open(ctx context.Context, o *op, f node.FID, want callback.Opening) (*pb.OpenReply, error) {
	for {
		var still func() bool
		want.Limit, still = s.backendLimit(o.id, f, want.Write)
		s.mu.Lock()
		if still != nil && !still() {
			want.Limit = callback.DelegNone
		}
		res, msgs := s.cb.OpenWith(o.id, f, want, time.Now())
		r := s.waitLocked(res.Wait, msgs)
		s.mu.Unlock()
		if res.Wait != 0 {
			if err := s.await(ctx, r); err != nil {
				return nil, err
			}
			continue
		}
		if res.Kind == callback.DelegWrite {
			// The file may now change with the server none the wiser:
			// other clients' promises on it are void.
			o.changed(ctx, f)
		}
		// The status is read after the open was recorded: a holder's
		// returned data is in it.
		st, err := s.store.GetStatus(f)
		if err != nil {
			return nil, s.fail("Open", err)
		}
		s.log.Debug("open", "client", o.id, "fid", f, "write", want.Write, "kind", res.Kind, "state", res.State, "recorded", res.Recorded)
		return &pb.OpenReply{Status: o.status(st), Kind: pb.DelegKind(res.Kind), State: res.State, Recorded: res.Recorded}, nil
	}
}

// backendLimit is the strongest delegation the backend lets an open of f
// by id have, and whether it still does (Backend.Delegation). It is asked
// only for a delegation the open would get: a proxy's costs a round trip
// to its origin.
func (s *Server) backendLimit(id callback.ClientID, f node.FID, write bool) (callback.DelegKind, func() bool) {
	s.mu.Lock()
	want := s.cb.Delegable(id, f, write, time.Now())
	s.mu.Unlock()
	if !want {
		return callback.DelegNone, nil
	}
	return s.store.Delegation(f, write)
}

// RecallAll recalls every client's delegation on fids and waits until
// they are returned or revoked (at most a lease): a proxy does so before
// it gives back its own delegation from the origin.
func (s *Server) RecallAll(fids []node.FID) {
	// After a restart, the clients' delegations of the last life come back
	// with their reclaims, in the grace period: a proxy's origin recalling
	// what the proxy held for them then waits for those.
	s.waitGrace(context.Background(), callback.Changing)
	s.mu.Lock()
	r, msgs := s.cb.Recall(0, fids, time.Now())
	ch := s.waitLocked(r, msgs)
	s.mu.Unlock()
	s.await(context.Background(), ch)
}

// Delegations is the number of delegations clients hold now.
func (s *Server) Delegations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cb.Delegations()
}

// Load is what a server holds for its clients now, and the messages it
// has sent them since it started (FIDs broken, recalled and revoked;
// resets): for its metrics.
type Load struct {
	Sessions, Promises, Delegations   int
	Broken, Recalled, Revoked, Resets int64
	// The bulk-data channel: connections open now and accepted since
	// start; file bytes sent in fetches, and received in stores.
	DataConns, DataAccepted int64
	DataSent, DataReceived  int64
	// Waited is how long requests waited for other clients to
	// acknowledge breaks and return recalled delegations.
	Waited latency.Histogram
}

// Load is the server's load now.
func (s *Server) Load() Load {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.sent
	l.Sessions, l.Promises, l.Delegations = len(s.conns), s.cb.Promises(), s.cb.Delegations()
	l.DataConns, l.DataAccepted = s.data.Open.Load(), s.data.Accepted.Load()
	l.DataSent, l.DataReceived = s.data.Sent.Load(), s.data.Received.Load()
	l.Waited = s.waited.Snapshot()
	return l
}

// Close records the close of an open that came without a delegation.
func (s *Server) Close(ctx context.Context, req *pb.CloseRequest) (*pb.CloseReply, error) {
	o, f, err := s.beginOn(ctx, "Close", req.Fid)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.cb.Close(o.id, f, req.Write)
	s.mu.Unlock()
	return &pb.CloseReply{}, nil
}

// Return takes back a delegation, after its holder stored its dirty data,
// and lets the operations waiting for it go on.
func (s *Server) Return(ctx context.Context, req *pb.ReturnRequest) (*pb.ReturnReply, error) {
	o, f, err := s.beginOn(ctx, "Return", req.Fid)
	if err != nil {
		return nil, err
	}
	if req.Readers > 1<<20 || req.Writers > 1<<20 {
		return nil, s.fail("Return", fmt.Errorf("return %v: %d readers, %d writers: %w", f, req.Readers, req.Writers, syscall.EINVAL))
	}
	s.mu.Lock()
	ok := s.cb.Return(o.id, f, req.State, int(req.Readers), int(req.Writers), time.Now())
	s.sendLocked(nil) // completes the rounds that waited for it
	s.mu.Unlock()
	return &pb.ReturnReply{Accepted: ok}, nil
}

// Renew renews the caller's lease, as every request does.
func (s *Server) Renew(ctx context.Context, req *pb.RenewRequest) (*pb.RenewReply, error) {
	if _, err := s.begin(ctx); err != nil {
		return nil, err
	}
	return &pb.RenewReply{}, nil
}

// recallFor makes an operation of o's client on fids wait for other
// clients' delegations: all of them before a change, the write ones before
// a read of status or data. It reports whether it had to wait.
func (s *Server) recallFor(ctx context.Context, o *op, change bool, fids ...node.FID) (bool, error) {
	if err := s.waitGrace(ctx, callback.Reading); err != nil {
		return false, err
	}
	now := time.Now()
	s.mu.Lock()
	var r callback.Round
	var msgs []callback.Msg
	if change {
		r, msgs = s.cb.Recall(o.id, fids, now)
	} else {
		r, msgs = s.cb.RecallWriters(o.id, fids, now)
	}
	ch := s.waitLocked(r, msgs)
	s.mu.Unlock()
	return ch != nil, s.await(ctx, ch)
}

// waitLocked sends msgs and returns the channel that closes when round r
// completes (nil when r is 0 or already complete).
func (s *Server) waitLocked(r callback.Round, msgs []callback.Msg) chan struct{} {
	var ch chan struct{}
	if r != 0 && !s.cb.Done(r) {
		ch = make(chan struct{})
		s.waiters[r] = ch
	}
	s.sendLocked(msgs)
	if ch != nil {
		s.poke() // its deadline (break timeout, recall) may be the earliest now
	}
	return ch
}

// await waits for ch (nil: nothing to wait for) or the end of ctx.
func (s *Server) await(ctx context.Context, ch chan struct{}) error {
	if ch == nil {
		return nil
	}
	defer s.waited.Since(time.Now())
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gone forgets the delegations on a file whose last name went.
func (s *Server) gone(st node.Status) {
	if st.Nlink != 0 {
		return
	}
	s.mu.Lock()
	s.cb.FileGone(st.FID)
	s.mu.Unlock()
}

// checkDelegation accepts a store made under delegation state while the
// client holds it. A store under way when the client reconnected comes on
// its new session with the old session's state, ahead of the reclaim that
// waits behind it; otherwise its data would go to lost/ for no reason. On
// a reconnection the store takes the delegation over (took), to be given
// back once it is committed: the client forgot its delegations with the
// old session. In the grace period after a restart the store is accepted
// if the file is still the version the client changed (the reclaim's own
// test).
func (s *Server) checkDelegation(o *op, f node.FID, state, base uint64) (took bool, err error) {
	if state == 0 {
		return false, nil
	}
	s.mu.Lock()
	ok := s.cb.Valid(o.id, f, state)
	if !ok && o.id != 0 {
		_, _, took = s.cb.Reclaim(o.id, f, state, time.Now())
		ok = took
	}
	s.mu.Unlock()
	if ok {
		return took, nil
	}
	// The file's version is read only when it could matter.
	now, restarted := time.Now(), s.restarted(o.id)
	if s.grace.MayReclaim(now, restarted) == nil {
		if st, err := s.store.GetStatus(f); err == nil && s.grace.Reclaim(now, restarted, st.DataVersion, base) == nil {
			return false, nil
		}
	}
	return false, fmt.Errorf("%v: delegation %d revoked: %w", f, state, ErrRevoked)
}

// restarted reports whether session id continues a client of the server's
// last life (its Hello's previous token checked out): only such a client
// may reclaim what it held then, in the grace period.
func (s *Server) restarted(id callback.ClientID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.conns[id]
	return c != nil && c.restarted
}

// giveBackFor returns the delegation a store took over (checkDelegation),
// which lets the operations waiting for its recall go on.
func (s *Server) giveBackFor(o *op, f node.FID, state uint64) {
	s.mu.Lock()
	s.cb.Return(o.id, f, state, 0, 0, time.Now())
	s.sendLocked(nil)
	s.mu.Unlock()
}

// storeGrace makes a store wait out the grace period after a restart,
// unless it was made under a delegation: then it may be the reclaim.
func (s *Server) storeGrace(ctx context.Context, hdr *pb.StoreRequest) error {
	a := callback.Changing
	if hdr.DelegState != 0 {
		a = callback.Reclaiming
	}
	return s.waitGrace(ctx, a)
}
