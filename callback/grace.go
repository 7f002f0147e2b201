package callback

import (
	"errors"
	"fmt"
	"time"
)

// The grace period after a restart (NFSv4 has one too). The server's last
// life ended with promises and delegations out that this one does not
// know. Its clients reconnect within the grace period: they drop those
// promises and reclaim those delegations, with the stores of their dirty
// data, before anything may change or, when delegations are granted, be
// read. Grace is a value fixed at the start, safe to share: the server
// consults it without its lock.

// Grace decides what may happen in the grace period after a restart.
type Grace struct {
	end time.Time
	// reads: delegations are granted, so reads wait too (Reading).
	reads bool
}

// NewGrace is the grace period of a server started at start in epoch,
// lasting d; lease is its delegation lease (0: none are granted). The
// first epoch has none: no client comes from before it.
func NewGrace(epoch uint64, start time.Time, d, lease time.Duration) Grace {
	g := Grace{reads: lease > 0}
	if epoch > 1 {
		g.end = start.Add(d)
	}
	return g
}

// Access is what a request does, as far as the grace period cares.
type Access uint8

const (
	// Changing: a change, or a proxy's recall of its clients' delegations
	// before it gives back its own. It waits: no change may be
	// acknowledged while a client of the last life could still trust a
	// promise on what it changes, and what the proxy gives back comes
	// with the reclaims.
	Changing Access = iota + 1
	// Reading: an open, or a read of status or data. It waits when
	// delegations are granted: a client that held a write delegation
	// reclaims it first, so nobody reads the file without the data it
	// writes back.
	Reading
	// Reclaiming: a reclaim, or a store or settle of files made under a
	// delegation (which may be one). It goes on at once: the grace
	// period is for these.
	Reclaiming
)

// Wait is how long a request doing a must wait at now before it goes on.
func (g Grace) Wait(a Access, now time.Time) time.Duration {
	if a == Reclaiming || a == Reading && !g.reads {
		return 0
	}
	return max(g.end.Sub(now), 0)
}

// Why a reclaim of what the server no longer knows is refused.
var (
	ErrGraceOver    = errors.New("the grace period is over")
	ErrNotRestarted = errors.New("this session continues none of the server's last life")
	ErrFileChanged  = errors.New("the file changed")
)

// MayReclaim says whether a session may, at now, reclaim what it held in
// the server's last life and the server no longer knows: nil if so, else
// why not. restarted: the session proved it continues one of that life.
// The caller asks it before it reads the file's version for Reclaim.
func (g Grace) MayReclaim(now time.Time, restarted bool) error {
	switch {
	case !now.Before(g.end):
		return ErrGraceOver
	case !restarted:
		return ErrNotRestarted
	}
	return nil
}

// Reclaim says whether a session may, at now, reclaim a delegation of the
// server's last life on a file now at data version, which the client's
// delegation left at base: nil if so, else why not. Nobody else can have
// opened the file since the restart (opens and reads wait out the grace
// period), so a file still at base is as the client left it.
func (g Grace) Reclaim(now time.Time, restarted bool, version, base uint64) error {
	if err := g.MayReclaim(now, restarted); err != nil {
		return err
	}
	if version != base {
		return fmt.Errorf("%w (version %d, not %d)", ErrFileChanged, version, base)
	}
	return nil
}
