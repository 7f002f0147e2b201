// Package volhold is the holds a file server puts on its volumes while
// they move to another server or are released to read-only sites: the
// changes under way on each volume, the freeze that refuses new ones, the
// quiet in which no promise or delegation is granted, the hand-over of a
// volume whose move is being committed, and the one release a read-only
// copy receives at a time.
//
// Like package callback it is a pure machine: time is an argument, it
// does no I/O and takes no lock. The server keeps one under a mutex, with
// a condition variable for a freeze that waits for changes to drain, and
// the timer that lets a quiet lapse (server/move.go).
package volhold

import (
	"cmp"
	"slices"
	"time"
)

// State is a server's holds on its volumes.
type State struct {
	// active counts the changes under way on each volume; frozen are the
	// volumes refusing new ones, until when.
	active map[uint64]int
	frozen map[uint64]time.Time
	// quiet are the volumes granted nothing on, until when.
	quiet map[uint64]time.Time
	// departing are the volumes whose move is being committed: from
	// before the location database names the target until the copy here
	// is gone, nothing is answered from it, reads neither (a client that
	// learnt of the move from another server may be changing the target's
	// copy already).
	departing map[uint64]bool
	// receiving are the read-only copies a release is being received
	// into here.
	receiving map[uint64]bool
}

// New is a server's holds with none held.
func New() *State {
	return &State{active: map[uint64]int{}, frozen: map[uint64]time.Time{}, quiet: map[uint64]time.Time{},
		departing: map[uint64]bool{}, receiving: map[uint64]bool{}}
}

// Enter counts a change of each of vols under way, unless one of them is
// frozen at now: then it counts none, and returns that volume.
func (s *State) Enter(now time.Time, vols ...uint64) (frozen uint64, ok bool) {
	for _, v := range vols {
		if until, held := s.frozen[v]; held && now.Before(until) {
			return v, false
		}
	}
	for _, v := range vols {
		s.active[v]++
	}
	return 0, true
}

// Leave ends changes of vols that Enter counted.
func (s *State) Leave(vols ...uint64) {
	for _, v := range vols {
		if s.active[v]--; s.active[v] <= 0 {
			delete(s.active, v)
		}
	}
}

// Freeze refuses new changes to vol until until; those under way go on
// (Drained says when they are done).
func (s *State) Freeze(vol uint64, until time.Time) { s.frozen[vol] = until }

// Drained reports whether no change of vol is under way.
func (s *State) Drained(vol uint64) bool { return s.active[vol] == 0 }

// Unfreeze gives a freeze up (its mover went away while it drained).
func (s *State) Unfreeze(vol uint64) { delete(s.frozen, vol) }

// Quiet has nothing granted on vol until until. The server lets it lapse
// by a timer, which asks QuietSince first: a later Quiet supersedes it.
func (s *State) Quiet(vol uint64, until time.Time) { s.quiet[vol] = until }

// QuietSince reports whether vol's quiet is still the one set to last
// until until (not thawed, not set again since).
func (s *State) QuietSince(vol uint64, until time.Time) bool {
	q, ok := s.quiet[vol]
	return ok && q.Equal(until)
}

// Thaw ends vol's freeze and quiet.
func (s *State) Thaw(vol uint64) {
	delete(s.frozen, vol)
	delete(s.quiet, vol)
}

// FrozenAt reports whether vol is frozen and quiet at now, neither
// lapsed: a move or a release may be committed.
func (s *State) FrozenAt(vol uint64, now time.Time) bool {
	return now.Before(s.frozen[vol]) && now.Before(s.quiet[vol])
}

// Depart marks vol as being handed over (on) or no longer (off).
func (s *State) Depart(vol uint64, on bool) {
	if on {
		s.departing[vol] = true
	} else {
		delete(s.departing, vol)
	}
}

// Departing reports whether vol is being handed over: nothing is to be
// answered from it.
func (s *State) Departing(vol uint64) bool { return s.departing[vol] }

// Receive marks copy as receiving a release, unless one is under way
// already: their passes would drop each other's files.
func (s *State) Receive(copy uint64) bool {
	if s.receiving[copy] {
		return false
	}
	s.receiving[copy] = true
	return true
}

// Received ends copy's release.
func (s *State) Received(copy uint64) { delete(s.receiving, copy) }

// Hold is what is held on one volume, for a status page.
type Hold struct {
	Volume uint64
	// Frozen and Quiet are until when the volume refuses changes and is
	// granted nothing (zero: not, or lapsed).
	Frozen, Quiet time.Time
	Departing     bool
}

// Holds lists the volumes held at now, by id: frozen or quiet (not
// lapsed), or departing.
func (s *State) Holds(now time.Time) []Hold {
	by := map[uint64]*Hold{}
	get := func(v uint64) *Hold {
		if by[v] == nil {
			by[v] = &Hold{Volume: v}
		}
		return by[v]
	}
	for v, until := range s.frozen {
		if now.Before(until) {
			get(v).Frozen = until
		}
	}
	for v, until := range s.quiet {
		if now.Before(until) {
			get(v).Quiet = until
		}
	}
	for v := range s.departing {
		get(v).Departing = true
	}
	out := make([]Hold, 0, len(by))
	for _, h := range by {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b Hold) int { return cmp.Compare(a.Volume, b.Volume) })
	return out
}
