package client

import (
	"errors"
	"github.com/hoardfs/hoard/client/user"
	"time"

	"github.com/hoardfs/hoard/client/writeback"
)

// writeBack is a file node's writes not yet stored (Node).
type writeBack struct {
	// dirtyState is the write delegation the unstored writes were made
	// under (0: none); the store names it. dirtySince is when the first of
	// them was made, for the flusher's age bound.
	dirtyState uint64
	dirtySince time.Time
	// writer made the last unstored write (wrote: one was made since the
	// client started): a store in the background is made as that user.
	writer user.User
	wrote  bool
	// lostErr: the flusher or a recall could not deliver this file's
	// writes and kept them in lost/; the next Sync or Close reports it.
	lostErr error
	// losses counts the times unstored writes were moved to lost/, and
	// lastLoss says why: a flush or sync that waited while another one
	// lost the writes it was to store reports that too (two closes of
	// one open file, say, after a fork).
	losses   uint64
	lastLoss error
}

// The write-back flusher is package writeback; dirtyNode is a file node
// as it sees one.
type dirtyNode struct{ n *Node }

func (d dirtyNode) Dirty() (int64, time.Time, bool) {
	n := d.n
	n.mu.Lock()
	since, writing := n.dirtySince, n.opens.w > 0
	if by := n.writer.StoreBy(); n.wrote && !by.IsZero() && !since.IsZero() {
		// Stored before the writer's token expires, which the age bound
		// alone would not: the server refuses it after.
		since = minTime(since, by.Add(-n.c.opts.FlushAge))
	}
	n.mu.Unlock()
	return n.entry.DirtyBytes(), since, writing
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (d dirtyNode) Store(try bool) error {
	n := d.n
	if !try {
		n.wmu.Lock()
	} else if !n.wmu.TryLock() {
		return writeback.ErrBusy
	}
	err := n.c.storeBack(n, true, n.c.writerOf(n))
	n.wmu.Unlock()
	if err != nil && !kept(err) {
		n.c.log.Debug("flusher: store failed; will retry", "fid", n.fid, "err", err)
	}
	return err
}

// Flusher defaults.
const (
	defaultFlushAge    = 30 * time.Second
	defaultFlushWindow = 16
)

func newFlusher(c *Client) *writeback.Flusher[dirtyNode] {
	return writeback.New[dirtyNode](writeback.Config{
		Age:    c.opts.FlushAge,
		Window: defaultFlushWindow,
		// hidirty = a quarter of the cache + 20 chunks.
		Hi:         func() int64 { return c.cache.Size()/4 + 20*c.cache.ChunkSize() },
		DirtyBytes: c.cache.DirtyBytes,
		Stored:     func(b int64) { c.counters.flushed.Add(b) },
	})
}

// flushAll stores every dirty file, at Close; what could not be stored is
// kept in lost/ and reported.
func (c *Client) flushAll() error {
	c.flusher.Halt()
	c.flusher.Drain(dirtyNode{})
	var errs []error
	removes := 0
	for _, d := range c.flusher.Files() {
		n := d.n
		if n.removedIn.Load() != nil {
			removes++ // no data: the file stays at the server
			continue
		}
		n.wmu.Lock()
		name := n.entry.Policy("path")
		if name == "" {
			name = "fid " + n.fid.String()
		}
		errs = append(errs, c.keepLost(n, name, errors.New("not stored when the client closed (server unreachable)")))
		n.wmu.Unlock()
	}
	if removes > 0 {
		c.log.Warn("files removed here are still at the server: it was unreachable when the client closed", "files", removes)
	}
	return errors.Join(errs...)
}
