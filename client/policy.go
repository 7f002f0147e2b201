package client

import (
	"fmt"
	"github.com/hoardfs/hoard/client/user"
	"time"

	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/node"
)

// decide gathers the facts the caching policy of file n looks at, opened
// as base in directory parent (nil when unknown); with record the open
// counts as a use for auto.
func (c *Client) decide(n *Node, parent *Node, base string, record bool) policy.Decision {
	st := n.status()
	f := policy.Facts{
		FileOverride: n.entry.Policy(policyKey),
		Name:         base,
		Volume:       c.volumeName(n.fid.Volume),
		Size:         int64(st.Size),
		Threshold:    c.opts.BypassThreshold,
		AutoMin:      c.opts.AutoMin,
		Free:         c.cache.Size() - c.cache.Used(),
		UsedAgain:    func() bool { return c.ghosts.Use(n.fid, time.Now(), record) },
		PartlyCached: func() bool { return len(n.entry.Missing(0, int64(st.Size))) < int(c.chunks(st.Size)) },
	}
	if parent != nil {
		f.DirOverride = c.cache.Entry(parent.fid).Policy(policyKey)
	}
	return policy.Decide(f)
}

// policyKey is the cache-index field that holds an override.
const policyKey = "mode"

func (c *Client) chunks(size uint64) int64 {
	cs := c.cache.ChunkSize()
	return (int64(size) + cs - 1) / cs
}

// volumeName is the name of a volume this client has seen.
func (c *Client) volumeName(id uint64) string {
	c.volMu.Lock()
	defer c.volMu.Unlock()
	for name, v := range c.vols {
		if v.Id == id {
			return name
		}
	}
	return ""
}

// policyAt is the policy an open of n as base in parent would use now
// for u, and why; a directory's is the override its files inherit.
func (c *Client) policyAt(n *Node, parent *Node, base string, u user.User) (policy.Decision, error) {
	st, err := c.fresh(n, u)
	if err != nil {
		return policy.Decision{}, err
	}
	if st.Type == node.TypeDir {
		return policy.ForDirectory(c.cache.Entry(n.fid).Policy(policyKey)), nil
	}
	if n.entry == nil {
		return policy.Decision{}, fmt.Errorf("policy: %v has no cache entry", n.fid)
	}
	return c.decide(n, parent, base, false), nil
}

// setPolicyAt sets n's override (cache, bypass, or auto to remove it)
// for u; with recursive, of everything under a directory too. A file
// that turns to bypass first stores its local writes, then drops its
// chunks.
func (c *Client) setPolicyAt(n *Node, mode string, recursive bool, u user.User) error {
	st, err := c.fresh(n, u)
	if err != nil {
		return err
	}
	value := mode
	if mode == policy.Auto {
		value = ""
	}
	e := c.cache.Entry(n.fid)
	if err := e.SetPolicy(policyKey, value); err != nil {
		return err
	}
	if st.Type == node.TypeFile && mode == policy.Bypass {
		n.wmu.Lock()
		err := n.storeLocked(true, u)
		if err == nil {
			err = e.Invalidate()
		}
		n.wmu.Unlock()
		if err != nil {
			return err
		}
	}
	if st.Type != node.TypeDir || !recursive {
		return nil
	}
	ents, _, err := c.readDir(n, u)
	if err != nil {
		return err
	}
	for _, ent := range ents {
		if ent.Type != node.TypeFile && ent.Type != node.TypeDir {
			continue
		}
		child, err := c.lookup(n, ent.Name, u)
		if err != nil {
			return err
		}
		if err := c.setPolicyAt(child, mode, true, u); err != nil {
			return err
		}
	}
	return nil
}
