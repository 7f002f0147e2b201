package client

import "github.com/hoardfs/hoard/cache"

// LargestCached lists the n files holding the most space in the cache,
// most first (cache.Cache.Largest): for a status page, not a hot path.
func (c *Client) LargestCached(n int) []cache.Usage { return c.cache.Largest(n) }
