package volhold

import (
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// A step of a table: an action on the state, and what must hold after.
type step struct {
	do    func(s *State)
	check func(s *State) bool
	why   string
}

func run(t *testing.T, steps []step) {
	t.Helper()
	s := New()
	for i, st := range steps {
		if st.do != nil {
			st.do(s)
		}
		if st.check != nil && !st.check(s) {
			t.Fatalf("step %d: %s", i, st.why)
		}
	}
}

func enters(now time.Time, vols ...uint64) func(*State) bool {
	return func(s *State) bool { _, ok := s.Enter(now, vols...); return ok }
}

func refused(now time.Time, vols ...uint64) func(*State) bool {
	return func(s *State) bool { _, ok := s.Enter(now, vols...); return !ok }
}

func TestFreeze(t *testing.T) {
	run(t, []step{
		{check: enters(at(0), 1), why: "a change of an unheld volume is refused"},
		{do: func(s *State) { s.Freeze(1, at(10)) }, check: func(s *State) bool { return !s.Drained(1) },
			why: "a freeze does not wait for the change under way"},
		{check: refused(at(5), 1), why: "a change of a frozen volume is let in"},
		{check: refused(at(5), 2, 1), why: "a change of two volumes, one frozen, is let in"},
		{check: func(s *State) bool { return s.Drained(2) }, why: "a refused change counted on its other volume"},
		{do: func(s *State) { s.Leave(1) }, check: func(s *State) bool { return s.Drained(1) },
			why: "the change under way left and the volume is not drained"},
		{check: enters(at(10), 1), why: "a freeze past its hold still refuses"},
		{do: func(s *State) { s.Leave(1); s.Freeze(1, at(20)); s.Unfreeze(1) }, check: enters(at(11), 1),
			why: "a freeze given up still refuses"},
	})
}

func TestQuietAndCommit(t *testing.T) {
	run(t, []step{
		{do: func(s *State) { s.Quiet(1, at(10)) }, check: func(s *State) bool { return !s.FrozenAt(1, at(1)) },
			why: "quiet alone counts as frozen for a commit"},
		{do: func(s *State) { s.Freeze(1, at(10)) }, check: func(s *State) bool { return s.FrozenAt(1, at(1)) },
			why: "frozen and quiet does not allow a commit"},
		{check: func(s *State) bool { return !s.FrozenAt(1, at(10)) }, why: "a lapsed hold allows a commit"},
		{check: func(s *State) bool { return s.QuietSince(1, at(10)) }, why: "the quiet's own timer does not see it"},
		{do: func(s *State) { s.Quiet(1, at(30)) }, check: func(s *State) bool { return !s.QuietSince(1, at(10)) },
			why: "a superseded quiet's timer would end the new one"},
		{do: func(s *State) { s.Thaw(1) }, check: func(s *State) bool {
			return !s.QuietSince(1, at(30)) && !s.FrozenAt(1, at(1))
		}, why: "a thaw leaves a hold"},
		{check: enters(at(1), 1), why: "a thawed volume refuses changes"},
		{do: func(s *State) { s.Freeze(2, at(10)); s.Quiet(2, at(5)) }, check: func(s *State) bool { return !s.FrozenAt(2, at(6)) },
			why: "frozen with its quiet lapsed allows a commit (promises may have been granted since)"},
	})
}

func TestDepartAndReceive(t *testing.T) {
	run(t, []step{
		{do: func(s *State) { s.Depart(1, true) }, check: func(s *State) bool { return s.Departing(1) && !s.Departing(2) },
			why: "departing is not per volume"},
		{do: func(s *State) { s.Depart(1, false) }, check: func(s *State) bool { return !s.Departing(1) },
			why: "a finished hand-over still departs"},
		{check: func(s *State) bool { return s.Receive(7) }, why: "a first release refused"},
		{check: func(s *State) bool { return !s.Receive(7) && s.Receive(8) }, why: "two releases of one copy at once, or none of another"},
		{do: func(s *State) { s.Received(7) }, check: func(s *State) bool { return s.Receive(7) },
			why: "a copy whose release ended refuses the next"},
	})
}

// Holds lists what a status page shows: each volume's holds now, lapsed
// ones left out, by id.
func TestHolds(t *testing.T) {
	s := New()
	s.Enter(at(0), 1) // a change under way holds nothing
	s.Freeze(3, at(30))
	s.Quiet(3, at(30))
	s.Quiet(2, at(10))
	s.Depart(3, true)
	got := s.Holds(at(5))
	want := []Hold{{Volume: 2, Quiet: at(10)}, {Volume: 3, Frozen: at(30), Quiet: at(30), Departing: true}}
	if !slices.Equal(got, want) {
		t.Fatalf("holds at 5 s: %+v, want %+v", got, want)
	}
	s.Depart(3, false)
	if got := s.Holds(at(20)); !slices.Equal(got, []Hold{{Volume: 3, Frozen: at(30), Quiet: at(30)}}) {
		t.Fatalf("holds at 20 s, volume 2's quiet lapsed: %+v", got)
	}
	if got := s.Holds(at(40)); len(got) != 0 {
		t.Fatalf("holds once all lapsed: %+v", got)
	}
}
