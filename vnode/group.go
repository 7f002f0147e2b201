package vnode

import (
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// group commits read-write transactions together: the calls that arrive
// while a commit is under way all run in the next one, as one bbolt
// transaction, so N concurrent changes cost one durable commit (two
// fdatasyncs) instead of N. It waits for nobody: a lone call commits at
// once, as before. (Group commit, as databases have done since IMS Fast
// Path; bbolt's own Batch instead waits a fixed delay for company.)
//
// A call's function may run more than once, in a transaction that is then
// rolled back: it must set what it reports afresh on every run, never add
// to it.
type group struct {
	db *bolt.DB

	mu      sync.Mutex
	queue   []*groupCall
	running bool

	commits atomic.Int64 // bbolt transactions committed or tried, for tests
}

type groupCall struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// update runs fn in a read-write transaction that is durable when update
// returns nil.
func (g *group) update(fn func(*bolt.Tx) error) error {
	c := &groupCall{fn: fn, done: make(chan error, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	lead := !g.running
	g.running = true
	g.mu.Unlock()
	if lead {
		g.commitQueued()
	}
	return <-c.done
}

// commitQueued commits what is queued, once. What came meanwhile is the
// next leader's, a goroutine of its own, so that the caller who led goes
// back with its answer rather than commit for others.
func (g *group) commitQueued() {
	g.mu.Lock()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()
	g.commit(batch)
	g.mu.Lock()
	more := len(g.queue) > 0
	g.running = more
	g.mu.Unlock()
	if more {
		go g.commitQueued()
	}
}

// commit runs batch as one transaction. A call whose function fails gets
// the answer of a transaction of its own (that failure may have been
// caused by a call before it in the batch); the others are committed
// again without it. If the commit itself fails, each call is tried alone.
func (g *group) commit(batch []*groupCall) {
	switch len(batch) {
	case 0:
		return
	case 1:
		batch[0].done <- g.updateOne(batch[0].fn)
		return
	}
	failed := -1
	g.commits.Add(1)
	err := g.db.Update(func(tx *bolt.Tx) error {
		for i, c := range batch {
			if err := c.fn(tx); err != nil {
				failed = i
				return err
			}
		}
		return nil
	})
	switch {
	case err == nil:
		for _, c := range batch {
			c.done <- nil
		}
	case failed < 0:
		for _, c := range batch {
			c.done <- g.updateOne(c.fn)
		}
	default:
		batch[failed].done <- g.updateOne(batch[failed].fn)
		g.commit(append(batch[:failed:failed], batch[failed+1:]...))
	}
}

func (g *group) updateOne(fn func(*bolt.Tx) error) error {
	g.commits.Add(1)
	return g.db.Update(fn)
}
