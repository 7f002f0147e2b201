package callback

import (
	"errors"
	"testing"
	"time"
)

func TestGraceWait(t *testing.T) {
	const d, lease = 3 * time.Second, 30 * time.Second
	for _, tc := range []struct {
		name  string
		epoch uint64
		lease time.Duration
		a     Access
		at    time.Duration // after the start
		want  time.Duration
	}{
		{"a first start has no grace period", 1, lease, Changing, 0, 0},
		{"a change waits it out", 2, lease, Changing, time.Second, 2 * time.Second},
		{"a change at its end goes on", 2, lease, Changing, d, 0},
		{"a change after it goes on", 2, lease, Changing, 2 * d, 0},
		{"a read waits it out with delegations", 2, lease, Reading, 0, d},
		{"a read goes on without delegations", 2, 0, Reading, 0, 0},
		{"a change waits without delegations too", 2, 0, Changing, 0, d},
		{"a reclaim goes on at once", 2, lease, Reclaiming, 0, 0},
	} {
		g := NewGrace(tc.epoch, t0, d, tc.lease)
		if got := g.Wait(tc.a, t0.Add(tc.at)); got != tc.want {
			t.Errorf("%s: wait %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestGraceReclaim(t *testing.T) {
	const d = 3 * time.Second
	for _, tc := range []struct {
		name          string
		epoch         uint64
		at            time.Duration // after the start
		restarted     bool
		version, base uint64
		want          error // nil: the reclaim may go on
	}{
		{"in the grace period, unchanged", 2, time.Second, true, 7, 7, nil},
		{"the grace period is over", 2, d, true, 7, 7, ErrGraceOver},
		{"a first start has no grace period", 1, 0, true, 7, 7, ErrGraceOver},
		{"a session of this life", 2, time.Second, false, 7, 7, ErrNotRestarted},
		{"the file changed", 2, time.Second, true, 8, 7, ErrFileChanged},
		{"over, whatever else", 2, d, false, 8, 7, ErrGraceOver},
	} {
		g := NewGrace(tc.epoch, t0, d, time.Minute)
		now := t0.Add(tc.at)
		if err := g.Reclaim(now, tc.restarted, tc.version, tc.base); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		// MayReclaim is Reclaim before the version is known.
		wantMay := tc.want
		if wantMay == ErrFileChanged {
			wantMay = nil
		}
		if err := g.MayReclaim(now, tc.restarted); !errors.Is(err, wantMay) {
			t.Errorf("%s: may reclaim: %v, want %v", tc.name, err, wantMay)
		}
	}
	err := NewGrace(2, t0, d, 0).Reclaim(t0, true, 8, 7)
	if want := "the file changed (version 8, not 7)"; err == nil || err.Error() != want {
		t.Errorf("changed file: %v, want %q", err, want)
	}
}
