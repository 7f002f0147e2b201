package client

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoardfs/hoard/client/bypass"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/datapath"
	"github.com/hoardfs/hoard/node"
)

// bypassClient is what an open that bypasses the cache (package bypass)
// needs of the client, for the open's file.
type bypassClient struct{ f *File }

func (f *File) openBypass(probation bool) *bypass.Open {
	c := f.n.c
	return bypass.New(bypassClient{f}, bypass.Config{Name: f.name, FID: f.n.fid, ChunkSize: c.cache.ChunkSize(),
		Probation: probation, Timeout: c.opts.RPCTimeout, Log: c.log})
}

func (b bypassClient) Status() (node.Status, error) { return b.f.n.c.fresh(b.f.n, b.f.u) }

func (b bypassClient) FetchChunk(idx int64) ([]byte, uint64, error) {
	return b.f.n.fetchChunk(idx, b.f.u)
}

func (b bypassClient) Store(args datapath.StoreArgs) error {
	return b.f.n.c.storeData(b.f.n.at(), args, b.f.u, nil)
}

func (b bypassClient) Session() string { return b.f.n.at().Conn.Session() }

func (b bypassClient) AwaitSession(deadline time.Time) string {
	return b.f.n.at().Conn.AwaitSession("", deadline)
}

func (b bypassClient) KeepLost(ranges [][2]int64, read func(p []byte, off int64) error, size int64, trunc *uint64, cause error) error {
	c, name := b.f.n.c, b.f.name
	where, err := c.saveLost(name, b.f.n.fid, ranges, read, size, trunc, cause)
	if err != nil {
		c.log.Error("undelivered writes could not be saved", "path", name, "err", err)
	}
	return &lost.Error{Path: name, Cause: cause, Kept: where}
}

func (b bypassClient) Unpublished(o *bypass.Open, pending bool) {
	if pending {
		b.f.n.c.unpublished.add(b.f.n, o)
	} else {
		b.f.n.c.unpublished.remove(b.f.n, o)
	}
}

func (b bypassClient) Missed() { b.f.n.c.cache.CountMiss(1) }

// stageIndex holds, by node, the bypassed opens with writes not yet
// published (Client.unpublished): a read of the node elsewhere in this
// client publishes them first, so that the client reads its own writes.
type stageIndex struct {
	mu sync.Mutex
	m  map[*Node]map[*bypass.Open]bool
	n  atomic.Int64
}

func (x *stageIndex) add(n *Node, b *bypass.Open) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m == nil {
		x.m = map[*Node]map[*bypass.Open]bool{}
	}
	if x.m[n] == nil {
		x.m[n] = map[*bypass.Open]bool{}
	}
	x.m[n][b] = true
	x.n.Add(1)
}

func (x *stageIndex) remove(n *Node, b *bypass.Open) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m[n][b] {
		delete(x.m[n], b)
		if len(x.m[n]) == 0 {
			delete(x.m, n)
		}
		x.n.Add(-1)
	}
}

// publishFor publishes the writes other opens of n left unpublished; their
// own Sync or Close reports any failure.
func (c *Client) publishFor(n *Node, self *bypass.Open) {
	x := &c.unpublished
	if x.n.Load() == 0 {
		return
	}
	x.mu.Lock()
	var bs []*bypass.Open
	for b := range x.m[n] {
		if b != self {
			bs = append(bs, b)
		}
	}
	x.mu.Unlock()
	for _, b := range bs {
		b.Publish()
	}
}
