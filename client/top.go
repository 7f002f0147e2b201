package client

import "github.com/hoardfs/hoard/cache"

// LargestCached lists the n files holding the most space in the cache,
// most first (cache.Cache.Largest): for a status page, not a hot path.
func (ctl CacheControl) LargestCached(n int) []cache.Usage { return ctl.c.cache.Largest(n) }
