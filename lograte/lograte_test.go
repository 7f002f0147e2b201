package lograte

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestHoldsBackRepeats(t *testing.T) {
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), 10*time.Second, 3)
	now := time.Unix(1000, 0)
	h.state.now = func() time.Time { return now }
	log := slog.New(h).With("server", "s1")
	for i := range 1000 {
		log.Warn("delegation not returned", "fid", i)
		log.Debug("debug passes", "i", i)
	}
	log.Error("another message")
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }
	count := func(sub string) int {
		n := 0
		for _, l := range lines() {
			if strings.Contains(l, sub) {
				n++
			}
		}
		return n
	}
	if n := count("delegation not returned"); n != 3 {
		t.Fatalf("%d warnings passed in one interval, want 3", n)
	}
	if n, m := count("debug passes"), count("another message"); n != 1000 || m != 1 {
		t.Fatalf("%d debug records and %d other warnings passed", n, m)
	}
	// The interval ends: one line says how many were held back, with the
	// logger's attributes, and the next burst passes.
	now = now.Add(10 * time.Second)
	h.Tick()
	if n := count("more_like_this=997"); n != 1 || !strings.Contains(lines()[len(lines())-1], "server=s1") {
		t.Fatalf("summary: %q", lines()[len(lines())-1])
	}
	log.Warn("delegation not returned", "fid", 1)
	if n := count("delegation not returned"); n != 5 {
		t.Fatalf("%d lines after the interval, want the 3, the summary and 1 new", n)
	}
	for range 10 {
		log.Warn("delegation not returned")
	}
	h.Flush()
	if n := count("more_like_this=8"); n != 1 {
		t.Fatalf("flush: %s", buf.String())
	}
	if err := h.Handle(context.Background(), slog.NewRecord(now, slog.LevelWarn, "x", 0)); err != nil {
		t.Fatal(err)
	}
}
