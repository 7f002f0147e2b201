package callback

import (
	"cmp"
	"slices"

	"github.com/hoardfs/hoard/node"
)

// While a volume moves to another server, the server it leaves grants no
// promise and no delegation on it: each one granted would have to be
// broken by a server that no longer holds the volume. Quiesce stops the
// grants and says what is held, for the caller to break and recall;
// Resume (an abandoned move) grants again.

// Quiesce stops granting on volume and returns the FIDs of it on which a
// promise or a delegation is held, in order.
func (s *Server) Quiesce(volume uint64) []node.FID {
	if s.quiet == nil {
		s.quiet = map[uint64]bool{}
	}
	s.quiet[volume] = true
	set := map[node.FID]bool{}
	for fid := range s.byFID {
		if fid.Volume == volume {
			set[fid] = true
		}
	}
	for fid := range s.delegsByFID {
		if fid.Volume == volume {
			set[fid] = true
		}
	}
	out := make([]node.FID, 0, len(set))
	for fid := range set {
		out = append(out, fid)
	}
	slices.SortFunc(out, func(a, b node.FID) int {
		if a.Vnode != b.Vnode {
			return cmp.Compare(a.Vnode, b.Vnode)
		}
		return cmp.Compare(a.Unique, b.Unique)
	})
	return out
}

// Resume grants on volume again.
func (s *Server) Resume(volume uint64) { delete(s.quiet, volume) }
