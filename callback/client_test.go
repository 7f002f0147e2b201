package callback

import (
	"math/rand"
	"reflect"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

func newClient(epoch uint64) *Client {
	c := NewClient()
	c.SetEpoch(epoch)
	return c
}

func TestClientGrantAndExpiry(t *testing.T) {
	c := newClient(5)
	tk := c.Begin(t0)
	if !c.Granted(tk, fid(1), time.Minute, 5) {
		t.Fatal("grant refused")
	}
	c.End(tk)
	// Expiry counts from the ticket's start, not from when the reply came.
	if exp, ok := c.Expiry(fid(1)); !ok || !exp.Equal(t0.Add(time.Minute)) {
		t.Fatalf("expiry %v", exp)
	}
	if !c.Valid(fid(1), t0.Add(time.Minute-1)) || c.Valid(fid(1), t0.Add(time.Minute)) {
		t.Fatal("Valid disagrees with the expiry")
	}
	if c.Granted(c.Begin(t0), fid(2), 0, 5) {
		t.Fatal("a zero ttl installed a promise")
	}
	if got := c.Tick(t0.Add(time.Minute - 1)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	if got := c.Tick(t0.Add(time.Minute)); !reflect.DeepEqual(got, []node.FID{fid(1)}) || c.Len() != 0 {
		t.Fatalf("tick: %v", got)
	}
}

func TestClientTickOrder(t *testing.T) {
	c := newClient(1)
	for i, d := range []time.Duration{30, 10, 20, 10} {
		tk := c.Begin(t0)
		c.Granted(tk, fid(uint64(i+1)), d*time.Second, 1)
		c.End(tk)
	}
	got := c.Tick(t0.Add(time.Hour))
	want := []node.FID{fid(2), fid(4), fid(3), fid(1)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestClientRegrantExtendsNeverShortens(t *testing.T) {
	c := newClient(1)
	tk := c.Begin(t0)
	c.Granted(tk, fid(1), time.Minute, 1)
	tk2 := c.Begin(t0.Add(time.Second))
	c.Granted(tk2, fid(1), time.Second, 1)
	if exp, _ := c.Expiry(fid(1)); !exp.Equal(t0.Add(time.Minute)) {
		t.Fatalf("a shorter re-grant shortened the promise: %v", exp)
	}
}

func TestClientTicketRace(t *testing.T) {
	c := newClient(1)
	// Break before Begin: the reply is newer than the break, install.
	c.Break(fid(1))
	tk := c.Begin(t0)
	if !c.Granted(tk, fid(1), time.Minute, 1) {
		t.Fatal("promise refused for a break that came before the request")
	}
	c.End(tk)
	// Break between Begin and Granted: the reply may predate it, refuse.
	tk = c.Begin(t0)
	if !c.Break(fid(1)) {
		t.Fatal("Break did not report the held promise")
	}
	if c.Granted(tk, fid(1), time.Minute, 1) {
		t.Fatal("promise installed over a break that arrived during the RPC")
	}
	if !c.Granted(tk, fid(2), time.Minute, 1) {
		t.Fatal("an unrelated FID was refused")
	}
	c.End(tk)
	if c.Break(fid(9)) {
		t.Fatal("Break reported a promise never held")
	}
}

// Intact says what Granted would of a reply, without a promise: a break
// of the FID, a reset or a new epoch since Begin voids it.
func TestClientIntact(t *testing.T) {
	c := newClient(1)
	c.Break(fid(1))
	tk := c.Begin(t0)
	if !c.Intact(tk, fid(1)) {
		t.Fatal("a break before the request voided its reply")
	}
	c.Break(fid(1))
	if c.Intact(tk, fid(1)) || !c.Intact(tk, fid(2)) {
		t.Fatalf("after a break of fid 1: intact %v and %v, want false and true", c.Intact(tk, fid(1)), c.Intact(tk, fid(2)))
	}
	c.End(tk)
	tk = c.Begin(t0)
	c.Reset()
	if c.Intact(tk, fid(2)) {
		t.Fatal("a reply from before a reset is intact")
	}
	c.End(tk)
	tk = c.Begin(t0)
	c.SetEpoch(2)
	if c.Intact(tk, fid(2)) {
		t.Fatal("a reply from another epoch is intact")
	}
	c.End(tk)
}

func TestClientResetDuringTicket(t *testing.T) {
	c := newClient(1)
	tk0 := c.Begin(t0)
	c.Granted(tk0, fid(1), time.Minute, 1)
	c.Granted(tk0, fid(2), time.Minute, 1)
	c.End(tk0)
	tk := c.Begin(t0)
	if got := c.Reset(); !reflect.DeepEqual(got, []node.FID{fid(1), fid(2)}) || c.Len() != 0 {
		t.Fatalf("reset returned %v", got)
	}
	if c.Granted(tk, fid(3), time.Minute, 1) {
		t.Fatal("promise installed from before a reset")
	}
	c.End(tk)
	if tk := c.Begin(t0); !c.Granted(tk, fid(3), time.Minute, 1) {
		t.Fatal("promise refused after the reset")
	}
}

func TestClientEpoch(t *testing.T) {
	c := NewClient()
	if changed, dropped := c.SetEpoch(3); changed || dropped != nil || c.Epoch() != 3 {
		t.Fatal("first epoch must only be recorded")
	}
	tk := c.Begin(t0)
	c.Granted(tk, fid(1), time.Minute, 3)
	if c.Granted(tk, fid(2), time.Minute, 4) {
		t.Fatal("grant from another epoch accepted")
	}
	c.End(tk)
	if changed, _ := c.SetEpoch(3); changed {
		t.Fatal("same epoch reported as a change")
	}
	old := c.Begin(t0)
	changed, dropped := c.SetEpoch(4)
	if !changed || !reflect.DeepEqual(dropped, []node.FID{fid(1)}) || c.Len() != 0 {
		t.Fatalf("epoch change: %v %v", changed, dropped)
	}
	if c.Granted(old, fid(5), time.Minute, 4) {
		t.Fatal("a ticket from before the epoch change installed a promise")
	}
	if tk := c.Begin(t0); !c.Granted(tk, fid(5), time.Minute, 4) {
		t.Fatal("grant in the new epoch refused")
	}
}

func TestClientBreakLogPruned(t *testing.T) {
	c := newClient(1)
	for i := uint64(0); i < 100; i++ {
		c.Break(fid(i)) // no tickets: nothing to remember
	}
	if len(c.broken) != 0 {
		t.Fatalf("%d break records kept with no ticket outstanding", len(c.broken))
	}
	a := c.Begin(t0)
	c.Break(fid(1))
	b := c.Begin(t0)
	c.Break(fid(2))
	if len(c.broken) != 2 {
		t.Fatalf("%d records", len(c.broken))
	}
	c.End(a) // b still needs the break at clock > b.at, i.e. fid(2)'s
	if _, ok := c.broken[fid(1)]; ok || len(c.broken) != 1 {
		t.Fatalf("after ending the oldest ticket: %v", c.broken)
	}
	if c.Granted(b, fid(2), time.Minute, 1) {
		t.Fatal("pruning lost a break a ticket still needs")
	}
	c.End(b)
	if len(c.broken) != 0 || len(c.log) != 0 {
		t.Fatalf("records left after all tickets ended: %d %d", len(c.broken), len(c.log))
	}
}

// TestClientRandomAgainstModel: no promise is ever installed over a break
// that arrived while its ticket was out, and Tick returns exactly the
// expired promises.
func TestClientRandomAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	c := newClient(1)
	type ticket struct {
		tk     Ticket
		broken map[node.FID]bool
		reset  bool
	}
	var open []*ticket
	model := map[node.FID]time.Time{}
	now := t0
	for step := 0; step < 20000; step++ {
		now = now.Add(time.Duration(rng.Intn(500)) * time.Millisecond)
		f := fid(uint64(rng.Intn(10)))
		switch rng.Intn(6) {
		case 0:
			open = append(open, &ticket{tk: c.Begin(now), broken: map[node.FID]bool{}})
		case 1:
			if len(open) > 0 {
				i := rng.Intn(len(open))
				tk := open[i]
				ttl := time.Duration(1+rng.Intn(60)) * time.Second
				got := c.Granted(tk.tk, f, ttl, 1)
				want := !tk.reset && !tk.broken[f]
				if got != want {
					t.Fatalf("step %d: Granted=%v, model says %v", step, got, want)
				}
				if got {
					if exp := tk.tk.start.Add(ttl); exp.After(model[f]) {
						model[f] = exp
					}
				}
				if rng.Intn(2) == 0 {
					c.End(tk.tk)
					open = append(open[:i], open[i+1:]...)
				}
			}
		case 2:
			c.Break(f)
			delete(model, f)
			for _, tk := range open {
				tk.broken[f] = true
			}
		case 3:
			if rng.Intn(20) == 0 {
				c.Reset()
				model = map[node.FID]time.Time{}
				for _, tk := range open {
					tk.reset = true
				}
			}
		default:
			got := map[node.FID]bool{}
			for _, e := range c.Tick(now) {
				got[e] = true
			}
			for f, exp := range model {
				if !exp.After(now) {
					if !got[f] {
						t.Fatalf("step %d: %v expired but Tick did not return it", step, f)
					}
					delete(model, f)
					delete(got, f)
				}
			}
			if len(got) != 0 {
				t.Fatalf("step %d: Tick returned unexpired %v", step, got)
			}
		}
		if c.Len() != len(model) {
			t.Fatalf("step %d: %d promises, model %d", step, c.Len(), len(model))
		}
	}
}
