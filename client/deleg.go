package client

import (
	"context"
	"errors"
	"github.com/hoardfs/hoard/client/site"
	"github.com/hoardfs/hoard/client/user"
	"sync"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/client/lost"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// fileDeleg is a file node's opens and the delegations held on it (Node).
type fileDeleg struct {
	opens opens
	// refusedAt: the server last refused this client a delegation it
	// asked for alone (FIDs.Delegate), which it does not ask again for a
	// while.
	refusedAt time.Time
}

// Delegations on the client (the cacheDAFS thesis, chapter 3). Under a delegation,
// opens, closes and the file's status are served from the cache; under a
// write delegation, writes stay in the cache as dirty data after Close and
// the flusher (flush.go) stores them later, naming the delegation, so the
// server refuses them if it was revoked meanwhile. A recall stores the
// dirty data and gives the delegation back before the conflicting open
// goes on. The bookkeeping is callback.Client's; this file feeds it and
// does the I/O.

// opens counts this client's opens of a file: all of them, and how many
// of them the server recorded (made without a delegation, or reported at
// a return), which are closed with Close.
type opens struct{ r, w, recR, recW int }

// delegationAt is the delegation held on n at site at now, if any.
func delegationAt(at *site.Site, n *Node) (callback.Held, bool) {
	if n.made() != nil && at.Delegating() {
		// Covered by the directory's: the server does not know it yet.
		return callback.Held{FID: n.fid, Kind: callback.DelegWrite}, true
	}
	return at.Delegation(n.fid)
}

// current reports whether n's cached status may be used without asking:
// a promise or a delegation is held (a change by anyone else would recall
// the delegation first). A recalled delegation does not count: the break
// of the change it makes way for may arrive before the return is done.
func (c *Client) current(n *Node) bool {
	if n.valid.Load() {
		return true
	}
	h, ok := delegationAt(n.at(), n)
	return ok && !h.Recalled
}

// openDeleg records an open of file n: locally under a delegation that
// covers it, or for reading under a callback promise, otherwise with the
// server, which may grant a delegation. A reader's promise is enough: no
// other client can hold a write delegation on the file meanwhile (its
// grant broke the promise and waited for the acknowledgement, and a new
// promise is given only after such a delegation was recalled), so the
// reader sees every close before its open, as close-to-open wants. Asking
// the server would cost every open of a cached file a round trip. (The
// opener's rights were checked first: permitted.) The server is asked as u.
func (c *Client) openDeleg(n *Node, write bool, u user.User) error {
	return n.onServer(false, func(at *site.Site) error { return c.openDelegHere(at, n, write, u) })
}

// openDelegHere is openDeleg at site at.
func (c *Client) openDelegHere(at *site.Site, n *Node, write bool, u user.User) error {
	if !at.Delegating() {
		return nil
	}
	if h, ok := delegationAt(at, n); ok && !h.Recalled && (h.Kind == callback.DelegWrite || !write) || !write && n.valid.Load() {
		n.addOpen(write, false)
		c.counters.localOpens.Add(1)
		return nil
	}
	t := at.Begin()
	defer t.End()
	var reply *pb.OpenReply
	err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
		reply, err = at.RPC.Open(ctx, &pb.OpenRequest{Fid: pb.FromFID(n.fid), Write: write})
		return err
	})
	if err != nil {
		return err
	}
	n.addOpen(write, reply.Recorded)
	c.delegated(t, n, reply.Kind, reply.State)
	_, err = c.learnPB(t, reply.Status, u)
	return err
}

// refusedFor is how long Delegate does not ask again for a delegation the
// server refused: a file others have open keeps being refused, and each
// asking is a round trip.
const refusedFor = time.Second

// held is the delegation this client holds on n now (FIDs.Held).
func (c *Client) held(n *Node) (callback.Held, bool) {
	h, ok := delegationAt(n.at(), n)
	return h, ok && !h.Recalled
}

// delegate gets this client a delegation on file n without opening it
// (FIDs.Delegate), asking as u, whose rights the server checks.
func (c *Client) delegate(n *Node, write bool, u user.User) (callback.Held, bool) {
	at := n.at()
	if !at.Delegating() {
		return callback.Held{}, false
	}
	if h, ok := delegationAt(at, n); ok && !h.Recalled && (h.Kind == callback.DelegWrite || !write) {
		return h, true
	}
	wait := refusedFor
	if n.status().Type == node.TypeDir {
		wait = c.opts.DirBackoff
	}
	n.mu.Lock()
	refused := time.Since(n.refusedAt) < wait
	n.mu.Unlock()
	if refused || !at.Conn.Ready() {
		// Not now: the open goes on without one rather than wait for
		// a server that is away.
		h, ok := delegationAt(at, n)
		return h, ok && !h.Recalled
	}
	t := at.Begin()
	defer t.End()
	var reply *pb.OpenReply
	err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
		reply, err = at.RPC.Open(ctx, &pb.OpenRequest{Fid: pb.FromFID(n.fid), Write: write, DelegationOnly: true})
		return err
	})
	if err != nil {
		n.refused()
		return callback.Held{}, false
	}
	c.learnPB(t, reply.Status, u)
	h, ok := c.delegated(t, n, reply.Kind, reply.State)
	if !ok || h.Recalled || write && h.Kind != callback.DelegWrite {
		n.refused()
	}
	return h, ok && !h.Recalled
}

// refused notes that asking for a delegation on n came to nothing.
func (n *Node) refused() {
	n.mu.Lock()
	n.refusedAt = time.Now()
	n.mu.Unlock()
}

// delegated installs the delegation an open or create reply granted, and
// starts the recall of one that was recalled before its grant arrived.
func (c *Client) delegated(t site.Ticket, n *Node, kind pb.DelegKind, state uint64) (callback.Held, bool) {
	if kind == pb.DelegKind_DELEG_NONE {
		return callback.Held{}, false
	}
	at := t.At
	var h callback.Held
	var ok, voided bool
	at.Table(func(cb *callback.Client) {
		h, ok = cb.Delegated(t.T, n.fid, callback.DelegKind(kind), state, cb.Epoch())
		voided = !ok && cb.Voided(t.T)
	})
	c.log.Debug("delegated", "fid", n.fid, "kind", kind, "state", state, "installed", ok, "recalled", h.Recalled)
	if ok && h.Recalled {
		c.spawn(func() { c.giveBack(at, n.fid, h.State) })
	}
	if voided {
		// Granted while this client's session changed (a reset, a
		// reconnection): it is not used, but the server holds it for
		// this client, and would make others wait a lease for it.
		c.spawn(func() {
			at.Conn.Call(func(ctx context.Context) error {
				_, err := at.RPC.Return(ctx, &pb.ReturnRequest{Fid: pb.FromFID(n.fid), State: state})
				return err
			})
		})
	}
	return h, ok
}

func (n *Node) addOpen(write, recorded bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if write {
		n.opens.w++
		if recorded {
			n.opens.recW++
		}
	} else {
		n.opens.r++
		if recorded {
			n.opens.recR++
		}
	}
}

// closeDeleg records the close of an open of n by u, telling the server
// when it recorded one.
func (c *Client) closeDeleg(n *Node, write bool, u user.User) error {
	at := n.at()
	if !at.Delegating() {
		return nil
	}
	n.mu.Lock()
	tell := false
	if write {
		n.opens.w = max(n.opens.w-1, 0)
		if n.opens.recW > 0 {
			n.opens.recW--
			tell = true
		}
	} else {
		n.opens.r = max(n.opens.r-1, 0)
		if n.opens.recR > 0 {
			n.opens.recR--
			tell = true
		}
	}
	n.mu.Unlock()
	if !tell {
		c.counters.localCloses.Add(1)
		return nil
	}
	return at.CloseOne(n.fid, write, u.Token())
}

// closeRecorded tells the server of r read and w write opens of fid that
// it recorded and that are closed.
func (c *Client) closeRecorded(at *site.Site, fid node.FID, r, w int) {
	for i := range r + w {
		if err := at.CloseOne(fid, i >= r, c.self.Token()); err != nil {
			c.log.Warn("close not recorded", "fid", fid, "err", err)
			return
		}
	}
}

// writeBack reports whether writes to n may stay in the cache past Close:
// a write delegation is held on it.
func (c *Client) writeBack(n *Node) bool {
	h, ok := delegationAt(n.at(), n)
	return ok && h.Kind == callback.DelegWrite
}

// writeHere reports whether a change to n may stay in the cache: a write
// delegation is held on it and not being recalled.
func (c *Client) writeHere(n *Node) bool {
	h, ok := delegationAt(n.at(), n)
	return ok && h.Kind == callback.DelegWrite && !h.Recalled
}

// dirtied notes a local write or truncation of n (wmu held): made under a
// write delegation, it is the flusher's to store. Unstored writes made
// under an earlier delegation keep its state: if that one is gone, the
// server refuses them all, rather than take the old ones under the new
// delegation.
func (c *Client) dirtied(n *Node) {
	h, ok := delegationAt(n.at(), n)
	if !ok || h.Kind != callback.DelegWrite {
		return
	}
	n.mu.Lock()
	if n.dirtyState == 0 {
		n.dirtyState = h.State
	}
	if n.dirtySince.IsZero() {
		n.dirtySince = time.Now()
	}
	n.mu.Unlock()
	c.flusher.Add(dirtyNode{n})
}

// stored notes that every local change of n reached the server (wmu held).
func (c *Client) stored(n *Node) {
	n.mu.Lock()
	n.dirtyState, n.dirtySince = 0, time.Time{}
	n.writer, n.wrote = user.User{}, false
	n.mu.Unlock()
	c.flusher.Remove(dirtyNode{n})
}

// lossCount is n.losses now, taken before waiting for wmu.
func (n *Node) lossCount() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.losses
}

// lostSince is the last loss if writes were moved to lost/ since count.
func (n *Node) lostSince(count uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.losses != count {
		return n.lastLoss
	}
	return nil
}

// takeLost returns, once, the error of writes the flusher or a recall
// could not deliver.
func (n *Node) takeLost() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.lostErr
	n.lostErr = nil
	return err
}

// giveBack stores what is dirty under the delegation state on fid and
// returns the delegation to site at: on a recall, and for delegations the client
// stopped trusting (lease lapsed, revoked, reset), whose store the server
// then judges. Data it refuses is kept in lost/.
func (c *Client) giveBack(at *site.Site, fid node.FID, state uint64) {
	if c.opts.OnRecall != nil {
		c.opts.OnRecall(fid)
	}
	c.nodesMu.Lock()
	n := c.nodes[fid]
	c.nodesMu.Unlock()
	var r, w int
	if n != nil && n.status().Type == node.TypeDir {
		n.mu.Lock()
		n.recalledAt = time.Now()
		n.mu.Unlock()
		// Nothing is made, removed or renamed here under a delegation
		// recalled or dropped (makeHere and the others check it under
		// nsmu), so nsmu is not held past the settle: a store of a file
		// it created, under way, may need it to finish (storeLocked
		// settles first).
		n.nsmu.Lock()
		bare, err := c.settleLocked(n)
		n.nsmu.Unlock()
		c.uncovered(bare) // before the return lets others at them
		// And stored before it, a store under way waited for: nothing
		// covers their writes once the directory's delegation is back
		// (a settle the server gave no write delegation, as a volume
		// that is moving or a client backing off gets none), and
		// whoever asked for it may open them next.
		for _, f := range bare {
			f.wmu.Lock()
			if err := c.storeBack(f, true, c.writerOf(f)); err != nil {
				c.log.Warn("recall: a settled file's writes not stored yet", "fid", f.fid, "err", err)
			}
			f.wmu.Unlock()
		}
		if err != nil && !refusedCreate(err) {
			c.log.Warn("recall: files made in the directory not created yet", "fid", fid, "err", err)
			return
		}
	} else if n != nil {
		n.wmu.Lock()
		defer n.wmu.Unlock()
		if err := c.storeBack(n, true, c.writerOf(n)); err != nil && !kept(err) {
			// Could not store (server unreachable): keep the data and
			// the delegation; the server revokes it after a lease and
			// the next store discovers that.
			c.log.Warn("recall: dirty data not stored yet", "fid", fid, "err", err)
			return
		}
		n.mu.Lock()
		r, w = max(n.opens.r-n.opens.recR, 0), max(n.opens.w-n.opens.recW, 0)
		n.mu.Unlock()
	}
	var reply *pb.ReturnReply
	err := at.Conn.Call(func(ctx context.Context) (err error) {
		reply, err = at.RPC.Return(ctx, &pb.ReturnRequest{Fid: pb.FromFID(fid), State: state, Readers: uint32(r), Writers: uint32(w)})
		return err
	})
	if err != nil {
		c.log.Warn("delegation not returned", "fid", fid, "err", err)
	} else if n != nil {
		// The server now records the opens reported; if it no longer
		// knew the delegation, those made under it stay unknown to it.
		n.mu.Lock()
		if reply.Accepted {
			n.opens.recR, n.opens.recW = n.opens.recR+r, n.opens.recW+w
		} else {
			n.opens.r, n.opens.w = n.opens.recR, n.opens.recW
		}
		// Opens reported that closed while the return was under way
		// closed locally: the server must hear of those closes too.
		goneR, goneW := max(n.opens.recR-n.opens.r, 0), max(n.opens.recW-n.opens.w, 0)
		n.opens.recR, n.opens.recW = n.opens.recR-goneR, n.opens.recW-goneW
		n.mu.Unlock()
		c.closeRecorded(at, fid, goneR, goneW)
	}
	at.Returned(fid, state)
}

// storeBack stores n's dirty data as u (wmu held): the user of the file
// stored, or, in the background, whoever wrote it (writerOf). Data the
// server refuses for good (its delegation is gone, no space, not allowed)
// goes to lost/: the
// error says so and, if the store was the flusher's or a recall's, the
// next Sync or Close of the file reports it. Other errors (server
// unreachable) leave the data dirty, to be stored later. A file removed
// here under its directory's delegation has nothing to store: its remove
// goes to the server instead (settle), before anybody else gets at it.
func (c *Client) storeBack(n *Node, background bool, u user.User) error {
	if dir := n.removedIn.Load(); dir != nil {
		if err := c.settle(dir); err != nil && !refusedCreate(err) {
			return err
		}
		return nil // refused: the file is back (loseMade)
	}
	err := n.storeLocked(true, u)
	n.mu.Lock()
	cached := n.entry != nil
	n.mu.Unlock()
	if err == nil && cached && !n.localChanges() {
		c.stored(n) // a file made here with nothing written: off the flusher's list
	}
	if err == nil || !refused(err) {
		return err
	}
	if n.goneHere(err) {
		return nil
	}
	name := n.entry.Policy("path")
	if name == "" {
		name = "fid " + n.fid.String()
	}
	lost := c.keepLost(n, name, err)
	if background {
		n.mu.Lock()
		n.lostErr = lost
		n.mu.Unlock()
	}
	return lost
}

// goneHere reports a store that failed because this client removed the
// file's last name meanwhile, or is removing it: nobody can read the data
// any more, and it is dropped, as writes to a local file unlinked before
// its last close are.
func (n *Node) goneHere(err error) bool {
	n.mu.Lock()
	gone := n.unlinked || n.replacing > 0
	n.mu.Unlock()
	if err == nil || !gone || pb.Errno(err) != syscall.ESTALE {
		return false
	}
	n.c.log.Debug("dirty data of a file removed here dropped", "fid", n.fid)
	return true
}

// refused reports a store the server will never accept as it is.
func refused(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = pb.Errno(err)
	}
	switch errno {
	case syscall.EKEYEXPIRED, syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EROFS, syscall.EACCES, syscall.EPERM, syscall.ESTALE:
		return true
	}
	return false
}

// kept reports an error of storeBack after which the data is in lost/.
func kept(err error) bool {
	var le *lost.Error
	return errors.As(err, &le) && le.Kept != ""
}

// reclaim asks a new session (after a reconnection or a server restart)
// for the write delegation dirty data of n was made under, as the user who
// wrote it, at site at: the server checks that user's right to write. If the server
// no longer has it for this client (revoked after the lease), the data is
// kept in lost/.
func (c *Client) reclaim(at *site.Site, n *Node, state uint64) {
	n.wmu.Lock()
	defer n.wmu.Unlock()
	n.mu.Lock()
	mine := n.dirtyState == state
	n.mu.Unlock()
	if !mine || !n.localChanges() {
		return
	}
	u := c.writerOf(n)
	est, _ := n.entry.Status()
	t := at.Begin()
	defer t.End()
	var reply *pb.OpenReply
	err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
		reply, err = at.RPC.Open(ctx, &pb.OpenRequest{Fid: pb.FromFID(n.fid), Write: true, Reclaim: state, BaseVersion: est.DataVersion})
		return err
	})
	if err != nil {
		c.storeBack(n, true, u) // refused with the old state: kept in lost/
		return
	}
	c.counters.reclaims.Add(1)
	h, ok := c.delegated(t, n, reply.Kind, reply.State)
	covered := ok && h.Kind == callback.DelegWrite
	n.mu.Lock()
	if covered {
		n.dirtyState = h.State
	} else {
		n.dirtyState = 0 // stored as a plain store, which recalls others
	}
	n.mu.Unlock()
	if reply.Recorded {
		at.CloseOne(n.fid, true, u.Token())
	}
	c.learnPB(t, reply.Status, u)
	if !covered {
		// Nothing keeps the data this client's to store later (the grant
		// came back across yet another new session): stored now.
		c.storeBack(n, true, u)
	}
}

// dropDelegations forgets every delegation of site s after a new session began
// (reconnection, server restart) or a reset, and deals with the dirty data
// made under write delegations, including those already dropped when the
// lease lapsed: on a new session it is reclaimed; after a reset the server
// refuses it and it is kept in lost/. Opens the server recorded are gone
// with the session.
func (c *Client) dropDelegations(s *site.Site, reclaim bool) {
	dropped := s.DropDelegations()
	if c.opts.OnRecall != nil {
		for _, h := range dropped {
			go c.opts.OnRecall(h.FID)
		}
	}
	c.nodesMu.Lock()
	for _, n := range c.nodes {
		if n.at() == s {
			n.mu.Lock()
			n.opens.recR, n.opens.recW = 0, 0
			n.mu.Unlock()
		}
	}
	c.nodesMu.Unlock()
	for _, d := range c.flusher.Files() {
		n := d.n
		if n.at() != s {
			continue
		}
		n.mu.Lock()
		state := n.dirtyState
		n.mu.Unlock()
		if state == 0 {
			continue
		}
		if reclaim {
			c.spawn(func() { c.reclaim(s, n, state) })
		} else {
			c.spawn(func() {
				n.wmu.Lock()
				defer n.wmu.Unlock()
				c.storeBack(n, true, c.writerOf(n))
			})
		}
	}
	c.settleAll(s)
}

// onRecall handles a Recall from site s's server.
func (c *Client) onRecall(s *site.Site, m *pb.Recall, statesFrom uint64) {
	// Answered at once, whatever the stores behind it wait for: the
	// server takes a holder silent for a break timeout after a recall to
	// be stopped, and revokes; one that answers has a lease to store in.
	c.spawn(s.Renew)
	for i, f := range m.Fids {
		if i >= len(m.States) {
			break
		}
		fid := f.ToFID()
		ok := s.Recall(fid, m.States[i])
		c.log.Debug("recall", "fid", fid, "state", m.States[i], "held", ok)
		c.counters.recalls.Add(1)
		state := m.States[i]
		switch {
		case ok:
			c.spawn(func() { c.giveBack(s, fid, state) })
		case state < statesFrom:
			c.spawn(func() { c.returnUnknown(s, fid, state) })
		}
	}
}

// returnUnknown gives back a delegation this process never held: the
// server handed it over from an earlier process continuing this client's
// line (a restarted proxy), and recalled it. Nothing this process wrote is
// under it; what the earlier process's own clients wrote comes back
// through their reclaims, which OnRecall waits for first.
func (c *Client) returnUnknown(s *site.Site, fid node.FID, state uint64) {
	if c.opts.OnRecall != nil {
		c.opts.OnRecall(fid)
	}
	err := s.Conn.Call(func(ctx context.Context) error {
		_, err := s.RPC.Return(ctx, &pb.ReturnRequest{Fid: pb.FromFID(fid), State: state})
		return err
	})
	if err != nil {
		c.log.Warn("delegation of an earlier process not returned", "fid", fid, "state", state, "err", err)
	}
}

// onRevoke handles a Revoke from site s's server: the delegations are gone, and dirty data
// under them can no longer be stored; it is kept in lost/.
func (c *Client) onRevoke(s *site.Site, m *pb.Revoke) {
	for i, f := range m.Fids {
		if i >= len(m.States) {
			break
		}
		fid := f.ToFID()
		held := s.Revoke(fid, m.States[i])
		if held {
			c.counters.revoked.Add(1)
			state := m.States[i]
			c.spawn(func() { c.giveBack(s, fid, state) })
		}
	}
}

// giveBackAll gives back site s's delegations the client stopped trusting: their
// dirty data is stored if the server still holds them, kept in lost/ if not.
func (c *Client) giveBackAll(s *site.Site, hs []callback.Held) {
	for _, h := range hs {
		c.spawn(func() { c.giveBack(s, h.FID, h.State) })
	}
}

// returnAll gives every delegation of site s back, at Close, after the flusher
// drained: other clients need not wait for a lease to run out.
func (c *Client) returnAll(s *site.Site) {
	held := s.DropDelegations()
	if len(held) > 0 && s.Conn.AwaitReady(s.Conn.GiveUpAt()) != nil {
		// Closing with the server gone: what they covered was kept in
		// lost/ (flushAll), and the server revokes them after the lease.
		c.log.Warn("delegations not returned: the server is unreachable", "server", s.Addr, "delegations", len(held))
		return
	}
	var wg sync.WaitGroup
	for _, h := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.giveBack(s, h.FID, h.State)
		}()
	}
	wg.Wait()
}

// setGauges publishes what `hoard cache stats` shows of another process;
// the flush rate is over the time since the last call (a second, from the
// expirer).
func (c *Client) setGauges() {
	st := c.Stats()
	now := time.Now()
	if dt := now.Sub(c.rate.at).Seconds(); !c.rate.at.IsZero() && dt > 0 {
		c.cache.SetGauge("flush_rate", int64(float64(st.Flushed-c.rate.flushed)/dt))
	}
	c.rate.at, c.rate.flushed = now, st.Flushed
	c.cache.SetGauge("callbacks", int64(st.Promises))
	c.cache.SetGauge("delegations_read", int64(st.ReadDelegations))
	c.cache.SetGauge("delegations_write", int64(st.WriteDelegations))
	c.cache.SetGauge("recalls", st.Recalls)
	c.cache.SetGauge("dirty_bytes", st.DirtyBytes)
	c.cache.SetGauge("flushed_bytes", st.Flushed)
	c.cache.SetGauge("made_here", st.MadeHere)
	c.cache.SetGauge("made_dropped", st.MadeDropped)
	c.cache.SetGauge("made_settled", st.Settled)
	c.cache.SetGauge("removed_here", st.RemovedHere)
	c.cache.SetGauge("nodes", int64(st.Nodes))
}
