package client

import (
	"context"
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/client/site"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/client/listing"
	"github.com/hoardfs/hoard/client/user"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// dirDeleg is what a node has made or removed under a directory
// delegation and not yet told the server (Node).
type dirDeleg struct {
	// Files: madeIn is the directory this file was made in, not yet
	// created at the server. madeLost: the server refused that create;
	// the file's writes go to lost/. removedIn: the directory this file
	// was removed from here, not yet at the server.
	madeIn    atomic.Pointer[Node]
	madeLost  error
	removedIn atomic.Pointer[Node]
	// Directories: nsmu orders files made here, removed here and settled
	// (alone) with the client's requests that change the directory
	// (hold); madeFiles waits to be created (or removed) at the server,
	// made under delegation madeState on the directory at version
	// madeBase. recalledAt: the last recall of this client's delegation
	// on it.
	nsmu       sync.RWMutex
	madeFiles  listing.Made[*Node, user.User]
	madeState  uint64
	madeBase   uint64
	recalledAt time.Time
}

// Directory delegations. A client that creates a file in a directory asks
// for a write delegation on the directory; under it, with the directory's
// whole listing cached, it makes regular files on its own: named with FIDs
// reserved at the server, listed at once in its cache, and under a write
// delegation of their own (so their data stays in the cache too). The
// server learns of them later, all at once (settle: CreateReserved), when
// the flusher's age bound comes, an fsync needs them, another client's
// request on the directory recalls the delegation, or this client sends
// any other request naming the directory. A file made and removed before
// then never reaches the server at all (Postmark's churn). Made under a
// delegation the server revoked, they are refused, and what was written to
// them is kept in lost/, as for any write-back.

// made is the directory a file was made in here and not yet created at
// the server (nil once it was, or for any other file).
func (n *Node) made() *Node { return n.madeIn.Load() }

// dirDelegation is the write delegation held on dir for making files in
// it, getting one as u if it can be had; the listing is then complete.
func (c *Client) dirDelegation(dir *Node, u user.User) (callback.Held, bool) {
	at := dir.at()
	if c.opts.NoDirDelegations || !at.Delegating() || !at.Conn.Ready() {
		// Not with the server away: a create then fails, saying so,
		// rather than pile up files the server may never take.
		return callback.Held{}, false
	}
	h, ok := delegationAt(at, dir)
	if !ok {
		dir.mu.Lock()
		recent := time.Since(dir.recalledAt) < c.opts.DirBackoff
		dir.mu.Unlock()
		if recent {
			return callback.Held{}, false
		}
		if h, ok = c.delegate(dir, true, u); !ok {
			return callback.Held{}, false
		}
	}
	if h.Kind != callback.DelegWrite || h.Recalled {
		return callback.Held{}, false
	}
	if c.listed(dir) {
		return h, true
	}
	if _, _, err := c.readDir(dir, u); err != nil {
		return callback.Held{}, false
	}
	return h, c.listed(dir)
}

// mayHere reports whether u is known to have the rights need on dir, to
// change it here under this client's delegation: the delegation is the
// client's, whoever asked for it, so each user's own rights are checked
// as the server would check them. Not known: the change goes to the
// server, which decides (and says u's rights in its reply).
func (c *Client) mayHere(dir *Node, u user.User, need access.Rights) bool {
	st, ok := c.cachedAs(dir, u)
	return ok && st.Rights&node.RightsKnown != 0 && access.Rights(st.Rights)&need == need
}

// listed reports whether dir's whole listing is cached and current: every
// create under a delegation asks, and must not copy a listing of
// thousands of names to learn it (readDir).
func (c *Client) listed(dir *Node) bool {
	if !c.current(dir) {
		return false
	}
	dir.mu.Lock()
	defer dir.mu.Unlock()
	return dir.dents.IsComplete()
}

// makeHere makes regular file name in dir for u without asking the
// server, if a delegation on dir and u's rights there allow (ok). An
// existing file is returned instead unless excl, as by a create at the
// server. The settle creates it as u.
func (c *Client) makeHere(dir *Node, name string, mode uint32, who Creator, excl bool, u user.User) (n *Node, created, ok bool, err error) {
	h, held := c.dirDelegation(dir, u)
	if !held || !c.mayHere(dir, u, access.Insert) {
		return nil, false, false, nil
	}
	at := dir.at()
	fid, life, err := at.Reserved(dir.fid, u.Token())
	if err != nil {
		return nil, false, false, nil // made at the server instead
	}
	dir.nsmu.Lock()
	// Still held, and not being recalled: a recall settles under nsmu,
	// and a file made after it would come under a returned delegation.
	cur, held := delegationAt(at, dir)
	dir.mu.Lock()
	d, exists := dir.dents.Get(name)
	stale := !held || cur.Recalled || cur.State != h.State || !dir.dents.IsComplete() || dir.madeState != 0 && dir.madeState != h.State
	dir.mu.Unlock()
	if stale || exists {
		dir.nsmu.Unlock()
		at.Unreserve(fid, life)
		switch {
		case stale:
			// The delegation went, the listing was dropped, or files
			// made under an earlier delegation wait: the server first.
			return nil, false, false, nil
		case excl || d.Type != node.TypeFile:
			return nil, false, true, fmt.Errorf("%s: %w", name, syscall.EEXIST)
		}
		n, err := c.lookup(dir, name, u)
		return n, false, true, err
	}
	defer dir.nsmu.Unlock()
	now := time.Now()
	n = c.node(fid, at)
	n.mu.Lock()
	n.st = node.Status{FID: fid, Type: node.TypeFile, Mode: mode & 0o7777, UID: who.UID, GID: who.GID, Nlink: 1,
		DataVersion: 1, Atime: now, Mtime: now, Ctime: now}
	// Its maker's, whom a status the client made says nothing to
	// (permitted): the server decides, at the settle and the stores.
	// Anyone else asks the server, which a settle comes before.
	n.rights = map[user.Key]uint8{u.Key(): 0}
	n.entry = c.cache.Entry(fid)
	_, err = n.entry.Learn(n.st)
	n.dirtySince = now // the flusher's age bound covers the create
	n.mu.Unlock()
	if err != nil {
		c.forget(n)
		return nil, false, true, err
	}
	n.madeIn.Store(dir)
	dir.mu.Lock()
	dir.changedHere(now)
	dir.addDentLocked(name, fid, node.TypeFile)
	dir.madeFiles.Push(name, n, false, u)
	if dir.madeState == 0 {
		dir.madeState, dir.madeBase = h.State, dir.st.DataVersion
	}
	dir.mu.Unlock()
	c.flusher.Add(dirtyNode{n})
	c.counters.madeHere.Add(1)
	return n, true, true, nil
}

// changedHere stamps a change made to dir here, under its delegation, on
// its status (mu held): its version stays the server's until the settle.
func (dir *Node) changedHere(now time.Time) {
	dir.st.Mtime, dir.st.Ctime = now, now
}

// removeHere removes name from dir for u without asking the server,
// under a delegation on dir (done), if u may remove names there. A file
// made here and not yet created there never will be; one created there
// is removed there at the settle (removeLater), as u.
func (c *Client) removeHere(dir *Node, name string, u user.User) (done bool) {
	dir.mu.Lock()
	d, ok := dir.dents.Get(name)
	dir.mu.Unlock()
	if !ok || d.Type != node.TypeFile || !c.mayHere(dir, u, access.Delete) {
		return false
	}
	c.nodesMu.Lock()
	n := c.nodes[d.FID]
	c.nodesMu.Unlock()
	switch {
	case n == nil:
		return false
	case n.made() == nil:
		return c.removeLater(dir, name, n, u)
	case n.made() != dir:
		return false
	}
	dir.nsmu.Lock()
	defer dir.nsmu.Unlock()
	if n.made() != dir {
		return false // settled meanwhile
	}
	dir.mu.Lock()
	dir.changedHere(time.Now())
	dir.delDentLocked(name)
	dir.madeFiles.Remove(n.fid)
	if dir.madeFiles.Len() == 0 {
		dir.madeState, dir.madeBase = 0, 0
	}
	dir.mu.Unlock()
	n.madeIn.Store(nil)
	n.mu.Lock()
	n.unlinked = true
	n.st.Nlink = 0
	n.mu.Unlock()
	c.forget(n)
	c.counters.madeDropped.Add(1)
	return true
}

// removeLater removes file n, named name in dir and known to the server,
// without asking the server, if a delegation on dir allows (done): the
// next settle removes it there, with the files made meanwhile, in one
// request (Postmark's churn past the write-back window was one
// synchronous commit per remove). It must be a file with no other name,
// not open here, and under a write delegation of this client's: then
// nobody else has a promise on it, and a recall of that delegation
// settles first (its store is the settle: storeBack), so nobody else
// finds it after the remove returned. Its cached data, unstored writes
// included, goes at once; the flusher's age bound settles the remove as
// it stores writes.
func (c *Client) removeLater(dir *Node, name string, n *Node, u user.User) bool {
	at := dir.at()
	if h, ok := delegationAt(at, dir); !ok || h.Kind != callback.DelegWrite || h.Recalled || !c.writeHere(n) {
		return false
	}
	n.wmu.Lock() // no store of n under way
	defer n.wmu.Unlock()
	dir.nsmu.Lock()
	defer dir.nsmu.Unlock()
	h, held := delegationAt(at, dir)
	if !held || h.Kind != callback.DelegWrite || h.Recalled || !c.writeHere(n) {
		return false
	}
	n.mu.Lock()
	alone := n.st.Type == node.TypeFile && n.st.Nlink == 1 && !n.unlinked && n.files == 0 && n.bypassing == 0 && n.madeLost == nil
	n.mu.Unlock()
	now := time.Now()
	dir.mu.Lock()
	d, ok := dir.dents.Get(name)
	if !alone || !ok || d.FID != n.fid || !dir.dents.IsComplete() || dir.madeState != 0 && dir.madeState != h.State {
		dir.mu.Unlock()
		return false
	}
	dir.changedHere(now)
	dir.delDentLocked(name)
	dir.madeFiles.Push(name, n, true, u)
	if dir.madeState == 0 {
		dir.madeState, dir.madeBase = h.State, dir.st.DataVersion
	}
	dir.mu.Unlock()
	n.removedIn.Store(dir)
	n.valid.Store(false)
	n.mu.Lock()
	n.unlinked = true
	n.st.Nlink, n.st.Ctime = 0, now
	n.dirtyState, n.dirtySince = 0, now // the flusher's age bound covers the remove
	n.mu.Unlock()
	c.dropUnread(n)
	c.flusher.Add(dirtyNode{n})
	c.counters.removedHere.Add(1)
	c.log.Debug("removed here", "dir", dir.fid, "name", name, "fid", n.fid)
	return true
}

// renameHere renames a file made in dir and not yet created at the
// server to a free name in dir without asking it (done), for u, who must
// be known to have the rights a rename there needs; it returns the file's
// FID: the settle creates it under the new name. (A mount's silly rename
// of a file still open when it is removed is one.)
func (c *Client) renameHere(dir *Node, from, to string, u user.User) (node.FID, bool) {
	if err := node.CheckName(to); err != nil || from == to || !c.mayHere(dir, u, access.Insert|access.Delete) {
		return node.FID{}, false
	}
	dir.nsmu.Lock()
	defer dir.nsmu.Unlock()
	now := time.Now()
	dir.mu.Lock()
	d, ok := dir.dents.Get(from)
	var moved *Node
	if _, taken := dir.dents.Get(to); ok && !taken && dir.dents.IsComplete() {
		if m := dir.madeFiles.Find(d.FID); m != nil && m.Name == from {
			dir.changedHere(now)
			m.Name = to
			dir.delDentLocked(from)
			dir.addDentLocked(to, d.FID, d.Type)
			moved = m.Node
		}
	}
	dir.mu.Unlock()
	if moved == nil {
		return node.FID{}, false
	}
	moved.mu.Lock()
	moved.st.Ctime = now
	moved.mu.Unlock()
	return moved.fid, true
}

// settleNamed settles the directory that name in dir names, if this
// client made files in it: a request about to remove or replace it must
// not find it empty at the server. When the listing does not say what
// name is, every directory with files made in it is settled.
func (c *Client) settleNamed(dir *Node, name string) error {
	dir.mu.Lock()
	d, ok := dir.dents.Get(name)
	complete := dir.dents.IsComplete()
	dir.mu.Unlock()
	if ok && d.Type != node.TypeDir || !ok && complete {
		return nil
	}
	var errs []error
	for _, n := range c.madeDirs(dir.at()) {
		if !ok || n.fid == d.FID {
			errs = append(errs, c.settle(n))
		}
	}
	return errors.Join(errs...)
}

// madeDirs lists the directories at site s (nil: any) with files made
// in them.
func (c *Client) madeDirs(s *site.Site) []*Node {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	var dirs []*Node
	for _, n := range c.nodes {
		if s != nil && n.at() != s {
			continue
		}
		n.mu.Lock()
		if n.madeFiles.Len() > 0 {
			dirs = append(dirs, n)
		}
		n.mu.Unlock()
	}
	return dirs
}

// settleFor makes the server know n: the file, or the directory, whose
// made files it creates there first. It fails if they could not be
// created: unreachable (they wait), or refused (the error stays with each
// file until its writes are kept in lost/).
func (c *Client) settleFor(n *Node) error {
	n.mu.Lock()
	lost := n.madeLost
	n.mu.Unlock()
	if lost != nil {
		return lost
	}
	if dir := n.made(); dir != nil {
		if err := c.settle(dir); err != nil {
			return err
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.madeLost // refused in a settle that was under way
	}
	return c.settle(n)
}

// settle creates at the server the files made in dir (CreateReserved):
// they then hold write delegations of their own, and dir's listing stays.
func (c *Client) settle(dir *Node) error {
	dir.mu.Lock()
	none := dir.madeFiles.Len() == 0
	dir.mu.Unlock()
	if none {
		return nil
	}
	dir.nsmu.Lock()
	bare, err := c.settleLocked(dir)
	dir.nsmu.Unlock()
	c.uncovered(bare)
	c.storeBare(bare)
	return err
}

// uncovered tells OnInvalidate of files a settle created without their
// write delegation, before anyone else can change them: made here, they
// were covered by their directory's delegation (PromiseLeft), and now
// nothing is.
func (c *Client) uncovered(ns []*Node) {
	if len(ns) == 0 || c.opts.OnInvalidate == nil {
		return
	}
	fids := make([]node.FID, len(ns))
	for i, n := range ns {
		fids[i] = n.fid
	}
	c.opts.OnInvalidate(fids)
}

// settleLocked is settle with nsmu held. It returns the files it created
// whose write delegation it could not take (storeBare).
func (c *Client) settleLocked(dir *Node) (bare []*Node, err error) {
	for {
		more, b, err := c.settleSome(dir)
		bare = append(bare, b...)
		if err != nil || !more {
			return bare, err
		}
	}
}

// storeBare stores what was written to files a settle created without
// their write delegation: its grant came back across a new session and
// was returned, so nothing keeps their data the holder's to store later.
// (nsmu not held: a store of a file made here settles first, taking it.)
// A file whose wmu is held is left to the flusher: the settle may have
// been reached by that file's own store (storeLocked settles first),
// whose goroutine holds it and stores the file next.
func (c *Client) storeBare(ns []*Node) {
	for _, n := range ns {
		if !n.wmu.TryLock() {
			c.flusher.Add(dirtyNode{n})
			c.flusher.Wake()
			continue
		}
		if err := c.storeBack(n, true, c.writerOf(n)); err != nil {
			c.log.Warn("a settled file's writes not stored yet", "fid", n.fid, "err", err)
		}
		n.wmu.Unlock()
	}
}

// hold settles dirs and keeps files from being made or removed here in
// them until release: for a request that changes them at the server,
// which must come after the files made there so far and before any made
// later. Such requests hold dirs together (shared); making, removing
// and settling files take them alone.
func (c *Client) hold(dirs ...*Node) (release func(), err error) {
	if c.opts.NoDirDelegations {
		return func() {}, nil // nothing is ever made here
	}
	if len(dirs) == 2 && (dirs[0] == dirs[1] || fidBefore(dirs[1].fid, dirs[0].fid)) {
		if dirs[0] == dirs[1] {
			dirs = dirs[:1]
		} else {
			dirs = []*Node{dirs[1], dirs[0]} // one order for all, against deadlock
		}
	}
	release = func() {
		for i := len(dirs) - 1; i >= 0; i-- {
			dirs[i].nsmu.RUnlock()
		}
	}
	for {
		pending := false
		for _, d := range dirs {
			d.nsmu.RLock()
			d.mu.Lock()
			pending = pending || d.madeFiles.Len() > 0
			d.mu.Unlock()
		}
		if !pending {
			return release, nil
		}
		release()
		for _, d := range dirs {
			if err := c.settle(d); err != nil {
				return nil, err
			}
		}
	}
}

func fidBefore(a, b node.FID) bool {
	if a.Volume != b.Volume {
		return a.Volume < b.Volume
	}
	return a.Vnode < b.Vnode
}

// settleSome creates up to maxSettle of dir's made files (nsmu held), as
// the user who made the first of them, with those after it that user
// made (the server checks that user's rights, and makes the files that
// user's), and reports whether more are left, and which it created
// without their write delegation.
func (c *Client) settleSome(dir *Node) (more bool, bare []*Node, err error) {
	dir.mu.Lock()
	made := dir.madeFiles.First(maxSettle)
	state, base := dir.madeState, dir.madeBase
	dents := dir.dents
	dir.mu.Unlock()
	if len(made) == 0 {
		return false, nil, nil
	}
	req := &pb.CreateReservedRequest{Dir: pb.FromFID(dir.fid), State: state, BaseVersion: base}
	var created, removed []listing.MadeFile[*Node, user.User]
	for _, m := range made {
		if m.Removed {
			removed = append(removed, m)
			req.Removed = append(req.Removed, &pb.RemovedFile{Name: m.Name, Fid: pb.FromFID(m.Node.fid)})
			continue
		}
		m.Node.mu.Lock()
		st := m.Node.st
		m.Node.mu.Unlock()
		created = append(created, m)
		req.Files = append(req.Files, &pb.ReservedFile{Name: m.Name, Fid: pb.FromFID(m.Node.fid), Mode: st.Mode, Uid: st.UID, Gid: st.GID, MtimeNs: st.Mtime.UnixNano()})
	}
	at := dir.at()
	t := at.Begin()
	defer t.End()
	var reply *pb.CreateReservedReply
	u := made[0].User
	err = at.As(u.Token()).CallOnce("", func(ctx context.Context) (err error) {
		reply, err = at.RPC.CreateReserved(ctx, req)
		return err
	})
	if err == nil && (len(reply.Files) != len(created) || len(reply.States) != len(created) || len(reply.Removed) != len(removed)) {
		err = fmt.Errorf("protocol: %d files created for %d, %d removed for %d", len(reply.Files), len(created), len(reply.Removed), len(removed))
	}
	if err != nil {
		if refusedCreate(err) {
			c.loseMade(dir, made, err)
		}
		return false, nil, err
	}
	for _, m := range removed {
		m.Node.removedIn.Store(nil)
		c.forget(m.Node)
	}
	for i, m := range created {
		if _, err := c.learnPB(t, reply.Files[i], u); err != nil {
			return false, bare, err
		}
		covered := false
		if s := reply.States[i]; s != 0 {
			if _, ok := c.delegated(t, m.Node, pb.DelegKind_DELEG_WRITE, s); ok {
				covered = true
				m.Node.mu.Lock()
				if m.Node.dirtyState == 0 {
					m.Node.dirtyState = s
				}
				m.Node.mu.Unlock()
			}
		}
		m.Node.madeIn.Store(nil)
		if !covered {
			bare = append(bare, m.Node)
		}
	}
	if _, err := c.learnPB(t, reply.Dir, u); err != nil {
		return false, bare, err
	}
	dir.mu.Lock()
	if dir.st.DataVersion == reply.Dir.DataVersion && reply.Dir.DataVersion == base+uint64(len(made)) && dents != nil {
		// Nobody else came between: the listing we kept is the server's.
		dir.dents = dents
	}
	dir.madeFiles.DropFirst(len(made))
	dir.madeBase = reply.Dir.DataVersion
	more = dir.madeFiles.Len() > 0
	if !more {
		dir.madeState, dir.madeBase = 0, 0
	}
	dir.mu.Unlock()
	c.counters.settled.Add(int64(len(created)))
	return more, bare, nil
}

// maxSettle bounds one CreateReserved (the server's MaxReserve).
const maxSettle = 1024

// refusedCreate reports a CreateReserved the server will never accept.
func refusedCreate(err error) bool {
	switch pb.Errno(err) {
	case syscall.EKEYEXPIRED, syscall.EEXIST, syscall.EINVAL, syscall.ESTALE, syscall.ENOENT, syscall.ENOSPC, syscall.EACCES, syscall.EPERM:
		return true
	}
	return false
}

// loseMade gives up on files made in dir that the server refused: their
// names go from the listing, and each keeps the error until its writes
// are kept in lost/ (storeBack) and its next fsync or close reports it.
// Files removed here stay at the server, and the listing, which lacks
// them, goes.
func (c *Client) loseMade(dir *Node, made []listing.MadeFile[*Node, user.User], cause error) {
	c.log.Error("files made or removed under a directory delegation were refused", "dir", dir.fid, "files", len(made), "err", cause)
	dir.mu.Lock()
	for _, m := range made {
		if m.Removed {
			dir.dents = nil
		} else {
			dir.delDentLocked(m.Name)
		}
	}
	dir.madeFiles.DropFirst(len(made))
	if dir.madeFiles.Len() == 0 {
		dir.madeState, dir.madeBase = 0, 0
	}
	dir.mu.Unlock()
	var lost []*Node
	for _, m := range made {
		if m.Removed {
			m.Node.removedIn.Store(nil)
			c.forget(m.Node)
			continue
		}
		m.Node.mu.Lock()
		m.Node.madeLost = fmt.Errorf("%w: created under a directory delegation the server refused: %v", syscall.EKEYEXPIRED, cause)
		m.Node.mu.Unlock()
		m.Node.madeIn.Store(nil)
		c.flusher.Add(dirtyNode{m.Node}) // to be kept in lost/
		c.flusher.Wake()
		lost = append(lost, m.Node)
	}
	c.spawn(func() { c.uncovered(lost) }) // nsmu is held; the files are gone anyway
}

// settleAll settles every directory at s with files made in it: after a new
// session, in the server's grace period, when the old delegation's files
// are still taken (or, after a reset, refused and kept in lost/).
func (c *Client) settleAll(s *site.Site) {
	for _, d := range c.madeDirs(s) {
		c.spawn(func() {
			if err := c.settle(d); err != nil {
				c.log.Warn("files made in a directory not created at the server yet", "dir", d.fid, "err", err)
			}
		})
	}
}
