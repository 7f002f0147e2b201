package callback

import (
	"time"

	"github.com/hoardfs/hoard/node"
)

// Directory delegations: a client holding a write delegation on a
// directory makes files in it on its own and tells the server later. It
// asks for one on the chance of a create, so one is given only where it
// costs nobody anything.

// DirPolicy says which directories may be delegated.
type DirPolicy string

const (
	// DirPrivate: only a directory no other client holds a promise on (a
	// build's output, a scratch or mail directory).
	DirPrivate DirPolicy = "private"
	// DirAny: any directory, breaking the promises others hold on it.
	DirAny DirPolicy = "any"
	// DirNone (or any other value): no directory.
	DirNone DirPolicy = "none"
)

// Delegates reports whether an open by id (0: no session) of a file of
// type t, for writing or not, asking for the delegation alone or not, may
// come with a delegation at all: on a regular file, and on a directory
// when a write delegation alone is asked for (to make files in it; any
// other open of a directory is a read of it).
func Delegates(id ClientID, t node.Type, write, only bool) bool {
	return id != 0 && (t == node.TypeFile || t == node.TypeDir && write && only)
}

// DirDelegable reports whether id may be given a write delegation on
// directory dir now, or go on with the one it holds: never while a change
// is under way in it (busy.go), which could add a name behind the holder's
// listing; a new one only if no other client's is recalled for it
// (Delegable) and the policy allows: under DirPrivate, not while another
// client has the directory cached (it would lose its promise, and a
// kernel its names).
func (s *Server) DirDelegable(id ClientID, dir node.FID, now time.Time) bool {
	if s.busy[dir] > 0 || s.quiet[dir.Volume] {
		return false
	}
	if kind, _ := s.Delegation(id, dir); kind == DelegWrite {
		return true
	}
	if !s.Delegable(id, dir, true, now) {
		return false
	}
	switch s.cfg.Dirs {
	case DirAny:
		return true
	case DirPrivate:
		return !s.othersCache(id, dir)
	}
	return false
}

// othersCache reports whether a client other than id holds a promise on
// fid.
func (s *Server) othersCache(id ClientID, fid node.FID) bool {
	for other := range s.byFID[fid] {
		if other != id {
			return true
		}
	}
	return false
}
