package client

import (
	"context"
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/client/site"
	"github.com/hoardfs/hoard/client/user"
	"strconv"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/datapath"
	"golang.org/x/sync/singleflight"
)

// fetch brings chunks idxs of n into the cache, one RPC per chunk in
// parallel, as u; concurrent readers and read-ahead of the same chunk
// share one fetch (n.fetches: a reader may wait for another user's, of
// bytes its own rights let it read). With wait it returns once all are
// in, along with any chunks that had to be kept in memory; without, it
// returns at once (read-ahead).
func (n *Node) fetch(idxs []int64, wait bool, u user.User) (map[int64][]byte, error) {
	type pending struct {
		idx int64
		ch  <-chan singleflight.Result
	}
	var calls []pending
	for _, idx := range idxs {
		if n.entry.Present(idx) {
			continue
		}
		ch := n.fetches.DoChan(strconv.FormatInt(idx, 10), func() (any, error) { return n.fetchOne(idx, u) })
		calls = append(calls, pending{idx, ch})
	}
	if !wait {
		return nil, nil
	}
	var mem map[int64][]byte
	var firstErr error
	for _, p := range calls {
		r := <-p.ch
		if r.Shared && Errno(r.Err) == syscall.EACCES {
			// Maybe another user's fetch, refused that user: asked again
			// as u, whose own rights decide.
			v, err := n.fetchOne(p.idx, u)
			r = singleflight.Result{Val: v, Err: err}
		}
		data, _ := r.Val.([]byte)
		switch {
		case r.Err != nil:
			if firstErr == nil {
				firstErr = r.Err
			}
		case data != nil:
			if mem == nil {
				mem = map[int64][]byte{}
			}
			mem[p.idx] = data
		}
	}
	return mem, firstErr
}

// fetchOne fetches chunk idx into the cache, as u. It returns the chunk's
// bytes only when they could not be cached (no evictable space): the
// waiting readers are served from them instead.
func (n *Node) fetchOne(idx int64, u user.User) ([]byte, error) {
	c := n.c
	n.fetching.Add(1)
	defer n.fetching.Add(-1)
	if n.entry.Present(idx) {
		return nil, nil // a fetch that ended as this one was asked for
	}
	buf, dv, err := n.fetchChunk(idx, u)
	if err != nil || len(buf) == 0 {
		return nil, err // past the end: nothing to cache
	}
	switch err := n.entry.Admit(idx, dv, buf); {
	case errors.Is(err, cache.ErrNoSpace):
		c.cache.CountBypassed(1)
		return buf, nil
	case err != nil:
		return nil, err
	case c.cache.Dir() != "":
		datapath.PutBuffer(buf) // written out; a memory cache keeps it
	}
	return nil, nil
}

// fetchChunk fetches chunk idx into memory as u, learning the status and
// promise that come with it; the data is of version dv, whole. A chunk
// of a volume that moved, or of a read-only copy whose site stopped
// answering, is fetched again where the volume is now.
func (n *Node) fetchChunk(idx int64, u user.User) (buf []byte, dv uint64, err error) {
	err = n.onServer(false, func(at *site.Site) (err error) {
		buf, dv, err = n.fetchChunkAt(at, idx, u)
		return err
	})
	return buf, dv, err
}

// fetchChunkAt is fetchChunk at site at.
func (n *Node) fetchChunkAt(at *site.Site, idx int64, u user.User) (buf []byte, dv uint64, err error) {
	c := n.c
	if err := c.settleFor(n); err != nil {
		return nil, 0, err
	}
	select {
	case c.fetchSem <- struct{}{}:
	case <-c.ctx.Done():
		return nil, 0, c.ctx.Err()
	}
	defer func() { <-c.fetchSem }()
	defer c.counters.fetchTime.Since(time.Now())
	cs := c.cache.ChunkSize()
	pieces := 0
	t := at.Begin()
	defer t.End()
	err = at.As(u.Token()).CallData(func(ctx context.Context) error {
		buf, pieces = nil, 0
		st, ttl, err := at.Conn.Data().Fetch(ctx, n.fid, idx*cs, cs, int(cs), func(off int64, pdv uint64, data []byte) error {
			if pieces > 0 && pdv != dv {
				return cache.ErrStale
			}
			if off != idx*cs+int64(len(buf)) || len(buf)+len(data) > int(cs) {
				return fmt.Errorf("protocol: fetch piece at %d of %d bytes does not continue chunk %d", off, len(data), idx)
			}
			dv, pieces = pdv, pieces+1
			if buf == nil {
				buf = data // the usual case, one piece: no copy
			} else {
				buf = append(buf, data...)
			}
			return nil
		})
		if err == nil {
			_, err = c.learn(t, st, ttl, u)
		}
		return err
	})
	if err == nil {
		c.cache.CountFetched(int64(len(buf)))
	}
	return buf, dv, err
}
