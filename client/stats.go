package client

import "github.com/hoardfs/hoard/cache"

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
	// Promises is the number of callback promises held now.
	Promises int
}

// Stats reports counters for tests, benchmarks and `hoard cache stats`.
func (c *Client) Stats() Stats {
	return Stats{
		Stats:         c.cache.Stats(),
		RPCs:          c.counters.rpcs.Load(),
		Breaks:        c.counters.breaks.Load(),
		Resets:        c.counters.resets.Load(),
		Revalidations: c.counters.revalidations.Load(),
		Dropped:       c.counters.dropped.Load(),
		Promises:      c.promiseCount(),
	}
}
