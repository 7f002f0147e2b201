// Package lograte keeps a repeated warning from flooding a log: a handler
// that passes the first few records of each message per interval and then
// counts the rest, and says how many it held back in one line when the
// interval ends. A server whose peer is gone, or a client closing with
// thousands of delegations, would otherwise write the same line thousands
// of times.
package lograte

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Handler rate-limits the records of level Warn and above, by level and
// message, in front of another handler; records below Warn pass as they
// are (debug logs are asked for, and read whole).
type Handler struct {
	next  slog.Handler
	state *state
}

type state struct {
	every time.Duration
	burst int
	now   func() time.Time

	mu   sync.Mutex
	keys map[key]*window
}

type key struct {
	level slog.Level
	msg   string
}

// window counts one message's records since start; held were not passed.
type window struct {
	start time.Time
	seen  int
	held  int
	// next is the handler (with its attributes) of the last record held,
	// which says how many were.
	next slog.Handler
}

// New passes burst records of each message every interval to next.
func New(next slog.Handler, every time.Duration, burst int) *Handler {
	return &Handler{next: next, state: &state{every: every, burst: burst, now: time.Now, keys: map[key]*window{}}}
}

func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(as), state: h.state}
}

func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), state: h.state}
}

// Handle passes r, or counts it if its message already had its burst in
// this interval. Windows that ended with records held are summed up first.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	s := h.state
	now := s.now()
	s.mu.Lock()
	ended := s.endedLocked(now, false)
	k := key{r.Level, r.Message}
	w := s.keys[k]
	if w == nil {
		w = &window{start: now}
		s.keys[k] = w
	}
	w.seen++
	pass := w.seen <= s.burst
	if !pass {
		w.held++
		w.next = h.next
	}
	s.mu.Unlock()
	for _, e := range ended {
		e.emit(ctx, now)
	}
	if pass {
		return h.next.Handle(ctx, r)
	}
	return nil
}

// Tick says how many records were held back in the windows that ended:
// call it every interval, so that a burst followed by silence is told of.
func (h *Handler) Tick() { h.sweep(false) }

// Flush says how many records are held back now, for a process about to
// end.
func (h *Handler) Flush() { h.sweep(true) }

func (h *Handler) sweep(all bool) {
	s := h.state
	now := s.now()
	s.mu.Lock()
	ended := s.endedLocked(now, all)
	s.mu.Unlock()
	for _, e := range ended {
		e.emit(context.Background(), now)
	}
}

type summary struct {
	k    key
	held int
	next slog.Handler
}

func (e summary) emit(ctx context.Context, now time.Time) {
	r := slog.NewRecord(now, e.k.level, e.k.msg, 0)
	r.AddAttrs(slog.Int("more_like_this", e.held))
	e.next.Handle(ctx, r)
}

// endedLocked drops the windows that ended (all: every one), returning
// those that held records back.
func (s *state) endedLocked(now time.Time, all bool) []summary {
	var out []summary
	for k, w := range s.keys {
		if !all && now.Sub(w.start) < s.every {
			continue
		}
		if w.held > 0 {
			out = append(out, summary{k, w.held, w.next})
		}
		delete(s.keys, k)
	}
	return out
}
