package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/datapath"
)

// fetchCall is one chunk fetch in flight; concurrent readers and read-ahead
// of the same chunk share it.
type fetchCall struct {
	done chan struct{}
	// data is set when the chunk could not be cached (no evictable space):
	// the waiting readers are served from it instead.
	data []byte
	err  error
}

// fetch brings chunks idxs of n into the cache, one RPC per chunk in
// parallel. With wait it returns once all are in, along with any chunks
// that had to be kept in memory; without, it returns at once (read-ahead).
func (n *Node) fetch(idxs []int64, wait bool) (map[int64][]byte, error) {
	type pendingCall struct {
		idx  int64
		call *fetchCall
	}
	var calls []pendingCall
	n.mu.Lock()
	if n.inflight == nil {
		n.inflight = map[int64]*fetchCall{}
	}
	for _, idx := range idxs {
		call := n.inflight[idx]
		if call == nil {
			if n.entry.Present(idx) {
				continue
			}
			call = &fetchCall{done: make(chan struct{})}
			n.inflight[idx] = call
			go n.fetchOne(idx, call)
		}
		calls = append(calls, pendingCall{idx, call})
	}
	n.mu.Unlock()
	if !wait {
		return nil, nil
	}
	var mem map[int64][]byte
	var firstErr error
	for _, p := range calls {
		<-p.call.done
		switch {
		case p.call.err != nil:
			if firstErr == nil {
				firstErr = p.call.err
			}
		case p.call.data != nil:
			if mem == nil {
				mem = map[int64][]byte{}
			}
			mem[p.idx] = p.call.data
		}
	}
	return mem, firstErr
}

func (n *Node) fetchOne(idx int64, call *fetchCall) {
	c := n.c
	defer func() {
		n.mu.Lock()
		delete(n.inflight, idx)
		n.mu.Unlock()
		close(call.done)
	}()
	buf, dv, err := n.fetchChunk(idx)
	if err != nil {
		call.err = err
		return
	}
	if len(buf) == 0 {
		return // past the end: nothing to cache
	}
	switch err := n.entry.Admit(idx, dv, buf); {
	case errors.Is(err, cache.ErrNoSpace):
		c.cache.CountBypassed(1)
		call.data = buf
	case err != nil:
		call.err = err
	case c.cache.Dir() != "":
		datapath.PutBuffer(buf) // written out; a memory cache keeps it
	}
}

// fetchChunk fetches chunk idx into memory, learning the status and
// promise that come with it; the data is of version dv, whole.
func (n *Node) fetchChunk(idx int64) (buf []byte, dv uint64, err error) {
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
	cs := c.cache.ChunkSize()
	pieces := 0
	t := c.begin()
	defer c.end(t)
	err = c.callData(func(ctx context.Context) error {
		buf, pieces = nil, 0
		st, ttl, err := c.data.Load().Fetch(ctx, n.fid, idx*cs, cs, int(cs), func(off int64, pdv uint64, data []byte) error {
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
			_, err = c.learn(t, st, ttl)
		}
		return err
	})
	if err == nil {
		c.cache.CountFetched(int64(len(buf)))
	}
	return buf, dv, err
}
