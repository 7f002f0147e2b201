package client

import (
	"github.com/hoardfs/hoard/client/site"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/latency"
)

// Stats are the cache's cumulative counters (kept across runs) plus this
// client's protocol counters (since Dial).
type Stats struct {
	cache.Stats
	// RPCs counts control RPCs sent, data transfers included.
	RPCs int64
	// Breaks counts FIDs whose promise the server broke.
	Breaks int64
	// Resets counts Reset messages (all promises voided).
	Resets int64
	// Revalidations counts status RPCs made because no promise was held.
	Revalidations int64
	// Dropped counts files whose cached data was dropped for a new version.
	Dropped int64
	// Stores counts stores of file data sent to the server.
	Stores int64
	// Promises is the number of callback promises held now.
	Promises int
	// Delegations held now, by kind; opens and closes served under them;
	// recalls received; delegations revoked, and reclaimed on a new
	// session; bytes of unstored writes now, and stored by the flusher.
	ReadDelegations, WriteDelegations int
	LocalOpens, LocalCloses           int64
	Recalls, Revoked, Reclaimed       int64
	DirtyBytes, Flushed               int64
	// Files made here under directory delegations; removed before the
	// server knew them; created at the server later. Files the server
	// knew, removed here under a directory delegation and there later.
	MadeHere, MadeDropped, Settled int64
	RemovedHere                    int64
	// Nodes is the number of files and directories held in memory.
	Nodes int
	// DirtyAge is how long the oldest write not yet stored has waited.
	DirtyAge time.Duration
	// Lost counts files whose writes could not be delivered and were
	// kept in lost/.
	Lost int64
	// BypassOpens counts opens that bypassed the cache, by the kind of
	// rule that chose it (policy.Rules).
	BypassOpens map[string]int64
	// FetchTime and StoreTime are how long chunk fetches and stores of
	// file data took.
	FetchTime, StoreTime latency.Histogram
}

// Stats reports counters for tests, benchmarks and `hoard cache stats`:
// of every server of the cell the client reaches.
func (c *Client) Stats() Stats {
	st := Stats{
		Stats:         c.cache.Stats(),
		Breaks:        c.counters.breaks.Load(),
		Resets:        c.counters.resets.Load(),
		Revalidations: c.counters.revalidations.Load(),
		Dropped:       c.counters.dropped.Load(),
		Stores:        c.counters.stores.Load(),
		LocalOpens:    c.counters.localOpens.Load(), LocalCloses: c.counters.localCloses.Load(),
		Recalls: c.counters.recalls.Load(), Revoked: c.counters.revoked.Load(), Reclaimed: c.counters.reclaims.Load(),
		DirtyBytes: c.cache.DirtyBytes(), Flushed: c.counters.flushed.Load(),
		MadeHere: c.counters.madeHere.Load(), MadeDropped: c.counters.madeDropped.Load(), Settled: c.counters.settled.Load(),
		RemovedHere: c.counters.removedHere.Load(),
		Nodes:       c.nodeCount(),
		DirtyAge:    c.dirtyAge(),
		Lost:        c.counters.lost.Load(),
		BypassOpens: c.bypassOpens(),
		FetchTime:   c.counters.fetchTime.Snapshot(),
		StoreTime:   c.counters.storeTime.Snapshot(),
	}
	c.sites.Each(func(s *site.Site) {
		p, r, w := s.Counts()
		st.Promises += p
		st.ReadDelegations += r
		st.WriteDelegations += w
		st.RPCs += s.Conn.RPCs()
	})
	return st
}

// dirtyAge is how long the oldest write not yet stored has waited.
func (c *Client) dirtyAge() time.Duration {
	var oldest time.Time
	for _, d := range c.flusher.Files() {
		if b, since, _ := d.Dirty(); b > 0 && !since.IsZero() && (oldest.IsZero() || since.Before(oldest)) {
			oldest = since
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return time.Since(oldest)
}

func (c *Client) bypassOpens() map[string]int64 {
	m := make(map[string]int64, len(policy.Rules))
	for i, r := range policy.Rules {
		m[r] = c.counters.bypassOpens[i].Load()
	}
	return m
}

func (c *Client) nodeCount() int {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	return len(c.nodes)
}
