package callback

import (
	"math/rand"
	"reflect"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

func dcfg() Config { c := cfg(); c.Lease = 10 * time.Second; return c }

func open(t *testing.T, s *Server, id ClientID, f node.FID, write bool, now time.Time) OpenResult {
	t.Helper()
	res, msgs := s.Open(id, f, write, now)
	if res.Wait != 0 || msgs != nil {
		t.Fatalf("open of %v by %d had to wait: %+v %v", f, id, res, msgs)
	}
	return res
}

func TestReadDelegationsShared(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	ra := open(t, s, a, fid(1), false, t0)
	rb := open(t, s, b, fid(1), false, t0)
	if ra.Kind != DelegRead || rb.Kind != DelegRead || ra.State == rb.State || ra.Recorded || rb.Recorded {
		t.Fatalf("read opens: %+v %+v", ra, rb)
	}
	if !s.Valid(a, fid(1), ra.State) || s.Valid(a, fid(1), rb.State) || s.Delegations() != 2 {
		t.Fatal("validity of read delegations")
	}
	// Opening again under the delegation changes nothing.
	if again := open(t, s, a, fid(1), false, t0); again != ra {
		t.Fatalf("second open: %+v, want %+v", again, ra)
	}
}

// A read open meets a write delegation: it is recalled, the opener waits,
// the holder returns it with its own open still counted, and the reader
// then opens without a delegation (a writer has the file open).
func TestWriteDelegationRecalledByReader(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	wa := open(t, s, a, fid(1), true, t0)
	if wa.Kind != DelegWrite {
		t.Fatalf("lone writer: %+v", wa)
	}
	res, msgs := s.Open(b, fid(1), false, t0.Add(time.Second))
	want := []Msg{{Kind: MsgRecall, Client: a, FIDs: []node.FID{fid(1)}, States: []uint64{wa.State}}}
	if res.Wait == 0 || !reflect.DeepEqual(msgs, want) {
		t.Fatalf("open against a write delegation: %+v %+v", res, msgs)
	}
	// Asking again while the recall runs: the same wait, no second recall.
	res2, msgs2 := s.Open(b, fid(1), false, t0.Add(2*time.Second))
	if res2.Wait == 0 || msgs2 != nil || s.Done(res2.Wait) {
		t.Fatalf("second open during the recall: %+v %v", res2, msgs2)
	}
	// The holder's flush is still accepted until it returns.
	if !s.Valid(a, fid(1), wa.State) {
		t.Fatal("a recalled delegation must stay valid until returned")
	}
	if s.Return(a, fid(1), wa.State+1, 0, 1, t0) {
		t.Fatal("return with a wrong state accepted")
	}
	if !s.Return(a, fid(1), wa.State, 0, 1, t0.Add(3*time.Second)) {
		t.Fatal("return refused")
	}
	if !s.Done(res.Wait) || !s.Done(res2.Wait) || s.Valid(a, fid(1), wa.State) {
		t.Fatal("return did not complete the rounds")
	}
	rb := open(t, s, b, fid(1), false, t0.Add(3*time.Second))
	if rb.Kind != DelegNone || !rb.Recorded {
		t.Fatalf("reader beside an open writer got %+v", rb)
	}
	// The writer closes; the next reader may have a delegation again.
	s.Close(a, fid(1), true)
	s.Close(b, fid(1), false)
	if r := open(t, s, b, fid(1), false, t0.Add(4*time.Second)); r.Kind != DelegRead {
		t.Fatalf("after the closes: %+v", r)
	}
}

func TestWriteOpenRecallsReadDelegations(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b, c := s.Connect("", 0, t0), s.Connect("", 0, t0), s.Connect("", 0, t0)
	ra := open(t, s, a, fid(1), false, t0)
	rb := open(t, s, b, fid(1), false, t0)
	res, msgs := s.Open(c, fid(1), true, t0)
	if res.Wait == 0 || len(msgs) != 2 || msgs[0].Client != a || msgs[1].Client != b || msgs[0].Kind != MsgRecall {
		t.Fatalf("write open against two readers: %+v %+v", res, msgs)
	}
	s.Return(a, fid(1), ra.State, 0, 0, t0)
	if s.Done(res.Wait) {
		t.Fatal("round done with one of two returned")
	}
	s.Return(b, fid(1), rb.State, 0, 0, t0)
	if !s.Done(res.Wait) {
		t.Fatal("round not done")
	}
	if r := open(t, s, c, fid(1), true, t0); r.Kind != DelegWrite {
		t.Fatalf("writer after the readers returned: %+v", r)
	}
}

// While a recall runs no new delegation is granted on the file: readers
// arriving meanwhile cannot starve the waiting writer.
func TestNoGrantsDuringRecall(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b, c := s.Connect("", 0, t0), s.Connect("", 0, t0), s.Connect("", 0, t0)
	ra := open(t, s, a, fid(1), false, t0)
	res, _ := s.Open(b, fid(1), true, t0)
	rc := open(t, s, c, fid(1), false, t0) // read/read: no conflict, but no delegation
	if rc.Kind != DelegNone || !rc.Recorded {
		t.Fatalf("reader during a recall got %+v", rc)
	}
	s.Return(a, fid(1), ra.State, 0, 0, t0)
	if !s.Done(res.Wait) {
		t.Fatal("round not done")
	}
	// c has the file open for reading: b opens without a delegation.
	if r := open(t, s, b, fid(1), true, t0); r.Kind != DelegNone || !r.Recorded {
		t.Fatalf("writer beside an open reader: %+v", r)
	}
}

func TestUpgradeReadToWrite(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	ra := open(t, s, a, fid(1), false, t0)
	wa := open(t, s, a, fid(1), true, t0)
	if wa.Kind != DelegWrite || wa.State == ra.State || s.Valid(a, fid(1), ra.State) || !s.Valid(a, fid(1), wa.State) {
		t.Fatalf("upgrade: %+v from %+v", wa, ra)
	}
	// With another reader holding a delegation, the upgrade recalls it.
	rb := open(t, s, b, fid(2), false, t0)
	ra2 := open(t, s, a, fid(2), false, t0)
	res, msgs := s.Open(a, fid(2), true, t0)
	if res.Wait == 0 || len(msgs) != 1 || msgs[0].Client != b {
		t.Fatalf("upgrade beside another reader: %+v %+v", res, msgs)
	}
	s.Return(b, fid(2), rb.State, 0, 0, t0)
	if w := open(t, s, a, fid(2), true, t0); w.Kind != DelegWrite || s.Valid(a, fid(2), ra2.State) {
		t.Fatalf("upgrade after the recall: %+v", w)
	}
}

// An upgrade that cannot be had keeps the read delegation and records the
// write open.
func TestUpgradeRefusedBesideOpenReader(t *testing.T) {
	s := NewServer(1, cfg()) // no lease: b's open is recorded
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	open(t, s, b, fid(1), false, t0)
	s.cfg.Lease = 10 * time.Second
	ra := open(t, s, a, fid(1), false, t0)
	if ra.Kind != DelegRead {
		t.Fatalf("reader beside a reader: %+v", ra)
	}
	wa := open(t, s, a, fid(1), true, t0)
	if wa.Kind != DelegRead || wa.State != ra.State || !wa.Recorded {
		t.Fatalf("upgrade beside an open reader: %+v", wa)
	}
}

func TestLeaseExpiryRevokes(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	wa := open(t, s, a, fid(1), true, t0)
	open(t, s, a, fid(2), false, t0)
	// Renewed by a request at 5 s: alive until 15 s.
	s.Renew(a, t0.Add(5*time.Second))
	if msgs := s.Tick(t0.Add(14 * time.Second)); msgs != nil || s.Delegations() != 2 {
		t.Fatalf("revoked early: %v", msgs)
	}
	if !s.NextDeadline().Equal(t0.Add(15 * time.Second)) {
		t.Fatalf("next deadline %v", s.NextDeadline())
	}
	msgs := s.Tick(t0.Add(15 * time.Second))
	if len(msgs) != 1 || msgs[0].Kind != MsgRevoke || msgs[0].Client != a || len(msgs[0].FIDs) != 2 || msgs[0].States[0] != wa.State {
		t.Fatalf("revocation: %+v", msgs)
	}
	if s.Valid(a, fid(1), wa.State) || s.Delegations() != 0 {
		t.Fatal("revoked delegation still valid")
	}
	if s.Return(a, fid(1), wa.State, 0, 0, t0.Add(16*time.Second)) {
		t.Fatal("return of a revoked delegation accepted")
	}
	if r := open(t, s, b, fid(1), true, t0.Add(16*time.Second)); r.Kind != DelegWrite {
		t.Fatalf("after the revocation: %+v", r)
	}
}

// A holder that keeps talking but does not return a recalled delegation
// loses it Lease after the recall, and the waiter goes on.
func TestUnansweredRecallRevokes(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	wa := open(t, s, a, fid(1), true, t0)
	res, _ := s.Open(b, fid(1), false, t0.Add(time.Second))
	for i := 2; i <= 10; i++ {
		s.Renew(a, t0.Add(time.Duration(i)*time.Second))
		if msgs := s.Tick(t0.Add(time.Duration(i) * time.Second)); msgs != nil {
			t.Fatalf("revoked at %ds", i)
		}
	}
	msgs := s.Tick(t0.Add(11 * time.Second))
	if len(msgs) != 1 || msgs[0].Kind != MsgRevoke || !s.Done(res.Wait) || s.Valid(a, fid(1), wa.State) {
		t.Fatalf("unanswered recall: %+v done=%v", msgs, s.Done(res.Wait))
	}
}

func TestRecallForChange(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b, c := s.Connect("", 0, t0), s.Connect("", 0, t0), s.Connect("", 0, t0)
	ra := open(t, s, a, fid(1), false, t0)
	open(t, s, b, fid(1), false, t0)
	wc := open(t, s, c, fid(2), true, t0)
	// b changes both files: a's and c's delegations are recalled, not b's.
	r, msgs := s.Recall(b, []node.FID{fid(1), fid(2), fid(1)}, t0)
	if r == 0 || len(msgs) != 2 || msgs[0].Client != a || msgs[1].Client != c || msgs[1].States[0] != wc.State {
		t.Fatalf("recall for a change: %d %+v", r, msgs)
	}
	if !s.Return(a, fid(1), ra.State, 0, 0, t0) || s.Done(r) {
		t.Fatal("round done early")
	}
	s.Return(c, fid(2), wc.State, 0, 0, t0)
	if !s.Done(r) {
		t.Fatal("round not done")
	}
	if r, _ := s.Recall(0, []node.FID{fid(3)}, t0); r != 0 {
		t.Fatal("recall with no holders must not wait")
	}
}

func TestReclaim(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("a", 0, t0), s.Connect("b", 0, t0)
	wa := open(t, s, a, fid(1), true, t0)
	ra := open(t, s, a, fid(2), true, t0)
	rd := open(t, s, a, fid(4), false, t0)
	s.Disconnect(a, t0)
	if k, _ := s.Delegation(a, fid(4)); k != DelegNone {
		t.Fatal("a read delegation outlived its holder's session")
	}
	if _, _, ok := s.Reclaim(s.Connect("a", a, t0), fid(4), rd.State, t0); ok {
		t.Fatal("reclaimed a read delegation of a gone session")
	}
	res, msgs := s.Open(b, fid(2), true, t0.Add(time.Second))
	if res.Wait == 0 || len(msgs) != 1 || msgs[0].Client != a {
		t.Fatalf("recall of a gone holder's delegation: %+v %+v", res, msgs)
	}
	// Another client cannot take it, nor a state that was not a's.
	if k, _ := s.Delegation(a, fid(1)); k != DelegWrite {
		t.Fatal("a's write delegation did not outlive its session")
	}
	if _, _, ok := s.Reclaim(b, fid(1), wa.State, t0); ok {
		t.Fatal("b reclaimed a's delegation")
	}
	// A name is not an identity: a session calling itself "a" that does
	// not continue a's line cannot take its delegation either.
	if _, _, ok := s.Reclaim(s.Connect("a", 0, t0), fid(1), wa.State, t0); ok {
		t.Fatal("a session by the same name reclaimed a's delegation")
	}
	a2 := s.Connect("a", s.Line(a), t0.Add(2*time.Second))
	if _, _, ok := s.Reclaim(a2, fid(1), wa.State+100, t0); ok {
		t.Fatal("reclaimed a state never granted")
	}
	h, msgs, ok := s.Reclaim(a2, fid(1), wa.State, t0.Add(2*time.Second))
	if !ok || h.Kind != DelegWrite || h.State != wa.State || h.Recalled || msgs != nil || !s.Valid(a2, fid(1), wa.State) {
		t.Fatalf("reclaim: %+v %+v %v", h, msgs, ok)
	}
	// The recalled one comes back recalled, and the recall is sent again.
	h, msgs, ok = s.Reclaim(a2, fid(2), ra.State, t0.Add(2*time.Second))
	if !ok || !h.Recalled || len(msgs) != 1 || msgs[0].Kind != MsgRecall || msgs[0].Client != a2 {
		t.Fatalf("reclaim of a recalled delegation: %+v %+v %v", h, msgs, ok)
	}
	if s.clients[a] != nil {
		t.Fatal("the gone session outlived its last delegation")
	}
	s.Return(a2, fid(2), ra.State, 0, 0, t0.Add(2*time.Second))
	if !s.Done(res.Wait) {
		t.Fatal("the waiting open was not released by the return")
	}
	// After the lease, a gone session's delegations cannot be reclaimed.
	a3 := s.Connect("a3", 0, t0)
	w3 := open(t, s, a3, fid(3), true, t0)
	s.Disconnect(a3, t0)
	s.Tick(t0.Add(11 * time.Second))
	a4 := s.Connect("a3", a3, t0.Add(11*time.Second))
	if _, _, ok := s.Reclaim(a4, fid(3), w3.State, t0.Add(11*time.Second)); ok {
		t.Fatal("reclaimed a delegation revoked after the lease")
	}
}

func TestDisconnectAndResetDropDelegations(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("a", 0, t0), s.Connect("b", 0, t0)
	open(t, s, a, fid(1), true, t0)
	res, _ := s.Open(b, fid(1), false, t0)
	s.Disconnect(a, t0)
	if s.Done(res.Wait) || s.Delegations() != 1 {
		t.Fatal("a holder's delegation must outlive its session until the lease runs out")
	}
	if msgs := s.Tick(t0.Add(10 * time.Second)); len(msgs) != 0 {
		t.Fatalf("revocation sent to a client that is gone: %+v", msgs)
	}
	if !s.Done(res.Wait) || s.Delegations() != 0 || len(s.clients) != 1 {
		t.Fatal("the lease ran out and the delegation or client stayed")
	}
	if r := open(t, s, b, fid(1), true, t0); r.Kind != DelegWrite {
		t.Fatalf("after the holder left: %+v", r)
	}
	// A client lost over an unacknowledged break loses its delegations.
	c := s.Connect("", 0, t0)
	grant(t, s, c, fid(5), t0)
	open(t, s, c, fid(6), false, t0)
	s.Break(b, []node.FID{fid(5)}, t0)
	s.Renew(c, t0.Add(2*time.Second))
	msgs := s.Tick(t0.Add(2 * time.Second))
	if len(msgs) != 1 || msgs[0].Kind != MsgReset {
		t.Fatalf("lost client: %+v", msgs)
	}
	if k, _ := s.Delegation(c, fid(6)); k != DelegNone {
		t.Fatal("a reset client kept its delegation")
	}
}

func TestNoLeaseNoDelegations(t *testing.T) {
	s := NewServer(1, cfg())
	a := s.Connect("", 0, t0)
	if r := open(t, s, a, fid(1), true, t0); r.Kind != DelegNone || !r.Recorded {
		t.Fatalf("without a lease: %+v", r)
	}
	if r, _ := s.Open(99, fid(1), true, t0); r != (OpenResult{}) {
		t.Fatalf("unknown client: %+v", r)
	}
	if !s.NextDeadline().IsZero() {
		t.Fatal("deadline without promises or delegations")
	}
}

// Random opens, closes, returns, changes, renewals and ticks by several
// clients on a few files, checking after each step what delegations must
// guarantee: a write delegation excludes every other client's delegation
// and open; a read delegation excludes other writers; a round completes
// only when none of the delegations it waits for is still held.
func TestDelegationsRandom(t *testing.T) {
	for seed := int64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewSource(seed))
		s := NewServer(1, dcfg())
		now := t0
		var ids []ClientID
		for i := 0; i < 4; i++ {
			ids = append(ids, s.Connect("", 0, now))
		}
		type key struct {
			id  ClientID
			fid node.FID
		}
		// local[k]: the opens client k.id has on k.fid, as it knows them
		// (readers, writers), whether or not the server recorded them.
		local := map[key]*[2]int{}
		recorded := map[key]*[2]int{} // opens the server was told of
		waiting := map[Round][]*deleg{}
		for step := 0; step < 400; step++ {
			id := ids[rng.Intn(len(ids))]
			f := fid(uint64(1 + rng.Intn(3)))
			k := key{id, f}
			if local[k] == nil {
				local[k], recorded[k] = &[2]int{}, &[2]int{}
			}
			switch op := rng.Intn(10); {
			case op < 4:
				write := rng.Intn(2) == 0
				res, _ := s.Open(id, f, write, now)
				if res.Wait != 0 {
					var held []*deleg
					for _, d := range s.delegsByFID[f] {
						for _, r := range d.rounds {
							if r == res.Wait {
								held = append(held, d)
							}
						}
					}
					if len(held) == 0 {
						t.Fatalf("seed %d step %d: a wait for nothing", seed, step)
					}
					waiting[res.Wait] = held
					break
				}
				w := 0
				if write {
					w = 1
				}
				local[k][w]++
				if res.Recorded {
					recorded[k][w]++
				}
			case op < 6:
				w := rng.Intn(2)
				if recorded[k][w] > 0 {
					recorded[k][w]--
					local[k][w]--
					s.Close(id, f, w == 1)
				} else if local[k][w] > recorded[k][w] {
					local[k][w]-- // a local close under the delegation
				}
			case op < 7:
				if kind, state := s.Delegation(id, f); kind != DelegNone {
					if !s.Return(id, f, state, local[k][0], local[k][1], now) {
						t.Fatalf("seed %d: return refused", seed)
					}
					*recorded[k] = *local[k]
				}
			case op < 8:
				s.Recall(id, []node.FID{f}, now)
			case op < 9:
				s.Renew(id, now)
			default:
				now = now.Add(time.Duration(rng.Intn(4000)) * time.Millisecond)
				for _, m := range s.Tick(now) {
					switch m.Kind {
					case MsgRevoke:
						for _, rf := range m.FIDs {
							// The client learns its delegation is gone; its
							// unrecorded opens stay local knowledge only.
							rk := key{m.Client, rf}
							*local[rk] = *recorded[rk]
						}
					case MsgReset:
						for rk := range local {
							if rk.id == m.Client {
								*local[rk] = *recorded[rk]
							}
						}
					}
				}
			}
			for f, holders := range s.delegsByFID {
				for id, d := range holders {
					for other, o := range s.opensByFID[f] {
						if other != id && (d.kind == DelegWrite || o.writers > 0) {
							t.Fatalf("seed %d step %d: %s delegation of %d on %v beside opens %+v of %d", seed, step, d.kind, id, f, *o, other)
						}
					}
					for other, d2 := range holders {
						if other != id && (d.kind == DelegWrite || d2.kind == DelegWrite) {
							t.Fatalf("seed %d step %d: %s and %s delegations together on %v", seed, step, d.kind, d2.kind, f)
						}
					}
				}
			}
			for id, c := range s.clients {
				for f, d := range c.delegs {
					if under := c.recalled[f] == d; under != !d.recalled.IsZero() {
						t.Fatalf("seed %d step %d: client %d's delegation on %v recalled at %v, in the recalled set: %v", seed, step, id, f, d.recalled, under)
					}
				}
				if len(c.recalled) > len(c.delegs) {
					t.Fatalf("seed %d step %d: client %d has %d recalled of %d delegations", seed, step, id, len(c.recalled), len(c.delegs))
				}
			}
			for r, held := range waiting {
				if !s.Done(r) {
					continue
				}
				for _, d := range held {
					if s.Valid(d.client, d.fid, d.state) {
						t.Fatalf("seed %d step %d: round %d done with delegation %d of %d still held", seed, step, r, d.state, d.client)
					}
				}
				delete(waiting, r)
			}
		}
	}
}

// Reading a file for another client recalls only write delegations.
func TestRecallWriters(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b, c := s.Connect("", 0, t0), s.Connect("", 0, t0), s.Connect("", 0, t0)
	open(t, s, a, fid(1), false, t0)
	wb := open(t, s, b, fid(2), true, t0)
	if r, msgs := s.RecallWriters(c, []node.FID{fid(1)}, t0); r != 0 || msgs != nil {
		t.Fatalf("read delegation recalled for a reader: %d %v", r, msgs)
	}
	r, msgs := s.RecallWriters(c, []node.FID{fid(2)}, t0)
	if r == 0 || len(msgs) != 1 || msgs[0].Client != b || msgs[0].States[0] != wb.State {
		t.Fatalf("write delegation not recalled for a reader: %d %+v", r, msgs)
	}
	if r, _ := s.RecallWriters(b, []node.FID{fid(2)}, t0); r != 0 {
		t.Fatal("the holder's own read recalled its delegation")
	}
}

// A holder that leaves the recall of a read delegation (nothing to store)
// unanswered for the break timeout is lost, as for a break; the recall of
// a write delegation is given a lease.
func TestUnansweredRecalls(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b, c := s.Connect("a", 0, t0), s.Connect("b", 0, t0), s.Connect("c", 0, t0)
	open(t, s, a, fid(1), false, t0)
	open(t, s, c, fid(2), true, t0)
	r1, _ := s.Open(b, fid(1), true, t0)
	r2, _ := s.Open(b, fid(2), false, t0)
	if r1.Wait == 0 || r2.Wait == 0 {
		t.Fatal("conflicting opens did not wait")
	}
	if d := s.NextDeadline(); !d.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("next deadline %v, want the break timeout", d)
	}
	s.Renew(a, t0.Add(2*time.Second))
	s.Renew(c, t0.Add(2*time.Second))
	msgs := s.Tick(t0.Add(2 * time.Second))
	if len(msgs) != 1 || msgs[0].Kind != MsgReset || msgs[0].Client != a || !s.Done(r1.Wait) || s.Done(r2.Wait) {
		t.Fatalf("after the break timeout: %+v, rounds done %v %v", msgs, s.Done(r1.Wait), s.Done(r2.Wait))
	}
	s.Renew(c, t0.Add(10*time.Second))
	msgs = s.Tick(t0.Add(10 * time.Second))
	if len(msgs) != 1 || msgs[0].Kind != MsgRevoke || msgs[0].Client != c || !s.Done(r2.Wait) {
		t.Fatalf("after the lease: %+v", msgs)
	}
}

// A removed file's delegations and opens are forgotten, with the rounds
// waiting for them; a gone session goes with its last delegation.
func TestFileGone(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("a", 0, t0), s.Connect("b", 0, t0)
	open(t, s, a, fid(1), true, t0)
	res, _ := s.Open(b, fid(1), false, t0)
	s.Disconnect(a, t0)
	s.FileGone(fid(1))
	if !s.Done(res.Wait) || s.Delegations() != 0 || s.clients[a] != nil {
		t.Fatal("a removed file's delegation or its gone holder stayed")
	}
	if r, _ := s.Open(b, fid(1), false, t0); r.Kind != DelegRead {
		t.Fatalf("open after: %+v", r)
	}
	s.FileGone(fid(1))
	if s.Delegations() != 0 || len(s.opensByFID) != 0 {
		t.Fatal("delegation or opens left on a removed file")
	}
}

// A restarted server's delegation states are not those of its previous
// life: a client that remembers a state as returned would refuse the
// same state granted again (seen through a proxy: a write delegation the
// client never installed held up others' stores for a lease).
func TestStatesUniqueAcrossEpochs(t *testing.T) {
	before := map[uint64]bool{}
	s := NewServer(1, dcfg())
	a := s.Connect("", 0, t0)
	for i := range 100 {
		before[open(t, s, a, fid(uint64(i+1)), true, t0).State] = true
	}
	s = NewServer(2, dcfg())
	a = s.Connect("", 0, t0)
	for i := range 100 {
		if st := open(t, s, a, fid(uint64(i+1)), true, t0).State; before[st] {
			t.Fatalf("epoch 2 granted state %d, which epoch 1 granted too", st)
		}
	}
}

// A proxy delegates only what it holds: under a limit, a stronger
// delegation is not granted and the open is recorded instead, a weaker one
// still is.
func TestOpenWithLimit(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	if res, _ := s.OpenWith(a, fid(1), Opening{Write: true, Limit: DelegRead}, t0); res.Kind != DelegNone || !res.Recorded || res.Wait != 0 {
		t.Fatalf("write open under a read limit: %+v", res)
	}
	if res, _ := s.OpenWith(b, fid(2), Opening{Limit: DelegRead}, t0); res.Kind != DelegRead || res.Recorded {
		t.Fatalf("read open under a read limit: %+v", res)
	}
	if res, _ := s.OpenWith(b, fid(3), Opening{Limit: DelegNone}, t0); res.Kind != DelegNone || !res.Recorded {
		t.Fatalf("read open with no delegation to give: %+v", res)
	}
	if s.Delegations() != 1 {
		t.Fatalf("%d delegations, want 1", s.Delegations())
	}
	// The recorded write open still counts against others' delegations.
	if res, _ := s.OpenWith(b, fid(1), Opening{Limit: DelegWrite}, t0); res.Kind != DelegNone || !res.Recorded {
		t.Fatalf("read open of a file another client writes: %+v", res)
	}
}

func TestDelegable(t *testing.T) {
	s := NewServer(1, dcfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	if !s.Delegable(a, fid(1), true, t0) || s.Delegable(99, fid(1), false, t0) {
		t.Fatal("a lone opener should be delegable, an unknown client not")
	}
	open(t, s, a, fid(1), false, t0)
	if s.Delegable(a, fid(1), false, t0) || !s.Delegable(a, fid(1), true, t0) {
		t.Fatal("a read delegation covers a read open, not a write open (an upgrade)")
	}
	if !s.Delegable(b, fid(1), false, t0) || s.Delegable(b, fid(1), true, t0) {
		t.Fatal("another reader shares the read delegation; a writer must wait for its recall")
	}
	if nolease := NewServer(1, cfg()); nolease.Delegable(nolease.Connect("", 0, t0), fid(1), false, t0) {
		t.Fatal("no lease, no delegations")
	}
}

// A session that reclaims an earlier session's delegation on a file it
// holds one of its own on gets the reclaimed one in its place; the file's
// table of holders, emptied on the way, is made again (it was a panic).
func TestReclaimOverOwn(t *testing.T) {
	s := NewServer(1, dcfg())
	old := s.Connect("a", 0, t0)
	r1 := open(t, s, old, fid(1), false, t0)
	a2 := s.Connect("a", s.Line(old), t0)
	r2 := open(t, s, a2, fid(1), false, t0)
	if r1.Kind != DelegRead || r2.Kind != DelegRead {
		t.Fatalf("opens got %v and %v, want read delegations", r1.Kind, r2.Kind)
	}
	h, _, ok := s.Reclaim(a2, fid(1), r1.State, t0)
	if !ok || h.State != r1.State || !s.Valid(a2, fid(1), r1.State) || s.Valid(a2, fid(1), r2.State) {
		t.Fatalf("reclaim over its own: %+v %v", h, ok)
	}
	if s.Delegations() != 1 {
		t.Fatalf("%d delegations held, want the reclaimed one", s.Delegations())
	}
}

// A client that left a recall unanswered until it was revoked gets no new
// delegation for RecallBackoff, on any file (in that session: a name is
// not an identity, and another client may go by the same one):
// taking one again at once, it made the next waiter wait out a lease
// again, round after round. The waiter's next open does not wait.
func TestUnansweredRecallBacksOff(t *testing.T) {
	c := dcfg()
	c.RecallBackoff = time.Minute
	s := NewServer(1, c)
	a, b := s.Connect("a", 0, t0), s.Connect("b", 0, t0)
	open(t, s, a, fid(1), true, t0)
	res, _ := s.Open(b, fid(1), false, t0.Add(time.Second))
	if res.Wait == 0 {
		t.Fatal("no recall")
	}
	at := t0.Add(11 * time.Second)
	s.Renew(a, at)
	if msgs := s.Tick(at); len(msgs) != 1 || msgs[0].Kind != MsgRevoke || !s.Done(res.Wait) {
		t.Fatalf("unanswered recall: %+v", msgs)
	}
	for _, f := range []node.FID{fid(1), fid(2)} {
		if r := open(t, s, a, f, true, at.Add(time.Second)); r.Kind != DelegNone || !r.Recorded {
			t.Fatalf("open of %v right after the revocation: %+v, want no delegation", f, r)
		}
	}
	// Nothing to recall: b's open goes on at once.
	open(t, s, b, fid(1), false, at.Add(2*time.Second))
	if r := open(t, s, s.Connect("a", 0, at), fid(3), true, at.Add(3*time.Second)); r.Kind != DelegWrite {
		t.Fatalf("another session by the same name: %+v, want a write delegation", r)
	}
	if r := open(t, s, a, fid(4), true, at.Add(time.Minute)); r.Kind != DelegWrite {
		t.Fatalf("after the back-off: %+v, want a write delegation", r)
	}
}

// A holder connected and silent since a recall is revoked after the break
// timeout, not the lease: another client's open waited out 30 s for it,
// round after round. One that answers (any request, or the back channel's
// acknowledgement) has the lease to store its data; so has one whose back
// channel is gone, which may be on its way back to reclaim.
func TestSilentRecallHolderRevokedAfterBreakTimeout(t *testing.T) {
	s := NewServer(1, dcfg()) // break timeout 2 s, lease 10 s
	silent, answers, goneC, b := s.Connect("silent", 0, t0), s.Connect("answers", 0, t0), s.Connect("gone", 0, t0), s.Connect("b", 0, t0)
	for i, id := range []ClientID{silent, answers, goneC} {
		open(t, s, id, fid(uint64(i+1)), true, t0)
	}
	s.Disconnect(goneC, t0)
	recalledAt := t0.Add(time.Second)
	var waits []Round
	for i := range 3 {
		res, _ := s.Open(b, fid(uint64(i+1)), false, recalledAt)
		if res.Wait == 0 {
			t.Fatalf("open of %v: no recall", fid(uint64(i+1)))
		}
		waits = append(waits, res.Wait)
	}
	s.Renew(answers, recalledAt.Add(100*time.Millisecond))
	if next := s.NextDeadline(); !next.Equal(recalledAt.Add(2 * time.Second)) {
		t.Fatalf("next deadline %v, want the silent holder's break timeout", next.Sub(t0))
	}
	if msgs := s.Tick(recalledAt.Add(2*time.Second - time.Millisecond)); len(msgs) != 0 {
		t.Fatalf("revoked before the break timeout: %+v", msgs)
	}
	msgs := s.Tick(recalledAt.Add(2 * time.Second))
	if len(msgs) != 1 || msgs[0].Kind != MsgRevoke || msgs[0].Client != silent || !s.Done(waits[0]) {
		t.Fatalf("at the break timeout: %+v, want the silent holder's delegation revoked", msgs)
	}
	if s.Done(waits[1]) || s.Done(waits[2]) {
		t.Fatal("a holder that answered, or whose back channel is gone, lost its delegation at the break timeout")
	}
	s.Tick(recalledAt.Add(10 * time.Second))
	if !s.Done(waits[1]) || !s.Done(waits[2]) {
		t.Fatal("the others' recalls outlived the lease")
	}
}

// A request of a session continuing a gone session's line takes over
// what that session held on the file instead of recalling it from nobody
// for a lease (a proxy restarted at once, with its clients' write-back
// under those delegations); any other client's still waits for the lease.
func TestGoneSessionsDelegationsHandedOver(t *testing.T) {
	s := NewServer(1, dcfg())
	a, c := s.Connect("proxy", 0, t0), s.Connect("c", 0, t0)
	wa := open(t, s, a, fid(1), true, t0)
	open(t, s, a, fid(2), true, t0)
	s.Disconnect(a, t0)
	a2 := s.Connect("proxy", s.Line(a), t0.Add(time.Second))
	if res, msgs := s.Open(a2, fid(1), false, t0.Add(time.Second)); res.Wait != 0 || msgs != nil || !s.Valid(a2, fid(1), wa.State) {
		t.Fatalf("the line's new session waited for its own gone session: %+v %+v", res, msgs)
	}
	if res, _ := s.Open(c, fid(2), false, t0.Add(time.Second)); res.Wait == 0 {
		t.Fatal("another client's open did not wait for the gone session's delegation")
	}
}

// In the grace period after a restart, a checked reclaim gets a write
// delegation whatever the backend holds; not over another client's.
func TestRestore(t *testing.T) {
	s := NewServer(2, dcfg())
	a, b := s.Connect("a", 0, t0), s.Connect("b", 0, t0)
	h, ok := s.Restore(a, fid(1), t0)
	if !ok || h.Kind != DelegWrite || !s.Valid(a, fid(1), h.State) {
		t.Fatalf("restore: %+v %v", h, ok)
	}
	if again, ok := s.Restore(a, fid(1), t0); !ok || again.State != h.State {
		t.Fatalf("a second restore of the same file: %+v %v, want the same delegation", again, ok)
	}
	if _, ok := s.Restore(b, fid(1), t0); ok {
		t.Fatal("restored over another client's delegation")
	}
}

// An open that asks for the delegation alone records nothing when it
// gets none (no close follows): it holds nobody else's delegation back.
func TestOpenOnlyRecordsNothing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opening  Opening
		kind     DelegKind
		recorded bool
	}{
		{"delegation alone, none to give", Opening{Write: true, Only: true}, DelegNone, false},
		{"delegation alone, one to give", Opening{Limit: DelegRead, Only: true}, DelegRead, false},
		{"an open, none to give", Opening{Write: true}, DelegNone, true},
	} {
		s := NewServer(1, dcfg())
		a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
		res, _ := s.OpenWith(a, fid(1), tc.opening, t0)
		if res.Kind != tc.kind || res.Recorded != tc.recorded || res.Wait != 0 {
			t.Errorf("%s: %+v, want %v, recorded %v", tc.name, res, tc.kind, tc.recorded)
		}
		if tc.kind != DelegNone {
			continue
		}
		if r := open(t, s, b, fid(1), true, t0); (r.Kind == DelegWrite) == tc.recorded {
			t.Errorf("%s: then another client's write open: %+v", tc.name, r)
		}
	}

	// Its own delegation under recall covers nothing new: it is reported,
	// and nothing recorded.
	s := NewServer(1, dcfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	own := open(t, s, a, fid(1), true, t0)
	if res, _ := s.Open(b, fid(1), false, t0); res.Wait == 0 {
		t.Fatal("no recall")
	}
	res, _ := s.OpenWith(a, fid(1), Opening{Write: true, Limit: DelegWrite, Only: true}, t0)
	if res.Kind != DelegWrite || res.State != own.State || res.Recorded {
		t.Fatalf("delegation alone under recall: %+v, want %+v unrecorded", res, own)
	}
	if !s.Return(a, fid(1), own.State, 0, 0, t0) || len(s.opensByFID[fid(1)]) != 0 {
		t.Fatalf("opens left after the return: %v", s.opensByFID[fid(1)])
	}
}
