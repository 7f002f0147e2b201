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

// maxFates bounds the states whose fate is remembered; the first
// remembered are forgotten first.
const maxFates = 1024

// fate is what became of a delegation state: recalled, or over (revoked
// or returned), which a later grant of that state must honour.
type fate uint8

const (
	fateRecalled fate = iota + 1
	fateOver
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
// ticket t, replacing one of another state on the same file (an upgrade),
// and reports whether it did. It is refused if a reset or an epoch change
// arrived since the request began, or the state is over (revoked or
// returned); a repeat grant of the state held changes nothing. A state
// recalled before the grant is installed recalled. A grant refused for a
// reset or epoch change (Voided) is over at once: the caller returns it,
// and the server may grant the same state again before it hears so (an
// open asking for a delegation on a file it just created across a
// restart), which must not be taken as held.
func (c *Client) Delegated(t Ticket, fid node.FID, kind DelegKind, state uint64, epoch uint64) (Held, bool) {
	if kind == DelegNone || epoch != c.epoch {
		return Held{}, false
	}
	if c.Voided(t) {
		c.remember(state, fateOver)
		return Held{}, false
	}
	f := c.fates[state]
	if f == fateOver {
		return Held{}, false
	}
	if h := c.delegs[fid]; h != nil && h.State == state {
		return Held{}, false
	}
	h := &Held{FID: fid, Kind: kind, State: state, Recalled: f == fateRecalled}
	c.setDeleg(h)
	return *h, true
}

// setDeleg installs h, replacing what was held on its file, and keeps the
// counts by kind.
func (c *Client) setDeleg(h *Held) {
	c.dropDeleg(h.FID)
	c.delegs[h.FID] = h
	c.held[h.Kind]++
}

// dropDeleg forgets the delegation held on fid, if any.
func (c *Client) dropDeleg(fid node.FID) {
	if old := c.delegs[fid]; old != nil {
		c.held[old.Kind]--
		delete(c.delegs, fid)
	}
}

// Voided reports whether a grant in the reply to the request of ticket t
// is refused for the reset or epoch change that came since t (Delegated):
// such a grant is still held for this client at the server, which
// Delegated's other refusals are not.
func (c *Client) Voided(t Ticket) bool {
	return t.epoch != c.epoch || c.resetAt > t.at
}

// Recall marks the delegation state on fid recalled and returns it; a
// recall of a state not held yet is remembered for its grant.
func (c *Client) Recall(fid node.FID, state uint64) (Held, bool) {
	c.remember(state, fateRecalled)
	h := c.delegs[fid]
	if h == nil || h.State != state {
		return Held{}, false
	}
	h.Recalled = true
	return *h, true
}

// Revoke drops the delegation state on fid and reports whether it was
// held: dirty data under it can no longer be stored.
func (c *Client) Revoke(fid node.FID, state uint64) bool {
	c.remember(state, fateOver)
	h := c.delegs[fid]
	if h == nil || h.State != state {
		return false
	}
	c.dropDeleg(fid)
	return true
}

func (c *Client) remember(state uint64, f fate) {
	switch c.fates[state] {
	case fateOver:
		return
	case 0:
		c.fateOrder = append(c.fateOrder, state)
	}
	c.fates[state] = f
	for len(c.fates) > maxFates {
		delete(c.fates, c.fateOrder[0])
		c.fateOrder = c.fateOrder[1:]
	}
}

// Returned drops the delegation state on fid once the return was answered
// (taken back, or refused as no longer held): the state is over.
func (c *Client) Returned(fid node.FID, state uint64) {
	c.remember(state, fateOver)
	if h := c.delegs[fid]; h != nil && h.State == state {
		c.dropDeleg(fid)
	}
}

// FileGone forgets the delegation on a file that was removed: the server
// forgot it too (Server.FileGone).
func (c *Client) FileGone(fid node.FID) { c.dropDeleg(fid) }

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
	clear(c.held)
	clear(c.fates)
	c.fateOrder = nil
	return out
}

// Delegations is the number of delegations held, by kind.
func (c *Client) Delegations() (read, write int) {
	return c.held[DelegRead], c.held[DelegWrite]
}
