package callback

import (
	"sort"
	"time"

	"github.com/hoardfs/hoard/node"
)

// Delegations (the cacheDAFS thesis, after NFSv4): a client that opens a file nobody
// else has open in a conflicting way is given a read delegation (any
// number of clients) or a write delegation (one client, nobody else has
// the file open). Under it the client serves opens, closes and attributes
// locally and, with a write delegation, keeps writes as dirty data. A
// conflicting open, or a change by another client, recalls it: the holder
// flushes and returns it (Return) before the conflicting operation goes
// on. Delegations are leases: every request from the holder renews them
// (Renew); a holder silent for Lease loses them, and a recall unanswered
// for Lease revokes the delegation so that the waiter goes on. A store
// under a delegation the holder no longer has is refused (Valid): late
// dirty data is never merged silently.

// DelegKind is the kind of a delegation.
type DelegKind uint8

const (
	DelegNone DelegKind = iota
	DelegRead
	DelegWrite
)

func (k DelegKind) String() string {
	switch k {
	case DelegRead:
		return "read"
	case DelegWrite:
		return "write"
	}
	return "none"
}

// deleg is one client's delegation on one file.
type deleg struct {
	client   ClientID
	fid      node.FID
	kind     DelegKind
	state    uint64
	recalled time.Time // zero until recalled
	rounds   []Round   // rounds waiting for it to be returned
}

// openCount is the opens the server knows a client has on a file: those
// made without a delegation, and those reported when one was returned.
type openCount struct{ readers, writers int }

// OpenResult is the answer to an open.
type OpenResult struct {
	// Wait: conflicting delegations are being recalled. Nothing was
	// recorded; wait for the round to complete, then open again.
	Wait Round
	// Kind and State name the delegation the client holds on the file
	// after the open (DelegNone, 0: none).
	Kind  DelegKind
	State uint64
	// Recorded: the open is not covered by the delegation and was
	// recorded; the client reports its close with Close.
	Recorded bool
}

// Opening is an open as the machine sees it.
type Opening struct {
	Write bool
	// Limit: no delegation stronger than this is granted (DelegNone:
	// none). A proxy delegates only what it holds from its origin.
	Limit DelegKind
	// Only: the client asks for the delegation alone (a proxy for its own
	// clients, a client for a directory to make files in). No close
	// follows, so an open that comes without one is not recorded.
	Only bool
}

// Open records an open of fid by id, for writing or not, that may come
// with any delegation (OpenWith).
func (s *Server) Open(id ClientID, fid node.FID, write bool, now time.Time) (OpenResult, []Msg) {
	return s.OpenWith(id, fid, Opening{Write: write, Limit: DelegWrite}, now)
}

// OpenWith records an open of fid by id. If another client holds a
// delegation that conflicts with it (any, for a write; a write
// delegation, for a read), those are recalled and the caller must wait.
// Otherwise the open may come with a delegation (delegable); a client
// that holds a read delegation and opens for writing is upgraded when it
// can be (a new state: the old one is no longer valid). A delegation of
// the client's own that is being recalled covers no new open: that one
// is recorded (unless Only), and the delegation reported.
func (s *Server) OpenWith(id ClientID, fid node.FID, o Opening, now time.Time) (OpenResult, []Msg) {
	c := s.clients[id]
	if c == nil {
		return OpenResult{}, nil
	}
	s.Renew(id, now)
	if r, msgs := s.recallOn(id, []node.FID{fid}, func(d *deleg) bool { return o.Write || d.kind == DelegWrite }, now); r != 0 {
		return OpenResult{Wait: r}, msgs
	}
	own := c.delegs[fid]
	if own != nil && own.recalled.IsZero() && (own.kind == DelegWrite || !o.Write) {
		return OpenResult{Kind: own.kind, State: own.state}, nil
	}
	kind := DelegRead
	if o.Write {
		kind = DelegWrite
	}
	if kind <= o.Limit && s.delegable(id, fid, o.Write, now) {
		if own != nil {
			s.dropDeleg(own)
		}
		d := s.grantDeleg(id, fid, kind)
		return OpenResult{Kind: d.kind, State: d.state}, nil
	}
	var res OpenResult
	if own != nil {
		res.Kind, res.State = own.kind, own.state
	}
	if o.Only {
		return res, nil
	}
	oc := s.openOf(id, fid)
	if o.Write {
		oc.writers++
	} else {
		oc.readers++
	}
	res.Recorded = true
	return res, nil
}

// Delegable reports whether an open of fid by id would be given a new
// delegation now, limits aside: a proxy asks its origin for one only then.
func (s *Server) Delegable(id ClientID, fid node.FID, write bool, now time.Time) bool {
	c := s.clients[id]
	if c == nil {
		return false
	}
	if own := c.delegs[fid]; own != nil && own.recalled.IsZero() && (own.kind == DelegWrite || !write) {
		return false // it has one
	}
	return s.delegable(id, fid, write, now)
}

// delegable reports whether an open of fid by id may come with a new
// delegation: the lease is configured, nobody else has the file open in a
// conflicting way, no recall on it is under way (a stream of readers must
// not starve a writer waiting for one), no change to it is (busy.go), and
// id is not backing off (RecallBackoff).
func (s *Server) delegable(id ClientID, fid node.FID, write bool, now time.Time) bool {
	return s.cfg.Lease > 0 && !s.quiet[fid.Volume] && !s.othersOpen(id, fid, write) && !s.recalling(fid) && s.busy[fid] == 0 && !now.Before(s.clients[id].noDelegUntil)
}

// recalling reports whether a recall of a delegation on fid is under way.
func (s *Server) recalling(fid node.FID) bool {
	for _, d := range s.delegsByFID[fid] {
		if !d.recalled.IsZero() {
			return true
		}
	}
	return false
}

// othersOpen reports whether a client other than id has fid open, or
// holds a delegation on it, in a way that rules out a delegation for this
// open: anything at all for a write, a writer for a read.
func (s *Server) othersOpen(id ClientID, fid node.FID, write bool) bool {
	for other, o := range s.opensByFID[fid] {
		if other != id && (write || o.writers > 0) {
			return true
		}
	}
	for other, d := range s.delegsByFID[fid] {
		if other != id && (write || d.kind == DelegWrite) {
			return true
		}
	}
	return false
}

func (s *Server) openOf(id ClientID, fid node.FID) *openCount {
	c := s.clients[id]
	o := c.opens[fid]
	if o == nil {
		o = &openCount{}
		c.opens[fid] = o
		if s.opensByFID[fid] == nil {
			s.opensByFID[fid] = map[ClientID]*openCount{}
		}
		s.opensByFID[fid][id] = o
	}
	return o
}

func (s *Server) setOpens(id ClientID, fid node.FID, readers, writers int) {
	if readers <= 0 && writers <= 0 {
		s.dropOpens(id, fid)
		return
	}
	o := s.openOf(id, fid)
	o.readers, o.writers = max(readers, 0), max(writers, 0)
}

func (s *Server) dropOpens(id ClientID, fid node.FID) {
	delete(s.clients[id].opens, fid)
	delete(s.opensByFID[fid], id)
	if len(s.opensByFID[fid]) == 0 {
		delete(s.opensByFID, fid)
	}
}

func (s *Server) grantDeleg(id ClientID, fid node.FID, kind DelegKind) *deleg {
	s.nextState++
	d := &deleg{client: id, fid: fid, kind: kind, state: s.nextState}
	s.clients[id].delegs[fid] = d
	if s.delegsByFID[fid] == nil {
		s.delegsByFID[fid] = map[ClientID]*deleg{}
	}
	s.delegsByFID[fid][id] = d
	return d
}

// dropDeleg forgets a delegation and completes the rounds waiting for it;
// a gone session goes with its last one.
func (s *Server) dropDeleg(d *deleg) {
	c := s.clients[d.client]
	delete(c.delegs, d.fid)
	delete(c.recalled, d.fid)
	if c.gone && len(c.delegs) == 0 {
		delete(s.clients, d.client)
	}
	delete(s.delegsByFID[d.fid], d.client)
	if len(s.delegsByFID[d.fid]) == 0 {
		delete(s.delegsByFID, d.fid)
	}
	for _, r := range d.rounds {
		s.settle(r)
	}
	d.rounds = nil
}

// Close records the close of an open that came without a delegation.
func (s *Server) Close(id ClientID, fid node.FID, write bool) {
	c := s.clients[id]
	if c == nil || c.opens[fid] == nil {
		return
	}
	o := c.opens[fid]
	if write {
		o.writers--
	} else {
		o.readers--
	}
	s.setOpens(id, fid, o.readers, o.writers)
}

// Recall is called before a change by origin (0: no client) to fids is
// made: every other client's delegation on them is recalled, and the
// change waits for the round (0: nothing to wait for).
func (s *Server) Recall(origin ClientID, fids []node.FID, now time.Time) (Round, []Msg) {
	return s.recallOn(origin, fids, func(*deleg) bool { return true }, now)
}

// RecallWriters is called before a file's status or data is read for
// origin: other clients' write delegations on fids are recalled, since
// their holders' data and size are newer than the server's.
func (s *Server) RecallWriters(origin ClientID, fids []node.FID, now time.Time) (Round, []Msg) {
	return s.recallOn(origin, fids, func(d *deleg) bool { return d.kind == DelegWrite }, now)
}

func (s *Server) recallOn(origin ClientID, fids []node.FID, conflicts func(*deleg) bool, now time.Time) (Round, []Msg) {
	if origin != 0 {
		s.Renew(origin, now)
	}
	var all, adopt []*deleg
	seen := map[node.FID]bool{}
	for _, f := range fids {
		if seen[f] {
			continue
		}
		seen[f] = true
		for id, d := range s.delegsByFID[f] {
			switch {
			case id == origin || !conflicts(d):
			case s.ownGone(origin, id):
				adopt = append(adopt, d)
			default:
				all = append(all, d)
			}
		}
	}
	var msgs []Msg
	for _, d := range adopt {
		_, m := s.handOver(d, origin)
		msgs = append(msgs, m...)
	}
	r, more := s.recallAll(all, now)
	return r, append(msgs, more...)
}

// ownGone reports whether holder is a gone session of requester's line:
// the same client, come back (a proxy restarted, continuing its last
// session with the token kept in its cache). What the gone session held
// is the requester's, handed over rather than recalled from nobody for a
// lease; the requester's own clients' reclaims bring it here.
func (s *Server) ownGone(requester, holder ClientID) bool {
	r, h := s.clients[requester], s.clients[holder]
	return requester != 0 && r != nil && h != nil && h.gone && h.line == r.line
}

// recallAll opens a round that completes when each of ds has been
// returned or revoked, sending a recall for those not yet recalled (one
// message per holder).
func (s *Server) recallAll(ds []*deleg, now time.Time) (Round, []Msg) {
	if len(ds) == 0 {
		return 0, nil
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].state < ds[j].state })
	s.nextRound++
	r := s.nextRound
	byClient := map[ClientID]*Msg{}
	var ids []ClientID
	for _, d := range ds {
		d.rounds = append(d.rounds, r)
		s.rounds[r]++
		if !d.recalled.IsZero() {
			continue
		}
		d.recalled = now
		s.clients[d.client].recalled[d.fid] = d
		m := byClient[d.client]
		if m == nil {
			m = &Msg{Kind: MsgRecall, Client: d.client}
			byClient[d.client] = m
			ids = append(ids, d.client)
		}
		m.FIDs = append(m.FIDs, d.fid)
		m.States = append(m.States, d.state)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var msgs []Msg // nil when every one was recalled already
	for _, id := range ids {
		msgs = append(msgs, *byClient[id])
	}
	return r, msgs
}

// Return gives back id's delegation on fid, after the holder stored its
// dirty data; readers and writers are the opens it made under the
// delegation and still has, which the server adds to those it recorded
// (opens it sent while the return was on its way are among those). A
// return of a delegation the client no longer holds (revoked, or replaced
// by an upgrade) reports false.
func (s *Server) Return(id ClientID, fid node.FID, state uint64, readers, writers int, now time.Time) bool {
	c := s.clients[id]
	if c == nil {
		return false
	}
	s.Renew(id, now)
	d := c.delegs[fid]
	if d == nil || d.state != state {
		return false
	}
	s.dropDeleg(d)
	o := s.openOf(id, fid)
	s.setOpens(id, fid, o.readers+readers, o.writers+writers)
	return true
}

// FileGone forgets the delegations and opens on a file that no longer
// exists (its last name was removed): there is nothing left to protect,
// and a client creating and removing many files must not pile them up.
func (s *Server) FileGone(fid node.FID) {
	for _, d := range s.delegsByFID[fid] {
		s.dropDeleg(d)
	}
	for id := range s.opensByFID[fid] {
		s.dropOpens(id, fid)
	}
}

// Valid reports whether id holds the delegation state on fid: a store
// made under a delegation is accepted only then.
func (s *Server) Valid(id ClientID, fid node.FID, state uint64) bool {
	c := s.clients[id]
	return c != nil && c.delegs[fid] != nil && c.delegs[fid].state == state
}

// Renew extends id's lease: every request from a client renews it.
func (s *Server) Renew(id ClientID, now time.Time) {
	if c := s.clients[id]; c != nil {
		c.leaseEnd, c.heard = now.Add(s.cfg.Lease), now
	}
}

// Delegation is the delegation id holds on fid (DelegNone, 0 if none).
func (s *Server) Delegation(id ClientID, fid node.FID) (DelegKind, uint64) {
	if c := s.clients[id]; c != nil && c.delegs[fid] != nil {
		return c.delegs[fid].kind, c.delegs[fid].state
	}
	return DelegNone, 0
}

// Delegations is the number of delegations held across all clients.
func (s *Server) Delegations() int {
	n := 0
	for _, m := range s.delegsByFID {
		n += len(m)
	}
	return n
}

// revokeExpired revokes the delegations of holders whose lease ran out,
// those recalled more than Lease ago, and write delegations whose holder
// said nothing for BreakTimeout after their recall, telling each holder
// which.
func (s *Server) revokeExpired(now time.Time) []Msg {
	var ids []ClientID
	for id, c := range s.clients {
		if len(c.delegs) > 0 {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var msgs []Msg
	for _, id := range ids {
		c := s.clients[id]
		silent := !c.leaseEnd.After(now)
		candidates := c.recalled
		if silent {
			candidates = c.delegs
		}
		var gone []*deleg
		for _, d := range candidates {
			if silent || !s.recallEnd(c, d).After(now) {
				gone = append(gone, d)
			}
		}
		if len(gone) == 0 {
			continue
		}
		sort.Slice(gone, func(i, j int) bool { return gone[i].state < gone[j].state })
		m := Msg{Kind: MsgRevoke, Client: id}
		for _, d := range gone {
			if !d.recalled.IsZero() {
				c.noDelegUntil = now.Add(s.cfg.RecallBackoff)
			}
			s.dropDeleg(d)
			m.FIDs = append(m.FIDs, d.fid)
			m.States = append(m.States, d.state)
		}
		if !c.gone {
			msgs = append(msgs, m)
		}
	}
	return msgs
}

// Reclaim hands id, on a new session, the delegation state on fid that
// another session of the same client (the same line) left behind: gone
// (Disconnect), or not yet noticed gone. It fails if that delegation is
// gone: revoked after the lease, so another client may have opened the
// file since. A recalled one stays recalled, and the recall is sent again
// to its new holder.
func (s *Server) Reclaim(id ClientID, fid node.FID, state uint64, now time.Time) (Held, []Msg, bool) {
	c := s.clients[id]
	if c == nil || c.gone {
		return Held{}, nil, false
	}
	s.Renew(id, now)
	for _, o := range s.delegsByFID[fid] {
		if o.state == state && o.client != id && s.clients[o.client].line == c.line {
			h, msgs := s.handOver(o, id)
			return h, msgs, true
		}
	}
	return Held{}, nil, false
}

// Restore gives id a write delegation on fid in the grace period after a
// restart: the server checked its reclaim (the file is as the client's
// delegation of the last life left it) and nobody else may have opened
// the file since. It is given whatever a proxy holds from its origin: the
// client's data under it must reach the origin before the proxy gives
// that back (its recall waits for the grace period, then for this one).
// It fails if another client holds a delegation on fid.
func (s *Server) Restore(id ClientID, fid node.FID, now time.Time) (Held, bool) {
	c := s.clients[id]
	if c == nil || c.gone {
		return Held{}, false
	}
	for other := range s.delegsByFID[fid] {
		if other != id {
			return Held{}, false
		}
	}
	s.Renew(id, now)
	if own := c.delegs[fid]; own != nil {
		if own.kind == DelegWrite {
			return Held{FID: fid, Kind: own.kind, State: own.state, Recalled: !own.recalled.IsZero()}, true
		}
		s.dropDeleg(own)
	}
	d := s.grantDeleg(id, fid, DelegWrite)
	return Held{FID: fid, Kind: d.kind, State: d.state}, true
}

// handOver moves delegation d to session id, of the same line.
func (s *Server) handOver(d *deleg, id ClientID) (Held, []Msg) {
	c, fid := s.clients[id], d.fid
	old := s.clients[d.client]
	delete(old.delegs, fid)
	delete(old.recalled, fid)
	delete(s.delegsByFID[fid], d.client)
	if len(old.delegs) == 0 && old.gone {
		delete(s.clients, d.client)
	}
	if own := c.delegs[fid]; own != nil {
		s.dropDeleg(own) // may take the file's last entry, and its map
	}
	d.client = id
	c.delegs[fid] = d
	if !d.recalled.IsZero() {
		c.recalled[fid] = d
	}
	if s.delegsByFID[fid] == nil {
		s.delegsByFID[fid] = map[ClientID]*deleg{}
	}
	s.delegsByFID[fid][id] = d
	h := Held{FID: fid, Kind: d.kind, State: d.state, Recalled: !d.recalled.IsZero()}
	var msgs []Msg
	if h.Recalled {
		msgs = []Msg{{Kind: MsgRecall, Client: id, FIDs: []node.FID{fid}, States: []uint64{d.state}}}
	}
	return h, msgs
}

// readRecallOverdue reports a client that left the recall of a read
// delegation unanswered for BreakTimeout: with nothing to store first, it
// is as unresponsive as one that does not acknowledge a break. (A write
// delegation's holder may have much to store: it has a lease.)
func (s *Server) readRecallOverdue(c *clientState, now time.Time) bool {
	if s.cfg.BreakTimeout <= 0 {
		return false
	}
	for _, d := range c.recalled {
		if d.kind == DelegRead && !d.recalled.Add(s.cfg.BreakTimeout).After(now) {
			return true
		}
	}
	return false
}

// recallEnd is when a write delegation under recall is revoked: a lease
// after the recall, for a holder storing what it wrote; the break timeout
// after it, for one connected and silent since (a client acknowledges a
// recall at once), which is not storing anything: NFSv4 servers, waiting
// out a lease, let such a client hold every writer up for it.
func (s *Server) recallEnd(c *clientState, d *deleg) time.Time {
	if !c.gone && s.cfg.BreakTimeout > 0 && c.heard.Before(d.recalled) {
		return d.recalled.Add(min(s.cfg.BreakTimeout, s.cfg.Lease))
	}
	return d.recalled.Add(s.cfg.Lease)
}

// delegDeadline is the earliest lease or recall expiry; zero if none.
func (s *Server) delegDeadline() time.Time {
	var next time.Time
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, c := range s.clients {
		if len(c.delegs) == 0 {
			continue
		}
		earlier(c.leaseEnd)
		for _, d := range c.recalled {
			if d.kind == DelegRead && s.cfg.BreakTimeout > 0 {
				earlier(d.recalled.Add(s.cfg.BreakTimeout))
			} else {
				earlier(s.recallEnd(c, d))
			}
		}
	}
	return next
}
