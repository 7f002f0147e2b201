package callback

import (
	"container/heap"
	"sort"
	"time"

	"github.com/hoardfs/hoard/node"
)

// Client is a cache manager's promise table. Promises are kept ordered by
// expiry and examined by Tick (the caller runs it once a second, as
// Stolarchuk's Faster AFS §3.1.1 does), so the read path never compares
// clocks.
//
// It also closes the grant race: a reply granting a promise can arrive
// after a break for the same FID that the server sent later, on another
// stream. Begin takes a ticket before the request; Granted refuses the
// promise if a break, reset or epoch change arrived since.
type Client struct {
	epoch    uint64
	epochSet bool
	promises map[node.FID]*promise
	expiry   promiseHeap

	// clock counts breaks, resets and epoch changes.
	clock   uint64
	resetAt uint64
	broken  map[node.FID]uint64 // clock of each FID's latest break
	log     []breakRecord       // breaks in clock order, for pruning
	tickets map[uint64]int      // outstanding tickets by clock
	oldest  uint64              // lower bound on outstanding tickets' clocks

	// Delegations (clientdeleg.go).
	delegs map[node.FID]*Held
	held   map[DelegKind]int // delegs by kind
	// fates, and the order states came in, oldest first (remember).
	fates     map[uint64]fate
	fateOrder []uint64
	lease     time.Duration
	leaseEnd  time.Time
}

// Ticket brackets one RPC that may grant promises.
type Ticket struct {
	at    uint64
	start time.Time
	epoch uint64
}

// NewClient returns an empty promise table.
func NewClient() *Client {
	return &Client{promises: map[node.FID]*promise{}, broken: map[node.FID]uint64{}, tickets: map[uint64]int{},
		delegs: map[node.FID]*Held{}, held: map[DelegKind]int{}, fates: map[uint64]fate{}}
}

// Begin is called just before sending an RPC whose reply may grant promises.
func (c *Client) Begin(now time.Time) Ticket {
	if len(c.tickets) == 0 {
		c.oldest = c.clock
	}
	c.tickets[c.clock]++
	return Ticket{at: c.clock, start: now, epoch: c.epoch}
}

// Granted installs a promise on fid expiring at the ticket's start plus
// ttl (conservative: the server granted it later than that), unless since
// Begin a break for fid, a reset or an epoch change arrived, or epoch is
// not the current one. It reports whether the promise was installed.
func (c *Client) Granted(t Ticket, fid node.FID, ttl time.Duration, epoch uint64) bool {
	if ttl <= 0 || epoch != c.epoch || t.epoch != c.epoch || c.resetAt > t.at || c.broken[fid] > t.at {
		return false
	}
	expiry := t.start.Add(ttl)
	if p := c.promises[fid]; p != nil {
		if expiry.After(p.expiry) {
			p.expiry = expiry
			heap.Fix(&c.expiry, p.index)
		}
		return true
	}
	p := &promise{promiseKey: promiseKey{fid: fid}, expiry: expiry}
	c.promises[fid] = p
	heap.Push(&c.expiry, p)
	return true
}

// Intact reports whether what a reply to ticket t says of fid still
// stands: no break of fid, reset or epoch change arrived since Begin. (A
// client keeps what else the reply told, its user's rights, only then.)
func (c *Client) Intact(t Ticket, fid node.FID) bool {
	return t.epoch == c.epoch && c.resetAt <= t.at && c.broken[fid] <= t.at
}

// End marks the ticket's RPC finished, so break records no outstanding
// ticket can need any more are pruned.
func (c *Client) End(t Ticket) {
	if c.tickets[t.at]--; c.tickets[t.at] <= 0 {
		delete(c.tickets, t.at)
	}
	if len(c.tickets) == 0 {
		c.oldest = c.clock
	} else {
		for c.tickets[c.oldest] == 0 {
			c.oldest++
		}
	}
	// A ticket taken at clock k is only affected by breaks at clock > k.
	i := 0
	for ; i < len(c.log) && c.log[i].seq <= c.oldest; i++ {
		if c.broken[c.log[i].fid] == c.log[i].seq {
			delete(c.broken, c.log[i].fid)
		}
	}
	c.log = c.log[i:]
}

func (c *Client) drop(fid node.FID) bool {
	p := c.promises[fid]
	if p == nil {
		return false
	}
	heap.Remove(&c.expiry, p.index)
	delete(c.promises, fid)
	return true
}

// Break drops fid's promise and remembers the break for outstanding
// tickets. It reports whether a promise was held.
func (c *Client) Break(fid node.FID) bool {
	c.clock++
	if len(c.tickets) > 0 {
		c.broken[fid] = c.clock
		c.log = append(c.log, breakRecord{fid, c.clock})
	}
	return c.drop(fid)
}

// Reset drops every promise (the server said so, or the back channel was
// lost and breaks may have been missed) and returns them in FID order.
// Delegation grants in flight are void from now on; the caller drops the
// delegations held with DropDelegations, after saving their dirty data.
func (c *Client) Reset() []node.FID {
	c.clock++
	c.resetAt = c.clock
	fids := make([]node.FID, 0, len(c.promises))
	for f := range c.promises {
		fids = append(fids, f)
	}
	sort.Slice(fids, func(i, j int) bool { return fidLess(fids[i], fids[j]) })
	c.promises = map[node.FID]*promise{}
	c.expiry = nil
	return fids
}

// SetEpoch records the server epoch from a handshake. The first call only
// records it; a change drops every promise and returns them, for the
// caller to revalidate.
func (c *Client) SetEpoch(e uint64) (changed bool, dropped []node.FID) {
	if !c.epochSet {
		c.epoch, c.epochSet = e, true
		return false, nil
	}
	if e == c.epoch {
		return false, nil
	}
	c.epoch = e
	return true, c.Reset()
}

// Epoch is the last server epoch recorded.
func (c *Client) Epoch() uint64 { return c.epoch }

// Tick pops and returns the promises expired at now, in expiry order.
func (c *Client) Tick(now time.Time) []node.FID {
	var out []node.FID
	for c.expiry.Len() > 0 && !c.expiry[0].expiry.After(now) {
		p := heap.Pop(&c.expiry).(*promise)
		delete(c.promises, p.fid)
		out = append(out, p.fid)
	}
	return out
}

// Valid reports whether a promise on fid is held and unexpired at now.
func (c *Client) Valid(fid node.FID, now time.Time) bool {
	p := c.promises[fid]
	return p != nil && p.expiry.After(now)
}

// Expiry returns when fid's promise expires.
func (c *Client) Expiry(fid node.FID) (time.Time, bool) {
	p := c.promises[fid]
	if p == nil {
		return time.Time{}, false
	}
	return p.expiry, true
}

// Len is the number of promises held.
func (c *Client) Len() int { return len(c.promises) }
