package client

import (
	"container/list"

	"github.com/hoardfs/hoard/node"
)

// dirListing is a directory node's entries and read-ahead (Node).
type dirListing struct {
	// dents are the entries learnt at st.DataVersion; complete when they
	// are the whole directory (a readdir), so a miss is a negative answer.
	dents *listing
	// ahead is the read-ahead over the directory's files (dirAhead).
	ahead dirAhead
}

// listing is what the client knows of a directory's entries at one
// DataVersion: the names it looked up, or, complete, every name in the
// server's order. Every operation on one name is O(1): a directory of
// 100,000 files is made, listed and emptied at the same cost per file as
// one of ten.
type listing struct {
	names map[string]dirent
	// order is the complete listing's names in the server's order, ""
	// where a name was removed (holes of them), until compacted.
	order    []string
	holes    int
	complete bool
}

type dirent struct {
	fid node.FID
	typ node.Type
	at  int // index in order, in a complete listing
}

// completeListing is the listing of a whole directory, es in order.
func completeListing(es []DirEntry) *listing {
	l := &listing{names: make(map[string]dirent, len(es)), order: make([]string, len(es)), complete: true}
	for i, e := range es {
		l.names[e.Name] = dirent{fid: e.FID, typ: e.Type, at: i}
		l.order[i] = e.Name
	}
	return l
}

// get is the entry name, if known; a nil listing knows nothing.
func (l *listing) get(name string) (dirent, bool) {
	if l == nil {
		return dirent{}, false
	}
	d, ok := l.names[name]
	return d, ok
}

// isComplete reports whether the listing has every name: a name it lacks
// does not exist.
func (l *listing) isComplete() bool { return l != nil && l.complete }

// add records name → fid, at the end of the order if new.
func (l *listing) add(name string, fid node.FID, typ node.Type) {
	d, ok := l.names[name]
	if !ok && l.complete {
		d.at = len(l.order)
		l.order = append(l.order, name)
	}
	d.fid, d.typ = fid, typ
	l.names[name] = d
}

// del forgets name, leaving a hole in the order that a compaction closes
// once holes are half of it.
func (l *listing) del(name string) {
	d, ok := l.names[name]
	if !ok {
		return
	}
	delete(l.names, name)
	if !l.complete {
		return
	}
	l.order[d.at] = ""
	if l.holes++; l.holes > len(l.order)/2 {
		l.compact()
	}
}

func (l *listing) compact() {
	order := make([]string, 0, len(l.names))
	for _, name := range l.order {
		if name != "" {
			d := l.names[name]
			d.at = len(order)
			l.names[name] = d
			order = append(order, name)
		}
	}
	l.order, l.holes = order, 0
}

// entries copies a complete listing out, in order.
func (l *listing) entries() []DirEntry {
	out := make([]DirEntry, 0, len(l.names))
	for _, name := range l.order {
		if name != "" {
			d := l.names[name]
			out = append(out, DirEntry{Name: name, Type: d.typ, FID: d.fid})
		}
	}
	return out
}

// madeList is the files made in a directory and not yet created at the
// server, and those removed from it here and not yet there, in the order
// it happened, which the settle keeps. Adding, finding and removing one
// is O(1).
type madeList struct {
	files list.List // of *madeFile
	at    map[node.FID]*list.Element
}

// madeFile is a file made in a directory and not yet created at the
// server, or (removed) one removed from it here and not yet there, by u.
type madeFile struct {
	name    string
	n       *Node
	removed bool
	u       User
}

func (m *madeList) len() int { return m.files.Len() }

func (m *madeList) push(name string, n *Node, removed bool, u User) {
	if m.at == nil {
		m.at = map[node.FID]*list.Element{}
	}
	m.at[n.fid] = m.files.PushBack(&madeFile{name: name, n: n, removed: removed, u: u})
}

// find is the made file fid, nil if there is none.
func (m *madeList) find(fid node.FID) *madeFile {
	if e := m.at[fid]; e != nil {
		return e.Value.(*madeFile)
	}
	return nil
}

func (m *madeList) remove(fid node.FID) {
	if e := m.at[fid]; e != nil {
		m.files.Remove(e)
		delete(m.at, fid)
	}
}

// first copies out the first k made files (all, if fewer), up to the
// first made by another user than the first: one settle is one user's.
func (m *madeList) first(k int) []madeFile {
	out := make([]madeFile, 0, min(k, m.len()))
	for e := m.files.Front(); e != nil && len(out) < k; e = e.Next() {
		f := *e.Value.(*madeFile)
		if len(out) > 0 && f.u != out[0].u {
			break
		}
		out = append(out, f)
	}
	return out
}

// dropFirst removes the first k made files.
func (m *madeList) dropFirst(k int) {
	for ; k > 0 && m.len() > 0; k-- {
		m.remove(m.files.Front().Value.(*madeFile).n.fid)
	}
}
