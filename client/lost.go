package client

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/hoardfs/hoard/client/lost"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// keepLost saves n's undelivered writes under the lost directory, drops
// them from the cache (they no longer describe anything the server will
// have) and returns the error for the application: EIO, saying where the
// data went.
func (c *Client) keepLost(n *Node, name string, cause error) error {
	if pb.Errno(cause) == syscall.EDQUOT {
		c.quotaRefused(n.fid.Volume)
	}
	var ranges [][2]int64
	for _, r := range n.entry.Dirty() {
		ranges = append(ranges, [2]int64{r.Off, r.Len})
	}
	est, _ := n.entry.Status()
	var trunc *uint64
	if cut, ok := n.entry.Cut(); ok {
		c := uint64(cut)
		trunc = &c
	}
	read := func(p []byte, off int64) error {
		k, err := n.entry.ReadAt(p, off)
		if k < len(p) {
			return fmt.Errorf("reading back local data at %d: %v", off, err)
		}
		return nil
	}
	dir, err := c.saveLost(name, n.fid, ranges, read, int64(est.Size), trunc, cause)
	if err != nil {
		// Could not save it elsewhere: keep it dirty in the cache, where
		// the next store of this file will carry it.
		c.log.Error("undelivered writes could not be saved; kept in the cache", "path", name, "err", err)
		return &lost.Error{Path: name, Cause: cause}
	}
	n.entry.Discard()
	n.valid.Store(false)
	c.stored(n)
	lerr := &lost.Error{Path: name, Cause: cause, Kept: dir}
	n.mu.Lock()
	n.losses++
	n.lastLoss = lerr
	n.madeLost = nil
	n.mu.Unlock()
	return lerr
}

// saveLost keeps writes under the lost directory (package lost).
func (c *Client) saveLost(name string, fid node.FID, ranges [][2]int64, read func(p []byte, off int64) error, size int64, trunc *uint64, cause error) (string, error) {
	seal := func(f *os.File, name string) (io.WriterAt, bool, error) { return c.cache.Seal(f, name) }
	dir, err := lost.Save(c.opts.CacheDir, lost.Record{Path: name, FID: fid.String(), Ranges: ranges, Size: size, Truncate: trunc, Error: cause.Error()}, read, seal)
	if err == nil {
		c.counters.lost.Add(1)
		how := "kept locally"
		if c.cache.Encrypted() {
			how = "kept locally, encrypted with this mount's key: unreadable once it stops"
		}
		c.log.Error("writes could not be delivered to the server; "+how, "path", name, "kept", dir, "err", cause)
	}
	return dir, err
}

// recoverDirty deals with writes a crashed client left in the cache: they
// are based on versions nobody can vouch for any more, so they are not
// stored blindly but kept as lost data for the user to look at.
func (c *Client) recoverDirty() error {
	for _, fid := range c.cache.Entries() {
		e, ok := c.cache.Lookup(fid)
		if !ok || e.DirtyBytes() == 0 {
			continue
		}
		n := c.node(fid, c.sites.First())
		n.mu.Lock()
		n.entry = e
		n.mu.Unlock()
		name := e.Policy("path")
		if name == "" {
			name = "fid " + fid.String()
		}
		c.keepLost(n, name, fmt.Errorf("client stopped before storing them"))
	}
	return nil
}
