package callback

import (
	"sort"
	"time"

	"github.com/hoardfs/hoard/node"
)

// The client's side of delegations. A delegation is good while the lease
// is: until Lease after the sending time of the last request the server
// answered (the server renewed the lease when the request arrived, which
// was later). A recall or revocation can overtake the open reply granting
// the delegation it names (they travel on different streams), so those
// naming states not yet granted are remembered and applied when the grant
// arrives.

// Held is a delegation the client holds.
type Held struct {
	FID   node.FID
	Kind  DelegKind
	State uint64
	// Recalled: the holder must store its dirty data and return it; it
	// may still serve reads and take writes meanwhile, which the store
	// that precedes the return carries.
	Recalled bool
}

// maxEarly bounds the recalls and revocations remembered for states not
// yet granted (a grant whose reply was lost would otherwise leave its
// entry for ever); the lowest states are forgotten first.
const maxEarly = 1024

type earlyKind uint8

const (
	earlyRecall earlyKind = iota + 1
	earlyRevoke
)

// SetLease sets the delegation lease the server announced.
func (c *Client) SetLease(d time.Duration) { c.lease = d }

// Answered records that a request sent at sent was answered: the lease
// runs until sent plus the lease time.
func (c *Client) Answered(sent time.Time) {
	if end := sent.Add(c.lease); end.After(c.leaseEnd) {
		c.leaseEnd = end
	}
}

// LeaseEnd is when the lease runs out unless renewed.
func (c *Client) LeaseEnd() time.Time { return c.leaseEnd }

// Delegated installs a delegation granted by the reply to the request of
// ticket t, replacing one of another state on the same file (an upgrade).
// It is refused (false) if a reset or an epoch change arrived since the
// request began, or a revocation overtook the grant; a recall that did
// marks it recalled at once.
func (c *Client) Delegated(t Ticket, fid node.FID, kind DelegKind, state uint64, epoch uint64) (Held, bool) {
	if kind == DelegNone || epoch != c.epoch || t.epoch != c.epoch || c.resetAt > t.at {
		return Held{}, false
	}
	e := c.early[state]
	delete(c.early, state)
	if e == earlyRevoke {
		return Held{}, false
	}
	h := &Held{FID: fid, Kind: kind, State: state, Recalled: e == earlyRecall}
	c.delegs[fid] = h
	return *h, true
}

// Recall marks the delegation state on fid recalled and returns it; a
// recall of a state not held yet is remembered for its grant.
func (c *Client) Recall(fid node.FID, state uint64) (Held, bool) {
	h := c.delegs[fid]
	if h == nil || h.State != state {
		c.remember(state, earlyRecall)
		return Held{}, false
	}
	h.Recalled = true
	return *h, true
}

// Revoke drops the delegation state on fid and reports whether it was
// held: dirty data under it can no longer be stored.
func (c *Client) Revoke(fid node.FID, state uint64) bool {
	h := c.delegs[fid]
	if h == nil || h.State != state {
		c.remember(state, earlyRevoke)
		return false
	}
	delete(c.delegs, fid)
	return true
}

func (c *Client) remember(state uint64, k earlyKind) {
	if c.early[state] == earlyRevoke {
		return
	}
	c.early[state] = k
	if len(c.early) > maxEarly {
		low := uint64(0)
		first := true
		for s := range c.early {
			if first || s < low {
				low, first = s, false
			}
		}
		delete(c.early, low)
	}
}

// Returned drops the delegation state on fid once the server took it back.
func (c *Client) Returned(fid node.FID, state uint64) {
	if h := c.delegs[fid]; h != nil && h.State == state {
		delete(c.delegs, fid)
	}
}

// FileGone forgets the delegation on a file that was removed: the server
// forgot it too (Server.FileGone).
func (c *Client) FileGone(fid node.FID) { delete(c.delegs, fid) }

// Delegation is the delegation held on fid, if the lease is good at now.
func (c *Client) Delegation(fid node.FID, now time.Time) (Held, bool) {
	h := c.delegs[fid]
	if h == nil || !c.leaseEnd.After(now) {
		return Held{}, false
	}
	return *h, true
}

// DropDelegations forgets every delegation (after a Reset or an epoch
// change, which also void grants still in flight, or when the lease ran
// out) and returns them in FID order, for the caller to store what it can
// of their dirty data: the server will refuse stores under them.
func (c *Client) DropDelegations() []Held {
	out := make([]Held, 0, len(c.delegs))
	for _, h := range c.delegs {
		out = append(out, *h)
	}
	sort.Slice(out, func(i, j int) bool { return fidLess(out[i].FID, out[j].FID) })
	c.delegs = map[node.FID]*Held{}
	clear(c.early)
	return out
}

// Delegations is the number of delegations held, by kind.
func (c *Client) Delegations() (read, write int) {
	for _, h := range c.delegs {
		if h.Kind == DelegWrite {
			write++
		} else {
			read++
		}
	}
	return read, write
}
