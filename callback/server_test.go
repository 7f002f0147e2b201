package callback

import (
	"math/rand"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/hoardfs/hoard/node"
)

var t0 = time.Unix(1_700_000_000, 0)

func fid(n uint64) node.FID { return node.FID{Volume: 1, Vnode: n, Unique: n} }

func cfg() Config { return Config{PromiseTTL: time.Minute, BreakTimeout: 2 * time.Second} }

func grant(t *testing.T, s *Server, id ClientID, f node.FID, now time.Time) {
	t.Helper()
	if _, _, ok := s.Grant(id, f, s.Seq(), now); !ok {
		t.Fatalf("grant %v to %d refused", f, id)
	}
}

func TestConnectIDsAndKnown(t *testing.T) {
	s := NewServer(7, cfg())
	if s.Epoch() != 7 {
		t.Fatalf("epoch %d", s.Epoch())
	}
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	if a != 1 || b != 2 || !s.Known(a) || !s.Known(b) || s.Known(3) {
		t.Fatalf("ids %d %d", a, b)
	}
	s.Disconnect(a, t0)
	if s.Known(a) || s.Connect("", 0, t0) == a {
		t.Fatal("ids must not be reused")
	}
}

func TestGrant(t *testing.T) {
	s := NewServer(1, cfg())
	a := s.Connect("", 0, t0)
	ttl, msgs, ok := s.Grant(a, fid(1), s.Seq(), t0)
	if !ok || ttl != time.Minute || msgs != nil {
		t.Fatalf("grant: %v %v %v", ttl, msgs, ok)
	}
	if got := s.Holders(fid(1)); !reflect.DeepEqual(got, []ClientID{a}) {
		t.Fatalf("holders %v", got)
	}
	if _, _, ok := s.Grant(99, fid(1), s.Seq(), t0); ok {
		t.Fatal("grant to an unknown client")
	}
	if s.Promises() != 1 {
		t.Fatalf("promises %d", s.Promises())
	}
	// Re-granting extends: the promise survives its first expiry.
	grant(t, s, a, fid(1), t0.Add(30*time.Second))
	s.Tick(t0.Add(time.Minute))
	if s.Promises() != 1 {
		t.Fatal("re-granted promise expired at the first expiry")
	}
	if !s.NextDeadline().Equal(t0.Add(90 * time.Second)) {
		t.Fatalf("next deadline %v", s.NextDeadline())
	}
}

func TestExpiry(t *testing.T) {
	s := NewServer(1, cfg())
	a := s.Connect("", 0, t0)
	grant(t, s, a, fid(1), t0)
	grant(t, s, a, fid(2), t0.Add(time.Second))
	s.Tick(t0.Add(time.Minute - time.Nanosecond))
	if s.Promises() != 2 {
		t.Fatal("expired early")
	}
	s.Tick(t0.Add(time.Minute)) // exactly at expiry
	if s.Promises() != 1 || len(s.Holders(fid(1))) != 0 || len(s.Holders(fid(2))) != 1 {
		t.Fatalf("after first expiry: %d promises", s.Promises())
	}
	if msgs := s.Tick(t0.Add(time.Hour)); len(msgs) != 0 || s.Promises() != 0 {
		t.Fatalf("expiry must be silent and complete: %v, %d left", msgs, s.Promises())
	}
	if !s.NextDeadline().IsZero() {
		t.Fatal("deadline with nothing held")
	}
}

func TestBreakExcludesOriginAndGroupsByClient(t *testing.T) {
	s := NewServer(1, cfg())
	a, b, c := s.Connect("", 0, t0), s.Connect("", 0, t0), s.Connect("", 0, t0)
	for _, id := range []ClientID{a, b, c} {
		grant(t, s, id, fid(1), t0)
	}
	grant(t, s, b, fid(2), t0)
	grant(t, s, c, fid(3), t0)
	r, msgs := s.Break(a, []node.FID{fid(1), fid(2), fid(1), fid(4)}, t0)
	want := []Msg{
		{Kind: MsgBreak, Client: b, Seq: 1, FIDs: []node.FID{fid(1), fid(2)}},
		{Kind: MsgBreak, Client: c, Seq: 1, FIDs: []node.FID{fid(1)}},
	}
	if r == 0 || !reflect.DeepEqual(msgs, want) {
		t.Fatalf("round %d msgs %+v", r, msgs)
	}
	if got := s.Holders(fid(1)); !reflect.DeepEqual(got, []ClientID{a}) {
		t.Fatalf("origin must keep its promise: holders %v", got)
	}
	if len(s.Holders(fid(3))) != 1 {
		t.Fatal("an unrelated promise was broken")
	}
	// Per-client sequence numbers increase by one per message.
	grant(t, s, b, fid(5), t0)
	_, msgs = s.Break(0, []node.FID{fid(5)}, t0)
	if len(msgs) != 1 || msgs[0].Seq != 2 {
		t.Fatalf("second break to b: %+v", msgs)
	}
	// Nobody to tell: round 0, always done.
	r0, msgs := s.Break(a, []node.FID{fid(9)}, t0)
	if r0 != 0 || msgs != nil || !s.Done(0) {
		t.Fatal("a break affecting nobody must be round 0")
	}
}

func TestRoundCompletion(t *testing.T) {
	s := NewServer(1, cfg())
	a, b, c := s.Connect("", 0, t0), s.Connect("", 0, t0), s.Connect("", 0, t0)
	grant(t, s, b, fid(1), t0)
	grant(t, s, c, fid(1), t0)
	r, _ := s.Break(a, []node.FID{fid(1)}, t0)
	if s.Done(r) {
		t.Fatal("done before any ack")
	}
	s.Ack(b, 1, t0)
	if s.Done(r) {
		t.Fatal("done after a partial ack")
	}
	s.Ack(b, 1, t0) // duplicate: harmless
	s.Ack(c, 0, t0) // stale: acknowledges nothing
	if s.Done(r) {
		t.Fatal("done after a stale ack")
	}
	s.Ack(c, 1, t0)
	if !s.Done(r) {
		t.Fatal("not done after all acks")
	}
	if !s.Done(r + 100) {
		t.Fatal("a forgotten round must report done")
	}
}

// A change made while an earlier break of the same FID is still
// unacknowledged waits for that acknowledgement too: until it comes, its
// holder may answer from the state both changes replaced.
func TestBreakWaitsForEarlierUnacked(t *testing.T) {
	s := NewServer(1, cfg())
	a, b, c := s.Connect("", 0, t0), s.Connect("", 0, t0), s.Connect("", 0, t0)
	d := fid(1)
	grant(t, s, b, d, t0)
	grant(t, s, c, d, t0)
	r1, _ := s.Break(a, []node.FID{d}, t0)
	s.Ack(b, 1, t0)
	r2, msgs := s.Break(b, []node.FID{d}, t0)
	if len(msgs) != 0 || r2 == 0 || s.Done(r2) {
		t.Fatalf("a second change while c has not acknowledged the first: round %d (done %v), msgs %+v; want a round waiting for c, no message", r2, s.Done(r2), msgs)
	}
	if r, _ := s.Break(a, []node.FID{fid(2)}, t0); r != 0 {
		t.Fatal("a change to another FID waits for c")
	}
	if r, _ := s.Break(c, []node.FID{d}, t0); r != 0 {
		t.Fatal("c's own change waits for c")
	}
	s.Ack(c, 1, t0)
	if !s.Done(r1) || !s.Done(r2) {
		t.Fatal("c's acknowledgement must complete both rounds")
	}

	// A holder sent a new break is waited for through that one alone.
	grant(t, s, c, d, t0)
	r3, _ := s.Break(a, []node.FID{d}, t0)
	grant(t, s, c, d, t0)
	r4, msgs := s.Break(b, []node.FID{d}, t0)
	if len(msgs) != 1 || msgs[0].Client != c {
		t.Fatalf("msgs %+v, want one break to c", msgs)
	}
	s.Ack(c, msgs[0].Seq, t0)
	if !s.Done(r3) || !s.Done(r4) {
		t.Fatal("the later acknowledgement must complete both rounds")
	}

	// A holder that goes away stops holding up the later round.
	grant(t, s, c, d, t0)
	s.Break(a, []node.FID{d}, t0)
	r6, _ := s.Break(b, []node.FID{d}, t0)
	s.Disconnect(c, t0)
	if !s.Done(r6) {
		t.Fatal("a disconnect must complete the rounds waiting for its acknowledgements")
	}
}

func TestAckCoversLowerSeqs(t *testing.T) {
	s := NewServer(1, cfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	var rounds []Round
	for i := uint64(1); i <= 3; i++ {
		grant(t, s, b, fid(i), t0)
		r, _ := s.Break(a, []node.FID{fid(i)}, t0)
		rounds = append(rounds, r)
	}
	s.Ack(b, 2, t0)
	if !s.Done(rounds[0]) || !s.Done(rounds[1]) || s.Done(rounds[2]) {
		t.Fatal("ack 2 must complete rounds 1 and 2 only")
	}
	s.Ack(b, 10, t0)
	if !s.Done(rounds[2]) {
		t.Fatal("a higher ack must cover everything below")
	}
}

func TestDisconnectCompletesRounds(t *testing.T) {
	s := NewServer(1, cfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	grant(t, s, b, fid(1), t0)
	grant(t, s, b, fid(2), t0)
	r, _ := s.Break(a, []node.FID{fid(1)}, t0)
	s.Disconnect(b, t0)
	if !s.Done(r) || s.Promises() != 0 || len(s.Holders(fid(2))) != 0 {
		t.Fatal("disconnect must complete rounds and drop promises")
	}
	s.Ack(b, 1, t0) // from a ghost: harmless
	s.Disconnect(b, t0)
}

func TestBreakTimeoutLosesClient(t *testing.T) {
	s := NewServer(1, cfg())
	a, b, c := s.Connect("", 0, t0), s.Connect("", 0, t0), s.Connect("", 0, t0)
	grant(t, s, b, fid(1), t0)
	grant(t, s, b, fid(2), t0)
	grant(t, s, c, fid(1), t0)
	r, _ := s.Break(a, []node.FID{fid(1)}, t0)
	s.Ack(c, 1, t0)
	if d := s.NextDeadline(); !d.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("next deadline %v, want the break timeout", d)
	}
	if msgs := s.Tick(t0.Add(2*time.Second - 1)); len(msgs) != 0 || s.Done(r) {
		t.Fatal("gave up before the timeout")
	}
	msgs := s.Tick(t0.Add(2 * time.Second))
	if !reflect.DeepEqual(msgs, []Msg{{Kind: MsgReset, Client: b}}) {
		t.Fatalf("tick msgs %+v", msgs)
	}
	if !s.Done(r) || len(s.Holders(fid(2))) != 0 || !s.Known(b) {
		t.Fatal("a lost client must lose its promises, stay connected, and stop holding up the round")
	}
	// A lost client earns promises again.
	grant(t, s, b, fid(2), t0.Add(3*time.Second))
	if len(s.Holders(fid(2))) != 1 {
		t.Fatal("lost client could not be granted again")
	}
	if msgs := s.Tick(t0.Add(4 * time.Second)); len(msgs) != 0 {
		t.Fatalf("reset sent twice: %+v", msgs)
	}
}

func TestGrantAfterBreakRefused(t *testing.T) {
	s := NewServer(1, cfg())
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	since := s.Seq()                   // b's RPC starts and reads the status
	s.Break(a, []node.FID{fid(1)}, t0) // a's change lands meanwhile (b held nothing yet)
	if _, _, ok := s.Grant(b, fid(1), since, t0); ok {
		t.Fatal("a grant describing pre-break state was accepted")
	}
	if _, _, ok := s.Grant(b, fid(2), since, t0); !ok {
		t.Fatal("a grant on an unbroken FID was refused")
	}
	if _, _, ok := s.Grant(b, fid(1), s.Seq(), t0); !ok {
		t.Fatal("a grant taken after the break was refused")
	}
}

func TestBreakLogBound(t *testing.T) {
	c := cfg()
	c.BreakLog = 4
	s := NewServer(1, c)
	a := s.Connect("", 0, t0)
	since := s.Seq()
	for i := uint64(10); i < 20; i++ {
		s.Break(0, []node.FID{fid(i)}, t0)
	}
	// fid(1) was never broken, but the log no longer reaches back to
	// since: refusing is the safe answer.
	if _, _, ok := s.Grant(a, fid(1), since, t0); ok {
		t.Fatal("grant accepted beyond the break log's reach")
	}
	if _, _, ok := s.Grant(a, fid(1), s.Seq()-2, t0); !ok {
		t.Fatal("grant within the log's reach refused")
	}
	if len(s.recent) > 4 {
		t.Fatalf("break log holds %d entries, bound 4", len(s.recent))
	}
}

func TestMaxPromisesEvictsSoonest(t *testing.T) {
	c := cfg()
	c.MaxPromises = 2
	s := NewServer(1, c)
	a, b := s.Connect("", 0, t0), s.Connect("", 0, t0)
	grant(t, s, a, fid(1), t0)
	grant(t, s, b, fid(2), t0.Add(time.Second))
	_, msgs, ok := s.Grant(a, fid(3), s.Seq(), t0.Add(2*time.Second))
	if !ok || !reflect.DeepEqual(msgs, []Msg{{Kind: MsgBreak, Client: a, Seq: 1, FIDs: []node.FID{fid(1)}}}) {
		t.Fatalf("eviction msgs %+v", msgs)
	}
	if s.Promises() != 2 || len(s.Holders(fid(1))) != 0 || len(s.Holders(fid(3))) != 1 {
		t.Fatal("wrong promise evicted")
	}
	// Eviction breaks belong to no round, but still time out like any break.
	if d := s.NextDeadline(); !d.Equal(t0.Add(4 * time.Second)) {
		t.Fatalf("deadline %v", d)
	}
}

// TestRandomAgainstModel runs random operations against a naive model.
func TestRandomAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	c := cfg()
	s := NewServer(1, c)
	type key struct {
		c ClientID
		f node.FID
	}
	model := map[key]time.Time{}
	// unacked: the breaks each client has not acknowledged, by FID.
	unacked := map[key]bool{}
	forget := func(id ClientID) {
		for k := range unacked {
			if k.c == id {
				delete(unacked, k)
			}
		}
	}
	now := t0
	var clients []ClientID
	pendingRounds := map[Round]time.Time{}
	for step := 0; step < 20000; step++ {
		now = now.Add(time.Duration(rng.Intn(300)) * time.Millisecond)
		switch op := rng.Intn(10); {
		case op == 0 || len(clients) == 0:
			clients = append(clients, s.Connect("", 0, now))
		case op == 1 && len(clients) > 1:
			i := rng.Intn(len(clients))
			s.Disconnect(clients[i], now)
			forget(clients[i])
			for k := range model {
				if k.c == clients[i] {
					delete(model, k)
				}
			}
			clients = append(clients[:i], clients[i+1:]...)
		case op < 6:
			id, f := clients[rng.Intn(len(clients))], fid(uint64(rng.Intn(20)))
			if _, _, ok := s.Grant(id, f, s.Seq(), now); ok {
				model[key{id, f}] = now.Add(c.PromiseTTL)
			}
		case op < 8:
			origin := clients[rng.Intn(len(clients))]
			f := fid(uint64(rng.Intn(20)))
			behind := false
			for k := range unacked {
				behind = behind || k.f == f && k.c != origin
			}
			r, msgs := s.Break(origin, []node.FID{f}, now)
			if behind && (r == 0 || s.Done(r)) {
				t.Fatalf("step %d: a change to %v does not wait for an earlier break still unacknowledged", step, f)
			}
			for _, m := range msgs {
				if m.Client == origin {
					t.Fatal("origin told of its own change")
				}
				delete(model, key{m.Client, f})
				unacked[key{m.Client, f}] = true
				if rng.Intn(4) != 0 {
					s.Ack(m.Client, m.Seq, now)
					forget(m.Client)
				}
			}
			for k := range model {
				if k.f == f && k.c != origin {
					t.Fatalf("step %d: %v kept its promise on %v through a break", step, k.c, f)
				}
			}
			if r != 0 && !s.Done(r) {
				pendingRounds[r] = now
			}
		default:
			for _, m := range s.Tick(now) {
				if m.Kind == MsgReset {
					forget(m.Client)
					for k := range model {
						if k.c == m.Client {
							delete(model, k)
						}
					}
				}
			}
			for k, exp := range model {
				if !exp.After(now) {
					delete(model, k)
				}
			}
			for r, started := range pendingRounds {
				if s.Done(r) {
					delete(pendingRounds, r)
				} else if now.Sub(started) > c.BreakTimeout {
					t.Fatalf("round %d open %v after it started, past the break timeout", r, now.Sub(started))
				}
			}
		}
		// The holders of every FID equal the model's, with expired ones
		// allowed to linger only until the next Tick.
		for v := uint64(0); v < 20; v++ {
			var want []ClientID
			for k, exp := range model {
				if k.f == fid(v) && exp.After(now) {
					want = append(want, k.c)
				}
			}
			sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
			var got []ClientID
			for _, h := range s.Holders(fid(v)) {
				if _, ok := model[key{h, fid(v)}]; ok && model[key{h, fid(v)}].After(now) {
					got = append(got, h)
				} else if !ok {
					t.Fatalf("step %d: server says %d holds %v, the model does not", step, h, fid(v))
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d fid %d: holders %v, model %v", step, v, got, want)
			}
		}
	}
}
