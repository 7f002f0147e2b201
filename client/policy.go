package client

import (
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/hoardfs/hoard/node"
)

// Selective caching (after Improving AFS Performance via Selective
// Caching): a file's contents go through the chunk
// cache, or bypass it, straight from the network to the reader. Decided
// per file when it is opened, first rule that speaks wins:
//
//  1. an override set on the file, or else on the directory it is opened
//     in (`hoard cache policy`), kept in the cache index across eviction
//     and restarts;
//  2. the name: "++name" is cached, "__name" bypassed;
//  3. the volume: one named "__something" bypasses;
//  4. the size threshold (Options.BypassThreshold), when set;
//  5. auto: behaviour. A large file that fits in the cache's free space is
//     cached; otherwise one read once, sequentially, end to end is not
//     admitted until it is opened again within the ghost window, and a
//     random read admits it at once.

// Policy values of an override.
const (
	PolicyCache  = "cache"
	PolicyBypass = "bypass"
	PolicyAuto   = "auto"
)

// policyKey is the cache-index field that holds an override.
const policyKey = "mode"

// Decision is the policy in force for a file and why.
type Decision struct {
	Bypass bool
	// Probation: auto chose bypass for a large file seen for the first
	// time; a random read turns it into a cached file.
	Probation bool
	Why       string
}

func (d Decision) String() string {
	mode := PolicyCache
	if d.Bypass {
		mode = PolicyBypass
	}
	return mode + " (" + d.Why + ")"
}

// ghosts remembers large files read once, so that a second use within the
// window admits them (a bounded list: the oldest are forgotten first).
type ghosts struct {
	mu     sync.Mutex
	seen   map[node.FID]time.Time
	order  []node.FID
	max    int
	window time.Duration
}

func newGhosts(max int, window time.Duration) *ghosts {
	return &ghosts{seen: map[node.FID]time.Time{}, max: max, window: window}
}

// use reports whether f was used within the window, and with record
// counts this as a use.
func (g *ghosts) use(f node.FID, now time.Time, record bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.seen[f]
	recent := ok && now.Sub(t) <= g.window
	if !record {
		return recent
	}
	if !ok {
		g.order = append(g.order, f)
		for len(g.order) > g.max {
			delete(g.seen, g.order[0])
			g.order = g.order[1:]
		}
	}
	g.seen[f] = now
	return recent
}

// decide picks the policy for file n, opened as base in directory parent
// (nil when unknown); with record the open counts as a use for auto.
func (c *Client) decide(n *Node, parent *Node, base string, record bool) Decision {
	if m := n.entry.Policy(policyKey); m != "" && m != PolicyAuto {
		return Decision{Bypass: m == PolicyBypass, Why: "override on the file"}
	}
	if parent != nil {
		if m := c.cache.Entry(parent.fid).Policy(policyKey); m != "" && m != PolicyAuto {
			return Decision{Bypass: m == PolicyBypass, Why: "override on its directory"}
		}
	}
	switch {
	case strings.HasPrefix(base, "++"):
		return Decision{Why: "name starts with ++"}
	case strings.HasPrefix(base, "__"):
		return Decision{Bypass: true, Why: "name starts with __"}
	}
	if v := c.volumeName(n.fid.Volume); strings.HasPrefix(v, "__") {
		return Decision{Bypass: true, Why: fmt.Sprintf("volume %s", v)}
	}
	st := n.status()
	if t := c.opts.BypassThreshold; t > 0 {
		if int64(st.Size) >= t {
			return Decision{Bypass: true, Why: fmt.Sprintf("size %d ≥ threshold %d", st.Size, t)}
		}
		return Decision{Why: fmt.Sprintf("size %d < threshold %d", st.Size, t)}
	}
	if int64(st.Size) < c.opts.AutoMin {
		return Decision{Why: "auto: small file"}
	}
	if c.cache.Size()-c.cache.Used() >= int64(st.Size) {
		// Admission control is for what admitting would evict: with
		// room to spare, the first read caches the file, and the next
		// one need not fetch it again.
		return Decision{Why: "auto: fits without evicting"}
	}
	if c.ghosts.use(n.fid, time.Now(), record) {
		return Decision{Why: "auto: used again within the window"}
	}
	if len(n.entry.Missing(0, int64(st.Size))) < int(c.chunks(st.Size)) {
		return Decision{Why: "auto: partly cached already"}
	}
	return Decision{Bypass: true, Probation: true, Why: "auto: large file, first use"}
}

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

// PolicyOf reports the policy that an open of name would use now, and
// why. For a directory it reports the override its files inherit.
func (c *Client) PolicyOf(name string) (Decision, error) {
	n, err := c.resolve(name, true)
	if err != nil {
		return Decision{}, errOf("policy", name, err)
	}
	parent, base := c.parentOf(name)
	return c.PolicyAt(n, parent, base)
}

// PolicyAt is PolicyOf for a resolved node opened as base in parent.
func (c *Client) PolicyAt(n *Node, parent *Node, base string) (Decision, error) {
	st, err := c.fresh(n)
	if err != nil {
		return Decision{}, err
	}
	if st.Type == node.TypeDir {
		m := c.cache.Entry(n.fid).Policy(policyKey)
		if m == "" || m == PolicyAuto {
			return Decision{Why: "no override on the directory: its files decide by name, volume, size and use"}, nil
		}
		return Decision{Bypass: m == PolicyBypass, Why: "override on the directory, inherited by its files"}, nil
	}
	if n.entry == nil {
		return Decision{}, fmt.Errorf("policy: %v has no cache entry", n.fid)
	}
	return c.decide(n, parent, base, false), nil
}

// SetPolicy sets the override of name (cache, bypass, or auto to remove
// it); with recursive, of everything under a directory too. A file that
// turns to bypass first stores its local writes, then drops its chunks.
func (c *Client) SetPolicy(name, mode string, recursive bool) error {
	if mode != PolicyCache && mode != PolicyBypass && mode != PolicyAuto {
		return fmt.Errorf("policy %q: want cache, bypass or auto", mode)
	}
	n, err := c.resolve(name, true)
	if err != nil {
		return errOf("policy", name, err)
	}
	return errOf("policy", name, c.SetPolicyAt(n, mode, recursive))
}

// SetPolicyAt is SetPolicy for a resolved node.
func (c *Client) SetPolicyAt(n *Node, mode string, recursive bool) error {
	st, err := c.fresh(n)
	if err != nil {
		return err
	}
	value := mode
	if mode == PolicyAuto {
		value = ""
	}
	e := c.cache.Entry(n.fid)
	if err := e.SetPolicy(policyKey, value); err != nil {
		return err
	}
	if st.Type == node.TypeFile && mode == PolicyBypass {
		n.wmu.Lock()
		err := n.storeLocked(true)
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
	ents, _, err := c.readDir(n)
	if err != nil {
		return err
	}
	for _, ent := range ents {
		if ent.Type != node.TypeFile && ent.Type != node.TypeDir {
			continue
		}
		child, err := c.lookup(n, ent.Name)
		if err != nil {
			return err
		}
		if err := c.SetPolicyAt(child, mode, true); err != nil {
			return err
		}
	}
	return nil
}

// parentOf resolves the directory name is in, best effort.
func (c *Client) parentOf(name string) (*Node, string) {
	dir, base, err := c.resolveParent(name)
	if err != nil {
		return nil, path.Base(name)
	}
	return dir, base
}
