package client

import (
	"slices"

	"github.com/hoardfs/hoard/node"
)

// wholeVolumes adds to broken FIDs the nodes of the volumes among them: a
// read-only copy's site keeps one promise per client on the whole copy,
// on its vnode 0, and breaks it when a release replaces the copy.
func (c *Client) wholeVolumes(fids []node.FID) []node.FID {
	var vols []uint64
	for _, f := range fids {
		if f.Vnode == 0 {
			vols = append(vols, f.Volume)
		}
	}
	if len(vols) == 0 {
		return fids
	}
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	for f := range c.nodes {
		if slices.Contains(vols, f.Volume) {
			fids = append(fids, f)
		}
	}
	return fids
}
