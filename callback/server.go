// Package callback holds hoard's callback promises as pure, deterministic
// state machines, in the style of etcd's raft package: no goroutines, no
// sockets, no clocks (time is an argument), no randomness. The file server
// feeds Server its requests, acknowledgements and ticks and sends the
// messages it returns; the cache manager keeps its promises in a Client.
// Neither is safe for concurrent use: the caller serialises.
package callback

import (
	"container/heap"
	"sort"
	"time"

	"github.com/hoardfs/hoard/node"
)

// ClientID names a connected client for the life of one Server.
type ClientID uint64

// Config tunes a Server.
type Config struct {
	// PromiseTTL is how long a granted promise lasts.
	PromiseTTL time.Duration
	// BreakTimeout is how long a break may stay unacknowledged before its
	// holder is given up on.
	BreakTimeout time.Duration
	// MaxPromises bounds promises held across all clients; 0: unbounded.
	MaxPromises int
	// BreakLog is how many recent breaks are remembered for grant checks
	// (default 65536); a grant whose request began before the oldest one
	// remembered is refused, which is safe, merely conservative.
	BreakLog int
	// Lease is how long a delegation outlives its holder's last request,
	// and how long a recall may go unanswered; 0: no delegations.
	Lease time.Duration
	// RecallBackoff is how long a client that left a recall unanswered
	// until it was revoked gets no new delegation (default ten leases):
	// taking one again at once, it would make the next waiter wait out
	// a lease again, and the next (NFSv4 servers stop delegating to a
	// client whose callbacks fail, too).
	RecallBackoff time.Duration
	// Dirs says which directories may be delegated (dirpolicy.go).
	Dirs DirPolicy
}

// MsgKind says what a Msg asks the caller to send.
type MsgKind uint8

const (
	// MsgBreak: the promises on FIDs are void; the client acknowledges Seq.
	MsgBreak MsgKind = iota + 1
	// MsgReset: every promise and delegation the client holds is void.
	MsgReset
	// MsgRecall: return the delegations States on FIDs (after storing
	// their dirty data).
	MsgRecall
	// MsgRevoke: the delegations States on FIDs are gone; dirty data
	// under them can no longer be stored.
	MsgRevoke
)

// Msg is a message for the caller to send to Client.
type Msg struct {
	Kind   MsgKind
	Client ClientID
	Seq    uint64
	FIDs   []node.FID
	States []uint64 // recall and revoke: the delegation of each FID
}

// Round identifies the breaks of one change; 0 means nothing to wait for.
type Round uint64

type promiseKey struct {
	client ClientID
	fid    node.FID
}

// promise is one (client, FID) lease, kept in an expiry heap.
type promise struct {
	promiseKey
	expiry time.Time
	index  int // in the heap
}

type promiseHeap []*promise

func (h promiseHeap) Len() int { return len(h) }
func (h promiseHeap) Less(i, j int) bool {
	if !h[i].expiry.Equal(h[j].expiry) {
		return h[i].expiry.Before(h[j].expiry)
	}
	if h[i].client != h[j].client {
		return h[i].client < h[j].client
	}
	return fidLess(h[i].fid, h[j].fid)
}
func (h promiseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *promiseHeap) Push(x any) { p := x.(*promise); p.index = len(*h); *h = append(*h, p) }
func (h *promiseHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	p.index = -1
	return p
}

func fidLess(a, b node.FID) bool {
	if a.Volume != b.Volume {
		return a.Volume < b.Volume
	}
	if a.Vnode != b.Vnode {
		return a.Vnode < b.Vnode
	}
	return a.Unique < b.Unique
}

// outstanding is a break sent and not yet acknowledged, with the rounds
// that wait for it: its own change's, and those of later changes to the
// same FIDs (see Break).
type outstanding struct {
	seq    uint64
	rounds []Round
	fids   []node.FID
	sent   time.Time
}

type clientState struct {
	name string
	// line is the first session of the client this one continues (its
	// own id if none): sessions of one line may reclaim each other's
	// delegations. The server vouches for it; a name proves nothing.
	line     ClientID
	promises map[node.FID]*promise
	nextSeq  uint64
	pending  []outstanding // in seq order
	delegs   map[node.FID]*deleg
	// recalled are the delegs under recall: the timer looks at these
	// alone, not at every delegation a client holds.
	recalled map[node.FID]*deleg
	opens    map[node.FID]*openCount
	leaseEnd time.Time
	// heard is when the client last said anything (Renew): a holder
	// silent since a recall, on a live back channel, is not storing.
	heard time.Time
	// noDelegUntil: this session left a recall unanswered until it was
	// revoked, and gets no new delegation until then (RecallBackoff).
	noDelegUntil time.Time
	// gone: the back channel ended while delegations were out; they are
	// kept until the lease runs out, for a new session to reclaim.
	gone bool
}

// Server tracks which clients hold promises on which FIDs.
type Server struct {
	epoch   uint64
	cfg     Config
	nextID  ClientID
	clients map[ClientID]*clientState
	byFID   map[node.FID]map[ClientID]*promise
	expiry  promiseHeap
	// rounds counts unacknowledged breaks per round still open.
	rounds    map[Round]int
	nextRound Round
	// breakSeq numbers every Break call; recent remembers the last
	// sequence at which each recently broken FID was broken.
	breakSeq uint64
	recent   map[node.FID]uint64
	log      []breakRecord // ring, oldest first
	logStart int
	// Delegations and the opens made without them, by file.
	delegsByFID map[node.FID]map[ClientID]*deleg
	opensByFID  map[node.FID]map[ClientID]*openCount
	nextState   uint64
	// busy counts the changes under way on each FID (busy.go).
	busy map[node.FID]int
	// quiet are the volumes nothing is granted on (quiet.go).
	quiet map[uint64]bool
}

type breakRecord struct {
	fid node.FID
	seq uint64
}

// NewServer starts an empty state machine for one server epoch.
func NewServer(epoch uint64, cfg Config) *Server {
	if cfg.BreakLog <= 0 {
		cfg.BreakLog = 1 << 16
	}
	if cfg.RecallBackoff <= 0 {
		cfg.RecallBackoff = 10 * cfg.Lease
	}
	// Delegation states count on from epoch<<32: a client remembers what
	// became of states it was granted (returned, recalled), and a state
	// of the previous life granted again would meet that memory and be
	// refused, while the server counts it held.
	return &Server{epoch: epoch, cfg: cfg, nextState: epoch << 32, clients: map[ClientID]*clientState{},
		byFID: map[node.FID]map[ClientID]*promise{}, rounds: map[Round]int{}, recent: map[node.FID]uint64{},
		delegsByFID: map[node.FID]map[ClientID]*deleg{}, opensByFID: map[node.FID]map[ClientID]*openCount{}, busy: map[node.FID]int{}}
}

// Epoch is the server epoch the machine was made for.
func (s *Server) Epoch() uint64 { return s.epoch }

// Name is what client id called itself, "" for an unknown id.
func (s *Server) Name(id ClientID) string {
	if c := s.clients[id]; c != nil {
		return c.name
	}
	return ""
}

// Connect registers a new back channel of the client called name (what
// its Hello said) and returns its id. line is the line of sessions it
// continues (Line of its previous session), 0 for a new client.
func (s *Server) Connect(name string, line ClientID, now time.Time) ClientID {
	s.nextID++
	if line == 0 {
		line = s.nextID
	}
	s.clients[s.nextID] = &clientState{name: name, line: line, promises: map[node.FID]*promise{},
		delegs: map[node.FID]*deleg{}, recalled: map[node.FID]*deleg{}, opens: map[node.FID]*openCount{}, leaseEnd: now.Add(s.cfg.Lease), heard: now}
	return s.nextID
}

// NextState is the state the next delegation granted will have.
func (s *Server) NextState() uint64 { return s.nextState + 1 }

// Line is the line of sessions id belongs to (Connect), 0 if unknown.
func (s *Server) Line(id ClientID) ClientID {
	if c := s.clients[id]; c != nil {
		return c.line
	}
	return 0
}

// Known reports whether id is connected.
func (s *Server) Known(id ClientID) bool { return s.clients[id] != nil && !s.clients[id].gone }

// Disconnect forgets a client: its promises, opens and read delegations
// are dropped and rounds stop waiting for its acknowledgements. Its write
// delegations outlive it until its lease runs out (a conflicting open
// recalls them and waits for that): the client may be back on a new
// session, with dirty data to store under them (Reclaim).
func (s *Server) Disconnect(id ClientID, now time.Time) {
	c := s.clients[id]
	if c == nil || c.gone {
		return
	}
	s.dropPromises(c)
	for fid := range c.opens {
		s.dropOpens(id, fid)
	}
	for _, d := range c.delegs {
		if d.kind != DelegWrite || !c.leaseEnd.After(now) {
			s.dropDeleg(d)
		}
	}
	if len(c.delegs) > 0 {
		c.gone = true
		return
	}
	delete(s.clients, id)
}

// dropPromises removes every promise and pending break of a client.
func (s *Server) dropPromises(c *clientState) {
	for _, p := range c.promises {
		s.remove(p)
	}
	for _, o := range c.pending {
		s.settleAll(o)
	}
	c.pending = nil
}

func (s *Server) remove(p *promise) {
	if p.index >= 0 {
		heap.Remove(&s.expiry, p.index)
	}
	delete(s.clients[p.client].promises, p.fid)
	holders := s.byFID[p.fid]
	delete(holders, p.client)
	if len(holders) == 0 {
		delete(s.byFID, p.fid)
	}
}

func (s *Server) settle(r Round) {
	if r == 0 {
		return
	}
	if s.rounds[r]--; s.rounds[r] <= 0 {
		delete(s.rounds, r)
	}
}

// settleAll settles the rounds waiting for o.
func (s *Server) settleAll(o outstanding) {
	for _, r := range o.rounds {
		s.settle(r)
	}
}

// Seq is the current break sequence. An RPC takes it before reading the
// state it will reply with, and passes it to Grant.
func (s *Server) Seq() uint64 { return s.breakSeq }

// Grant records a promise for (id, fid) lasting PromiseTTL from now
// (re-granting extends it) and returns the TTL granted. ok is false, and
// nothing is recorded, for an unknown client or when fid was broken after
// since (the reply would describe state older than that break). When
// MaxPromises would be exceeded, the promises expiring soonest are broken
// to make room; those messages belong to no round.
func (s *Server) Grant(id ClientID, fid node.FID, since uint64, now time.Time) (ttl time.Duration, msgs []Msg, ok bool) {
	c := s.clients[id]
	if c == nil || s.brokenSince(fid, since) || s.quiet[fid.Volume] {
		return 0, nil, false
	}
	expiry := now.Add(s.cfg.PromiseTTL)
	if p := c.promises[fid]; p != nil {
		p.expiry = expiry
		heap.Fix(&s.expiry, p.index)
		return s.cfg.PromiseTTL, nil, true
	}
	p := &promise{promiseKey: promiseKey{id, fid}, expiry: expiry}
	c.promises[fid] = p
	if s.byFID[fid] == nil {
		s.byFID[fid] = map[ClientID]*promise{}
	}
	s.byFID[fid][id] = p
	heap.Push(&s.expiry, p)
	if s.cfg.MaxPromises > 0 && s.expiry.Len() > s.cfg.MaxPromises {
		msgs = s.evict(p, now)
	}
	return s.cfg.PromiseTTL, msgs, true
}

// brokenSince reports whether fid was broken after sequence since, or
// might have been (the log no longer reaches back that far).
func (s *Server) brokenSince(fid node.FID, since uint64) bool {
	if since >= s.breakSeq {
		return false
	}
	if seq, ok := s.recent[fid]; ok && seq > since {
		return true
	}
	if len(s.log) == s.cfg.BreakLog && s.log[s.logStart].seq > since+1 {
		return true
	}
	return false
}

// evict breaks the soonest-expiring promises, sparing keep, until the bound
// holds again.
func (s *Server) evict(keep *promise, now time.Time) []Msg {
	heap.Remove(&s.expiry, keep.index)
	var victims []*promise
	for s.expiry.Len() > s.cfg.MaxPromises-1 {
		p := heap.Pop(&s.expiry).(*promise)
		victims = append(victims, p)
		s.remove(p)
	}
	heap.Push(&s.expiry, keep)
	byClient := map[ClientID][]node.FID{}
	for _, p := range victims {
		byClient[p.client] = append(byClient[p.client], p.fid)
	}
	return s.messages(byClient, 0, now)
}

// messages builds one break per client, in client order, and records them
// as outstanding in round r.
func (s *Server) messages(byClient map[ClientID][]node.FID, r Round, now time.Time) []Msg {
	ids := make([]ClientID, 0, len(byClient))
	for id := range byClient {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	msgs := make([]Msg, 0, len(ids))
	for _, id := range ids {
		c := s.clients[id]
		c.nextSeq++
		o := outstanding{seq: c.nextSeq, fids: byClient[id], sent: now}
		if r != 0 {
			o.rounds = []Round{r}
			s.rounds[r]++
		}
		c.pending = append(c.pending, o)
		msgs = append(msgs, Msg{Kind: MsgBreak, Client: id, Seq: c.nextSeq, FIDs: byClient[id]})
	}
	return msgs
}

// Break is called when a change to fids is about to be acknowledged to
// origin (0: no client). Every other holder loses its promises on them;
// one message per holder is returned. The Round completes when each was
// acknowledged, or its holder disconnected or was given up on.
//
// It also waits for the clients other than origin still to acknowledge
// an earlier break of any of fids: until they do, they may answer from
// what that earlier change replaced. Without this, a change made on top
// of one still under way could return while a client saw the state
// before both (a create of a name a rename had just freed, while
// another client still opened the file the rename moved away).
func (s *Server) Break(origin ClientID, fids []node.FID, now time.Time) (Round, []Msg) {
	s.breakSeq++
	byClient := map[ClientID][]node.FID{}
	seen := map[node.FID]bool{}
	for _, f := range fids {
		if seen[f] {
			continue
		}
		seen[f] = true
		s.logBreak(f)
		for id, p := range s.byFID[f] {
			if id == origin {
				continue
			}
			byClient[id] = append(byClient[id], f)
			s.remove(p)
		}
	}
	behind := s.unacked(origin, seen, byClient)
	if len(byClient) == 0 && len(behind) == 0 {
		return 0, nil
	}
	s.nextRound++
	r := s.nextRound
	for _, o := range behind {
		o.rounds = append(o.rounds, r)
		s.rounds[r]++
	}
	return r, s.messages(byClient, r, now)
}

// unacked finds, for each client other than origin and those about to be
// sent a break (acknowledging it acknowledges the earlier ones), its
// latest unacknowledged break of any of fids.
func (s *Server) unacked(origin ClientID, fids map[node.FID]bool, sending map[ClientID][]node.FID) []*outstanding {
	var found []*outstanding
	for id, c := range s.clients {
		if _, ok := sending[id]; ok || id == origin {
			continue
		}
	scan:
		for i := len(c.pending) - 1; i >= 0; i-- {
			for _, f := range c.pending[i].fids {
				if fids[f] {
					found = append(found, &c.pending[i])
					break scan
				}
			}
		}
	}
	return found
}

func (s *Server) logBreak(f node.FID) {
	s.recent[f] = s.breakSeq
	rec := breakRecord{f, s.breakSeq}
	if len(s.log) < s.cfg.BreakLog {
		s.log = append(s.log, rec)
		return
	}
	old := s.log[s.logStart]
	if s.recent[old.fid] == old.seq {
		delete(s.recent, old.fid)
	}
	s.log[s.logStart] = rec
	s.logStart = (s.logStart + 1) % len(s.log)
}

// Ack acknowledges every break to id with sequence <= seq.
func (s *Server) Ack(id ClientID, seq uint64, now time.Time) {
	c := s.clients[id]
	if c == nil {
		return
	}
	i := 0
	for ; i < len(c.pending) && c.pending[i].seq <= seq; i++ {
		s.settleAll(c.pending[i])
	}
	c.pending = c.pending[i:]
}

// Done reports whether round r completed (forgotten rounds are done).
func (s *Server) Done(r Round) bool { return s.rounds[r] <= 0 }

// Tick advances time: expired promises are dropped (clients expire their
// own), and a holder that left a break, or the recall of a read delegation
// (nothing to store first), unanswered for BreakTimeout is lost: its
// promises and delegations are dropped, rounds stop waiting for it, and a
// Reset is returned for it. It stays connected and may earn
// promises again. Delegations whose holder's lease ran out, or recalled
// more than Lease ago, are revoked.
func (s *Server) Tick(now time.Time) []Msg {
	for s.expiry.Len() > 0 && !s.expiry[0].expiry.After(now) {
		s.remove(heap.Pop(&s.expiry).(*promise))
	}
	var lost []ClientID
	for id, c := range s.clients {
		if len(c.pending) > 0 && !c.pending[0].sent.Add(s.cfg.BreakTimeout).After(now) || s.readRecallOverdue(c, now) {
			lost = append(lost, id)
		}
	}
	sort.Slice(lost, func(i, j int) bool { return lost[i] < lost[j] })
	var msgs []Msg
	for _, id := range lost {
		c := s.clients[id]
		s.dropPromises(c)
		for _, d := range c.delegs {
			s.dropDeleg(d)
		}
		msgs = append(msgs, Msg{Kind: MsgReset, Client: id})
	}
	return append(msgs, s.revokeExpired(now)...)
}

// NextDeadline is the earliest time at which Tick would act; zero if none.
func (s *Server) NextDeadline() time.Time {
	var next time.Time
	if s.expiry.Len() > 0 {
		next = s.expiry[0].expiry
	}
	for _, c := range s.clients {
		if len(c.pending) > 0 {
			d := c.pending[0].sent.Add(s.cfg.BreakTimeout)
			if next.IsZero() || d.Before(next) {
				next = d
			}
		}
	}
	if d := s.delegDeadline(); !d.IsZero() && (next.IsZero() || d.Before(next)) {
		next = d
	}
	return next
}

// Promises is the number of promises held across all clients.
func (s *Server) Promises() int { return s.expiry.Len() }

// Holders lists the clients holding a promise on fid, in order.
func (s *Server) Holders(fid node.FID) []ClientID {
	var ids []ClientID
	for id := range s.byFID[fid] {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}
