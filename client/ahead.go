package client

import (
	"github.com/hoardfs/hoard/client/listing"
	"github.com/hoardfs/hoard/client/user"
	"github.com/hoardfs/hoard/node"
)

// dirListing is a directory node's entries and read-ahead (Node).
type dirListing struct {
	// dents are the entries learnt at st.DataVersion; complete when they
	// are the whole directory (a readdir), so a miss is a negative answer.
	dents *listing.Listing
	// ahead is the read-ahead over the directory's files (dirAhead).
	ahead dirAhead
}

// Read-ahead across a directory's files. A program that reads a tree
// (find | xargs cat, tar, cp -r, grep -r) opens a directory's files in the
// order of its listing; when it does, the small files after the one it
// opens are fetched ahead, in the background, in a window that doubles
// with each open that keeps to the order, as a sequential reader of one
// file gets the chunks after the ones it reads. A cold tree of small
// files then costs a round trip per window rather than per file.

// dirAhead is a directory's read-ahead state (Node.mu).
type dirAhead struct {
	last   int // listing position of the last file opened for reading
	window int // files fetched ahead of it; 0 until an open keeps order
	// seen is the listing position up to which entries were looked at,
	// and ahead the positions of the files among them past last: an open
	// in order looks only past seen, so a pass over a listing looks at
	// each entry once, however wide the window.
	seen  int
	ahead []int
}

// maxAhead bounds the window, in files.
const maxAhead = 64

// readAheadIn notes an open for reading of the file named base in dir, by
// u, and fetches ahead the small files after it, as u, if the opens keep
// to the listing's order. (What u may not read the server refuses; what it
// fetched is served to others only as their own rights allow.)
func (c *Client) readAheadIn(dir *Node, base string, u user.User) {
	if !c.listed(dir) {
		return
	}
	dir.mu.Lock()
	d, ok := dir.dents.Get(base)
	if !ok || !dir.dents.IsComplete() {
		dir.mu.Unlock()
		return
	}
	next := dir.ahead.step(d.At, dir.dents.Order(), func(name string) (node.FID, bool) {
		e, ok := dir.dents.Get(name)
		return e.FID, ok && e.Type == node.TypeFile
	})
	dir.mu.Unlock()
	cs := c.cache.ChunkSize()
	for _, f := range next {
		c.nodesMu.Lock()
		n := c.nodes[f]
		c.nodesMu.Unlock()
		// Files whose status is known and current, of one chunk: the
		// next opens find them whole.
		if n == nil || !n.valid.Load() || n.entry == nil {
			continue
		}
		if st := n.status(); st.Size == 0 || int64(st.Size) > cs || n.entry.Present(0) {
			continue
		}
		n.fetch([]int64{0}, false, u)
	}
}

// step notes an open for reading of the entry at listing position at, and
// returns the files to fetch ahead of it: of the first window files among
// the 4×window entries after it, those no earlier step returned. file says
// whether a name is a file, and its FID.
func (a *dirAhead) step(at int, order []string, file func(string) (node.FID, bool)) []node.FID {
	if at > a.last && at <= a.last+max(a.window, 1)+1 {
		// In order, or a step past an entry that is not a file.
		a.window = min(max(2*a.window, 4), maxAhead)
		for len(a.ahead) > 0 && a.ahead[0] <= at {
			a.ahead = a.ahead[1:]
		}
	} else {
		a.window, a.seen, a.ahead = 0, 0, nil
	}
	a.last = at
	if a.window == 0 {
		return nil
	}
	var next []node.FID
	i := max(at+1, a.seen)
	for end := min(at+1+4*a.window, len(order)); i < end && len(a.ahead) < a.window; i++ {
		if f, ok := file(order[i]); ok {
			next = append(next, f)
			a.ahead = append(a.ahead, i)
		}
	}
	a.seen = i
	return next
}
