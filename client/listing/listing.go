// Package listing is what a client knows of one directory's entries: a
// cached listing, and the queue of files made (or removed) in it under a
// directory delegation that the server has yet to hear of. Neither takes
// a lock; the client's Node.mu guards both.
package listing

import (
	"container/list"
	"iter"

	"github.com/hoardfs/hoard/node"
)

// Listing is what the client knows of a directory's entries at one
// DataVersion: the names it looked up, or, complete, every name in the
// server's order. Every operation on one name is O(1): a directory of
// 100,000 files is made, listed and emptied at the same cost per file as
// one of ten. The zero Listing is an empty partial one; a nil *Listing
// knows nothing.
type Listing struct {
	names map[string]Entry
	// order is the complete listing's names in the server's order, ""
	// where a name was removed (holes of them), until compacted.
	order    []string
	holes    int
	complete bool
}

// Entry is what a listing knows of one name.
type Entry struct {
	FID  node.FID
	Type node.Type
	// At is the name's position in Order, in a complete listing.
	At int
}

// Complete is the listing of a whole directory, empty so far: Add each
// name in the server's order. n is how many are coming.
func Complete(n int) *Listing {
	return &Listing{names: make(map[string]Entry, n), order: make([]string, 0, n), complete: true}
}

// Get is the entry name, if known.
func (l *Listing) Get(name string) (Entry, bool) {
	if l == nil {
		return Entry{}, false
	}
	e, ok := l.names[name]
	return e, ok
}

// IsComplete reports whether the listing has every name: a name it lacks
// does not exist.
func (l *Listing) IsComplete() bool { return l != nil && l.complete }

// Add records name → fid, at the end of the order if new.
func (l *Listing) Add(name string, fid node.FID, typ node.Type) {
	if l.names == nil {
		l.names = map[string]Entry{}
	}
	e, ok := l.names[name]
	if !ok && l.complete {
		e.At = len(l.order)
		l.order = append(l.order, name)
	}
	e.FID, e.Type = fid, typ
	l.names[name] = e
}

// Del forgets name, leaving a hole in the order that a compaction closes
// once holes are more than half of it.
func (l *Listing) Del(name string) {
	e, ok := l.names[name]
	if !ok {
		return
	}
	delete(l.names, name)
	if !l.complete {
		return
	}
	l.order[e.At] = ""
	if l.holes++; l.holes > len(l.order)/2 {
		l.compact()
	}
}

func (l *Listing) compact() {
	order := make([]string, 0, len(l.names))
	for _, name := range l.order {
		if name != "" {
			e := l.names[name]
			e.At = len(order)
			l.names[name] = e
			order = append(order, name)
		}
	}
	l.order, l.holes = order, 0
}

// All yields a complete listing's names and entries, in order.
func (l *Listing) All() iter.Seq2[string, Entry] {
	return func(yield func(string, Entry) bool) {
		for _, name := range l.order {
			if name != "" && !yield(name, l.names[name]) {
				return
			}
		}
	}
}

// Len is how many names the listing knows.
func (l *Listing) Len() int { return len(l.names) }

// Order is a complete listing's names by position (Entry.At), "" where
// one was removed: read-ahead walks it. It is the listing's own; the
// caller must not change it, and a later Add or Del may.
func (l *Listing) Order() []string { return l.order }

// Made is the files made in a directory and not yet created at the
// server, and those removed from it here and not yet there, in the order
// it happened, which the settle keeps. Adding, finding and removing one
// is O(1). N is the client's node, U who made or removed the file: one
// settle is one user's. The zero Made is empty.
type Made[N interface{ FID() node.FID }, U comparable] struct {
	files list.List // of *MadeFile[N, U]
	at    map[node.FID]*list.Element
}

// MadeFile is a file made in a directory and not yet created at the
// server, or (Removed) one removed from it here and not yet there, by
// User.
type MadeFile[N, U any] struct {
	Name    string
	Node    N
	Removed bool
	User    U
}

// Len is how many files wait.
func (m *Made[N, U]) Len() int { return m.files.Len() }

// Push queues n, made (or removed) as name by u, last.
func (m *Made[N, U]) Push(name string, n N, removed bool, u U) {
	if m.at == nil {
		m.at = map[node.FID]*list.Element{}
	}
	m.at[n.FID()] = m.files.PushBack(&MadeFile[N, U]{Name: name, Node: n, Removed: removed, User: u})
}

// Find is the queued file fid, nil if there is none; a rename here
// changes its Name in place.
func (m *Made[N, U]) Find(fid node.FID) *MadeFile[N, U] {
	if e := m.at[fid]; e != nil {
		return e.Value.(*MadeFile[N, U])
	}
	return nil
}

// Remove drops the queued file fid, if there is one.
func (m *Made[N, U]) Remove(fid node.FID) {
	if e := m.at[fid]; e != nil {
		m.files.Remove(e)
		delete(m.at, fid)
	}
}

// First copies out the first k queued files (all, if fewer), up to the
// first of another user than the first's: one settle is one user's.
func (m *Made[N, U]) First(k int) []MadeFile[N, U] {
	out := make([]MadeFile[N, U], 0, min(k, m.Len()))
	for e := m.files.Front(); e != nil && len(out) < k; e = e.Next() {
		f := *e.Value.(*MadeFile[N, U])
		if len(out) > 0 && f.User != out[0].User {
			break
		}
		out = append(out, f)
	}
	return out
}

// DropFirst removes the first k queued files: those a settle took.
func (m *Made[N, U]) DropFirst(k int) {
	for ; k > 0 && m.Len() > 0; k-- {
		m.Remove(m.files.Front().Value.(*MadeFile[N, U]).Node.FID())
	}
}
