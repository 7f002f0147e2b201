package client

import (
	"path"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/node"
)

// LargestCached lists the n files holding the most space in the cache,
// most first (cache.Cache.Largest): for a status page, not a hot path.
func (ctl CacheControl) LargestCached(n int) []cache.Usage { return ctl.c.cache.Largest(n) }

// Paths names files by where the client's tree shows them ("/a/b"), by
// the directory entries it holds now: for display, as a status page's,
// of files no kernel holds an inode of (fetched by a warmup). A file the
// client has no entry of, or no way up from to the root, is left out.
// Each level up looks at every directory held, once for all of fids.
func (ctl CacheControl) Paths(fids []node.FID) map[node.FID]string {
	c := ctl.c
	root := c.root
	out := map[node.FID]string{}
	if root == nil {
		return out
	}
	c.volMu.Lock()
	volRoots := map[node.FID]string{} // a volume's root → the volume's name
	for name, v := range c.vols {
		volRoots[v.Root.ToFID()] = name
	}
	c.volMu.Unlock()
	c.nodesMu.Lock()
	all := make([]*Node, 0, len(c.nodes))
	for _, n := range c.nodes {
		all = append(all, n)
	}
	c.nodesMu.Unlock()
	var dirs []*Node
	for _, n := range all {
		n.mu.Lock()
		if n.dents != nil || n.st.Type == node.TypeMountPoint {
			dirs = append(dirs, n)
		}
		n.mu.Unlock()
	}

	// level holds, by the FID reached, the files asked for below it.
	type up struct {
		file node.FID // the file asked for
		tail string   // its path below the level's FID
	}
	level := map[node.FID][]up{}
	for _, f := range fids {
		level[f] = append(level[f], up{f, ""})
	}
	for depth := 0; depth < 256 && len(level) > 0; depth++ {
		next := map[node.FID][]up{}
		found := func(to node.FID, name string, ups []up) {
			for _, u := range ups {
				next[to] = append(next[to], up{u.file, path.Join(name, u.tail)})
			}
		}
		for f, ups := range level {
			if f == root.fid {
				for _, u := range ups {
					out[u.file] = "/" + u.tail
				}
				delete(level, f)
			}
		}
		for _, d := range dirs {
			d.mu.Lock()
			if d.dents != nil {
				for name, e := range d.dents.names {
					if ups, ok := level[e.fid]; ok {
						found(d.fid, name, ups)
						delete(level, e.fid)
					}
				}
			}
			// A volume's root is shown where a mount point leads to it.
			if d.st.Type == node.TypeMountPoint {
				vol, _, _ := node.MountTarget(d.st.Target)
				for f, ups := range level {
					if name := volRoots[f]; name == vol || name == vol+node.ReadOnlySuffix {
						next[d.fid] = append(next[d.fid], ups...)
						delete(level, f)
					}
				}
			}
			d.mu.Unlock()
		}
		level = next
	}
	return out
}
