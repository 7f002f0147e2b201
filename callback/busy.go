package callback

import "github.com/hoardfs/hoard/node"

// A FID is busy while a change to it, or to the namespace under it, is
// under way, from before its recall until the change is acknowledged: no
// delegation on it is granted meanwhile. A directory delegated then could
// have a name added behind its holder's listing; a file delegated while a
// change may remove it could only be recalled once it is gone, and its
// holder's writes, acknowledged by close, would be refused.

// BeginChange marks fids busy until EndChange; changes may overlap, and
// each counts.
func (s *Server) BeginChange(fids []node.FID) {
	for _, f := range fids {
		s.busy[f]++
	}
}

// EndChange undoes one BeginChange of fids.
func (s *Server) EndChange(fids []node.FID) {
	for _, f := range fids {
		if s.busy[f]--; s.busy[f] <= 0 {
			delete(s.busy, f)
		}
	}
}
