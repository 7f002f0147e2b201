package callback

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

func leased(epoch uint64) *Client {
	c := newClient(epoch)
	c.SetLease(10 * time.Second)
	return c
}

func delegate(t *testing.T, c *Client, f node.FID, kind DelegKind, state uint64) Held {
	t.Helper()
	tk := c.Begin(t0)
	defer c.End(tk)
	h, ok := c.Delegated(tk, f, kind, state, c.Epoch())
	if !ok {
		t.Fatalf("delegation %d on %v refused", state, f)
	}
	return h
}

// A delegation is good until the lease, counted from the sending time of
// the last answered request, runs out.
func TestClientDelegationLease(t *testing.T) {
	c := leased(1)
	c.Answered(t0)
	h := delegate(t, c, fid(1), DelegWrite, 7)
	if h != (Held{FID: fid(1), Kind: DelegWrite, State: 7}) {
		t.Fatalf("held %+v", h)
	}
	if got, ok := c.Delegation(fid(1), t0.Add(10*time.Second-1)); !ok || got != h {
		t.Fatalf("within the lease: %+v %v", got, ok)
	}
	if _, ok := c.Delegation(fid(1), t0.Add(10*time.Second)); ok {
		t.Fatal("delegation used past the lease")
	}
	c.Answered(t0.Add(5 * time.Second))
	c.Answered(t0.Add(2 * time.Second)) // a slow reply never shortens it
	if !c.LeaseEnd().Equal(t0.Add(15 * time.Second)) {
		t.Fatalf("lease end %v", c.LeaseEnd())
	}
	if _, ok := c.Delegation(fid(1), t0.Add(14*time.Second)); !ok {
		t.Fatal("renewed lease not honoured")
	}
	if r, w := c.Delegations(); r != 0 || w != 1 {
		t.Fatalf("counts %d %d", r, w)
	}
}

func TestClientRecallAndReturn(t *testing.T) {
	c := leased(1)
	c.Answered(t0)
	delegate(t, c, fid(1), DelegRead, 3)
	if _, ok := c.Recall(fid(1), 4); ok {
		t.Fatal("recall of another state applied")
	}
	h, ok := c.Recall(fid(1), 3)
	if !ok || !h.Recalled {
		t.Fatalf("recall: %+v %v", h, ok)
	}
	// Still usable until returned: its flush goes out under it.
	if got, ok := c.Delegation(fid(1), t0); !ok || !got.Recalled {
		t.Fatal("recalled delegation gone before the return")
	}
	c.Returned(fid(1), 2) // a stale return changes nothing
	if _, ok := c.Delegation(fid(1), t0); !ok {
		t.Fatal("stale return dropped the delegation")
	}
	c.Returned(fid(1), 3)
	if _, ok := c.Delegation(fid(1), t0); ok {
		t.Fatal("returned delegation still held")
	}
}

// A recall or revocation that overtakes the grant it names applies when
// the grant arrives.
func TestClientEarlyRecallAndRevoke(t *testing.T) {
	c := leased(1)
	c.Answered(t0)
	c.Recall(fid(1), 5)
	if h := delegate(t, c, fid(1), DelegWrite, 5); !h.Recalled {
		t.Fatal("early recall not applied")
	}
	if c.Revoke(fid(2), 6) {
		t.Fatal("revocation of an unknown state reported held")
	}
	tk := c.Begin(t0)
	if _, ok := c.Delegated(tk, fid(2), DelegRead, 6, 1); ok {
		t.Fatal("grant installed after its revocation")
	}
	c.End(tk)
	// A later recall does not undo a remembered revocation.
	c.Revoke(fid(3), 8)
	c.Recall(fid(3), 8)
	tk = c.Begin(t0)
	if _, ok := c.Delegated(tk, fid(3), DelegRead, 8, 1); ok {
		t.Fatal("grant installed after revoke+recall")
	}
	c.End(tk)
	if !c.Revoke(fid(1), 5) {
		t.Fatal("held delegation not revoked")
	}
	if _, ok := c.Delegation(fid(1), t0); ok {
		t.Fatal("revoked delegation still held")
	}
}

// Grants in flight across a reset or an epoch change are void.
func TestClientDelegationGrantRace(t *testing.T) {
	c := leased(1)
	c.Answered(t0)
	tk := c.Begin(t0)
	if c.Voided(tk) {
		t.Fatal("a ticket voided with nothing in between")
	}
	c.Reset()
	if _, ok := c.Delegated(tk, fid(1), DelegWrite, 1, 1); ok || !c.Voided(tk) {
		t.Fatal("grant from before a reset installed, or not said voided")
	}
	c.End(tk)
	// The server may grant the voided state again before it hears of
	// its return: that grant is refused, and not voided (no second
	// return).
	tk = c.Begin(t0)
	if _, ok := c.Delegated(tk, fid(1), DelegWrite, 1, 1); ok || c.Voided(tk) {
		t.Fatalf("a voided state installed when granted again (%v), or the new grant said voided", ok)
	}
	c.End(tk)
	tk = c.Begin(t0)
	c.SetEpoch(2)
	if _, ok := c.Delegated(tk, fid(1), DelegWrite, 1, 2); ok || !c.Voided(tk) {
		t.Fatal("grant from before an epoch change installed, or not said voided")
	}
	c.End(tk)
	tk = c.Begin(t0)
	if _, ok := c.Delegated(tk, fid(1), DelegWrite, 1, 1); ok {
		t.Fatal("grant of an old epoch installed")
	}
	if _, ok := c.Delegated(tk, fid(1), DelegNone, 0, 2); ok {
		t.Fatal("no delegation installed as one")
	}
	c.End(tk)
	// A state that is over is refused, but not voided: the server no
	// longer holds it for this client.
	c.Returned(fid(2), 1<<32|9)
	tk = c.Begin(t0)
	if _, ok := c.Delegated(tk, fid(2), DelegWrite, 1<<32|9, 2); ok || c.Voided(tk) {
		t.Fatalf("a returned state installed (%v) or said voided", ok)
	}
	c.End(tk)
}

func TestClientUpgradeAndDrop(t *testing.T) {
	c := leased(1)
	c.Answered(t0)
	delegate(t, c, fid(2), DelegRead, 1)
	delegate(t, c, fid(1), DelegRead, 2)
	delegate(t, c, fid(1), DelegWrite, 3) // upgrade: a new state
	if r, w := c.Delegations(); r != 1 || w != 1 {
		t.Fatalf("%d read and %d write delegations held after the upgrade, want 1 and 1", r, w)
	}
	if _, ok := c.Recall(fid(1), 2); ok {
		t.Fatal("recall of the replaced state applied")
	}
	got := c.DropDelegations()
	want := []Held{{FID: fid(1), Kind: DelegWrite, State: 3}, {FID: fid(2), Kind: DelegRead, State: 1}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("dropped %+v, want %+v", got, want)
	}
	if r, w := c.Delegations(); r+w != 0 {
		t.Fatal("delegations left after the drop")
	}
}

// The oldest fates go first, whatever the states' values (unguessable
// states are random).
func TestClientFatesBounded(t *testing.T) {
	c := leased(1)
	states := rand.New(rand.NewPCG(1, 2)).Perm(maxFates + 10)
	for _, s := range states {
		c.Recall(fid(1), uint64(s)+1)
	}
	if len(c.fates) != maxFates || len(c.fateOrder) != maxFates {
		t.Fatalf("%d fates kept (%d in order), bound %d", len(c.fates), len(c.fateOrder), maxFates)
	}
	for i, s := range states {
		if _, kept := c.fates[uint64(s)+1]; kept != (i >= 10) {
			t.Fatalf("state remembered %d-th kept: %v", i, kept)
		}
	}
}

// An open racing a recall and return may be answered with the client's
// own delegation: the reply neither clears the recall nor revives the
// state once returned.
func TestClientRegrantAfterRecall(t *testing.T) {
	c := leased(1)
	c.Answered(t0)
	delegate(t, c, fid(1), DelegWrite, 4)
	tk := c.Begin(t0)
	c.Recall(fid(1), 4)
	if _, ok := c.Delegated(tk, fid(1), DelegWrite, 4, 1); ok {
		t.Fatal("a repeat grant reported as new")
	}
	if h, ok := c.Delegation(fid(1), t0); !ok || !h.Recalled {
		t.Fatalf("repeat grant cleared the recall: %+v %v", h, ok)
	}
	c.Returned(fid(1), 4)
	if _, ok := c.Delegated(tk, fid(1), DelegWrite, 4, 1); ok {
		t.Fatal("a returned state was installed again")
	}
	c.End(tk)
	if _, ok := c.Delegation(fid(1), t0); ok {
		t.Fatal("returned delegation held")
	}
	// A recall that reached the client before the grant of the same
	// state (held already once, then dropped with the lease) still counts.
	delegate(t, c, fid(2), DelegRead, 5)
	c.Recall(fid(2), 5)
	c.FileGone(fid(2))
	if h := delegate(t, c, fid(2), DelegRead, 5); !h.Recalled {
		t.Fatal("a recalled state came back unrecalled")
	}
}
