package server

import (
	"slices"
	"time"

	"github.com/hoardfs/hoard/volhold"
)

// Underway is a move or a release of a volume under way at this server,
// as its status page lists it.
type Underway struct {
	// Volume and Name are the read-write volume's.
	Volume uint64
	Name   string
	// Kind is "move" or "release".
	Kind string
	// Phase is, at the source (the read-write site): begun (recorded, no
	// pass under way: between passes, or the mover went away), copying
	// (a pass is sent), quiet (promises recalled), frozen (changes wait)
	// or committing; at a move's target or a release's site: receiving.
	Phase string
	// Since is when the phase began (zero: not known).
	Since time.Time
	// Peers are the servers at the other end: a move's target or a
	// release's sites, at the source; the source, at a receiver.
	Peers []string
}

// Underway lists the moves and releases under way here, by volume: those
// the location database records (a move begun) and those holding a
// volume or passing its data now (package volhold, moves.passes).
func (s *Server) Underway() []Underway {
	c := s.cfg.Cell
	if c == nil {
		return nil
	}
	m := &s.moves
	m.mu.Lock()
	holds := m.hold.Holds(time.Now())
	// The earliest pass under way of each volume, each way.
	sending, receiving := map[uint64]time.Time{}, map[uint64]time.Time{}
	for p := range m.passes {
		at := receiving
		if p.send {
			at = sending
		}
		if t, ok := at[p.vol]; !ok || p.since.Before(t) {
			at[p.vol] = p.since
		}
	}
	m.mu.Unlock()
	held := map[uint64]volhold.Hold{}
	for _, h := range holds {
		held[h.Volume] = h
	}
	// The location database only once moves.mu is let go (locks.go).
	var out []Underway
	for _, v := range c.DB.Volumes() {
		u := Underway{Volume: v.ID, Name: v.Name, Kind: "release"}
		if v.RW != c.Name {
			since, ok := receiving[v.ID]
			if !ok {
				continue
			}
			if v.Moving == c.Name {
				u.Kind = "move"
			}
			u.Phase, u.Since, u.Peers = "receiving", since, []string{v.RW}
			out = append(out, u)
			continue
		}
		h, isHeld := held[v.ID]
		since, isSending := sending[v.ID]
		if v.Moving == "" && !isHeld && !isSending {
			continue
		}
		u.Peers = slices.Concat(v.RO, v.Pending)
		if v.Moving != "" {
			u.Kind, u.Peers = "move", []string{v.Moving}
		}
		// A freeze and a quiet last MoveHold from when they were set.
		switch {
		case !h.Frozen.IsZero():
			u.Phase, u.Since = "frozen", h.Frozen.Add(-s.cfg.MoveHold)
			if h.Departing {
				u.Phase = "committing"
			}
		case !h.Quiet.IsZero():
			u.Phase, u.Since = "quiet", h.Quiet.Add(-s.cfg.MoveHold)
		case isSending:
			u.Phase, u.Since = "copying", since
		default:
			u.Phase = "begun"
		}
		out = append(out, u)
	}
	return out
}
