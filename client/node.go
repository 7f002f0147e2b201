package client

import (
	"context"
	"fmt"
	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/client/site"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client/listing"
	"github.com/hoardfs/hoard/client/user"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Node is the cache manager's in-memory record of one remote file or
// directory. valid is the whole fast path: set while a callback promise is
// held, cleared by a break, a reset or the once-a-second expiry sweep.
//
// Its state is grouped by concept, each group declared in the file that
// works on it (the lock order is in locks.go):
//   - fileData (file.go): a file's cached data and its writers;
//   - writeBack (flush.go): writes not yet stored, and their losses;
//   - fileDeleg (deleg.go): opens and delegations held on a file;
//   - dirListing (ahead.go; package listing): a directory's entries and read-ahead;
//   - dirDeleg (dirdeleg.go): files made and removed under a directory's
//     delegation.
//
// mu guards st, rights and every field of the groups not said to be
// otherwise.
type Node struct {
	// c is the cache manager the node belongs to; site is the session
	// with the server holding its volume, which changes when the volume
	// moves (handOver).
	c     *Client
	site  atomic.Pointer[site.Site]
	fid   node.FID
	valid atomic.Bool
	// forgot is when the kernel forgot the node (Release), 0 while held.
	forgot atomic.Int64

	mu sync.Mutex
	st node.Status
	// rights are users' rights on the node as the server said them
	// (Status.Rights), learnt with st under the promise held and dropped
	// with it (user.go); a file made here has its maker's, unknown (0).
	rights map[user.Key]uint8
	// xattrs are its extended attributes as the server said them under
	// the promise held, kept and dropped as rights are (xattr.go);
	// xattrChanges counts this client's changes to them.
	xattrs       *xattrs
	xattrChanges uint64

	fileData
	writeBack
	fileDeleg
	dirListing
	dirDeleg
}

// at is the site of the server holding n's volume now.
func (n *Node) at() *site.Site { return n.site.Load() }

// FID is the node's file identifier.
func (n *Node) FID() node.FID { return n.fid }

// status is the last known status; for a file with local writes not yet
// stored, the size is the local one.
func (n *Node) status() node.Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.statusLocked()
}

// statusLocked is status with mu held.
func (n *Node) statusLocked() node.Status {
	st := n.st
	if n.entry != nil {
		if est, ok := n.entry.Status(); ok && est.DataVersion > st.DataVersion {
			// A store just landed: the entry took its status first, the
			// node learns it a moment later (storeData).
			st = est
		} else if ok && n.localChanges() {
			st.Size = est.Size
			if n.modified.After(st.Mtime) {
				st.Mtime, st.Ctime = n.modified, n.modified
			}
			st.Blocks = localBlocks(st.Blocks, est.Size, n.entry)
		}
	}
	return st
}

// localBlocks estimates the blocks of a file with unstored changes: the
// server's, or its unstored bytes' if more (a file written here and not
// yet stored takes room too), never more than a dense file of size takes.
func localBlocks(server uint64, size uint64, e *cache.Entry) uint64 {
	b := max(server, (uint64(e.DirtyBytes())+511)/512)
	if _, cut := e.Cut(); cut {
		b = min(b, (size+4095)/4096*8)
	}
	return b
}

// touch records a local change's time, and who made it (wmu held).
func (n *Node) touch(u user.User) {
	n.mu.Lock()
	n.modified = time.Now()
	n.writer, n.wrote = u, true
	n.mu.Unlock()
}

// localChanges reports unstored writes or truncation.
func (n *Node) localChanges() bool {
	_, cut := n.entry.Cut()
	return cut || n.entry.DirtyBytes() > 0
}

// node returns the one Node for fid, at site at if it is new.
func (c *Client) node(fid node.FID, at *site.Site) *Node {
	c.nodesMu.Lock()
	defer c.nodesMu.Unlock()
	n := c.nodes[fid]
	if n == nil {
		n = &Node{c: c, fid: fid}
		n.site.Store(at)
		c.nodes[fid] = n
	}
	return n
}

// learn records a status from the server's reply to a request of u's, the
// promise that came with it, and u's rights in it. DataVersions only grow,
// so a reply older than what is known is ignored rather than allowed to
// roll the node back. A status that changed drops the other users'
// rights (a new mode or owner may change them): they ask again. u's are
// kept only if no break voided the reply meanwhile, checked with the
// promise under one hold of mu, so that a break's invalidate, which
// drops them, comes either after or before both.
func (c *Client) learn(t site.Ticket, st node.Status, ttl time.Duration, u user.User) (*Node, error) {
	n := c.node(st.FID, t.At)
	n.mu.Lock()
	defer n.mu.Unlock()
	known := !n.st.FID.IsZero()
	have := n.st.DataVersion
	if n.entry != nil {
		// A store's status reaches the entry before the node: a reply
		// read before the store landed is older than both.
		if est, ok := n.entry.Status(); ok {
			have = max(have, est.DataVersion)
		}
	}
	if known && (st.DataVersion < have || st.DataVersion == n.st.DataVersion && st.Ctime.Before(n.st.Ctime)) {
		return n, nil
	}
	if !known || st.DataVersion != n.st.DataVersion {
		n.dents = nil
	}
	if known && (st.DataVersion != n.st.DataVersion || !st.Ctime.Equal(n.st.Ctime)) {
		n.rights, n.xattrs = nil, nil
	}
	if st.Type == node.TypeFile {
		if n.entry == nil {
			n.entry = c.cache.Entry(st.FID)
		}
		if err := n.syncEntry(st); err != nil {
			return nil, err
		}
	}
	n.st = st
	at := t.At
	at.Table(func(cb *callback.Client) {
		// A promise counts only from the site holding the node: a late reply
		// from the one its volume left is taken for its status alone.
		granted := ttl > 0 && n.at() == at && cb.Granted(t.T, st.FID, ttl, cb.Epoch())
		if granted {
			n.valid.Store(true)
		}
		if granted || ttl <= 0 && cb.Intact(t.T, st.FID) {
			n.setRightsLocked(u, st.Rights)
		}
	})
	return n, nil
}

// syncEntry merges the server's status st into the cache entry, which
// owns a file's size and DataVersion (cache.Entry.Learn).
func (n *Node) syncEntry(st node.Status) error {
	changed, err := n.entry.Learn(st)
	if changed {
		n.c.counters.dropped.Add(1)
	}
	return err
}

// learnPB is learn for a status in wire form.
func (c *Client) learnPB(t site.Ticket, ps *pb.Status, u user.User) (*Node, error) {
	st, ttl, err := ps.ToStatus()
	if err != nil {
		return nil, err
	}
	return c.learn(t, st, ttl, u)
}

// fresh returns n's status with u's rights in it, asking the server, as
// u, unless a promise is held and u's rights are known: the first time a
// user is served what the cache holds, the server says what that user
// may do with it. A refusal (EACCES) is u's alone: the node and what
// other users learnt of it stay.
func (c *Client) fresh(n *Node, u user.User) (node.Status, error) {
	var st node.Status
	err := n.onServer(false, func(at *site.Site) (err error) {
		st, err = c.freshHere(at, n, u)
		return err
	})
	return st, err
}

// freshHere is fresh at site at, which holds n.
func (c *Client) freshHere(at *site.Site, n *Node, u user.User) (node.Status, error) {
	if err := c.checkToken(u); err != nil {
		return node.Status{}, err
	}
	if st, ok := c.cachedAs(n, u); ok {
		return st, nil
	}
	if err := c.settleFor(n); err != nil {
		return node.Status{}, err
	}
	t := at.Begin()
	defer t.End()
	var reply *pb.GetStatusReply
	err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
		reply, err = at.RPC.GetStatus(ctx, &pb.GetStatusRequest{Fids: []*pb.FID{pb.FromFID(n.fid)}})
		return err
	})
	if err != nil {
		return node.Status{}, err
	}
	if len(reply.Results) != 1 {
		return node.Status{}, fmt.Errorf("protocol: %d status results for 1 fid", len(reply.Results))
	}
	if e := reply.Results[0].Errno; e != 0 {
		if syscall.Errno(e) == syscall.ESTALE || syscall.Errno(e) == syscall.ENOENT {
			c.forget(n)
		}
		return node.Status{}, syscall.Errno(e)
	}
	c.counters.revalidations.Add(1)
	ps := reply.Results[0].Status
	if _, err := c.learnPB(t, ps, u); err != nil {
		return node.Status{}, err
	}
	st := n.status()
	st.Rights = uint8(ps.GetRights())
	return st, nil
}

// bulkStatus is how many statuses one GetStatus asks for (the server
// takes up to 4096).
const bulkStatus = 1024

// statusAll learns, in bulk, the status (and promise) of each of ents that
// is not current, as AFS's InlineBulkStatus does: a kernel that lists a
// directory with attributes looks up every entry, a round trip each
// otherwise. Entries gone meanwhile, or not u's to see, are skipped: a
// lookup finds out. Those current but with u's rights unknown are asked
// too: the kernel's next open or stat of one would ask alone.
func (c *Client) statusAll(at *site.Site, ents []DirEntry, u user.User) error {
	var todo []*pb.FID
	for _, e := range ents {
		c.nodesMu.Lock()
		n := c.nodes[e.FID]
		c.nodesMu.Unlock()
		if _, ok := c.cachedAs(n, u); !ok {
			todo = append(todo, pb.FromFID(e.FID))
		}
	}
	for len(todo) > 0 {
		batch := todo[:min(len(todo), bulkStatus)]
		todo = todo[len(batch):]
		t := at.Begin()
		var reply *pb.GetStatusReply
		err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
			reply, err = at.RPC.GetStatus(ctx, &pb.GetStatusRequest{Fids: batch})
			return err
		})
		if err == nil && len(reply.Results) != len(batch) {
			err = fmt.Errorf("protocol: %d status results for %d fids", len(reply.Results), len(batch))
		}
		for i := 0; err == nil && i < len(batch); i++ {
			if r := reply.Results[i]; r.Errno == 0 {
				_, err = c.learnPB(t, r.Status, u)
			}
		}
		t.End()
		if err != nil {
			return err
		}
	}
	return nil
}

// forget drops a node that no longer exists on the server, with its cached
// data unless local writes are pending that someone may still read or
// must hear were lost (another client removed the file).
func (c *Client) forget(n *Node) {
	n.valid.Store(false)
	c.flusher.Remove(dirtyNode{n})
	at := n.at()
	at.Table(func(cb *callback.Client) {
		cb.Break(n.fid)
		cb.FileGone(n.fid)
	})
	c.nodesMu.Lock()
	if c.nodes[n.fid] == n {
		delete(c.nodes, n.fid)
	}
	c.nodesMu.Unlock()
	c.dropUnread(n)
}

// dropUnread drops n's cached data, unstored writes included, once nobody
// can read them: this client removed the file's last name, and has no
// open file on it. (Postmark's churn: a file made, written and removed
// under a delegation never reaches the server, and must not stay in the
// cache either, where a restart would find its writes and keep them as
// lost.)
func (c *Client) dropUnread(n *Node) {
	n.mu.Lock()
	unread := n.unlinked && n.files == 0
	n.mu.Unlock()
	if unread {
		c.cache.Remove(n.fid)
	} else {
		c.cache.Drop(n.fid)
	}
}

// addDent records name → child in dir, if dir is still at the version the
// reply was made at.
func (dir *Node) addDent(dv uint64, name string, child *Node, typ node.Type) {
	dir.mu.Lock()
	defer dir.mu.Unlock()
	if dir.st.DataVersion != dv {
		return
	}
	dir.addDentLocked(name, child.fid, typ)
}

// changedDir applies our own change, made as u, to a cached listing: when
// the reply's version is exactly one past the cached one nobody else came
// between, so the listing can be patched instead of dropped.
func (c *Client) changedDir(t site.Ticket, dir *Node, ps *pb.Status, u user.User, patch func(dir *Node)) error {
	dir.mu.Lock()
	before := dir.st.DataVersion
	dents := dir.dents
	dir.mu.Unlock()
	if _, err := c.learnPB(t, ps, u); err != nil {
		return err
	}
	dir.mu.Lock()
	defer dir.mu.Unlock()
	if ps.DataVersion == before+1 && dir.st.DataVersion == ps.DataVersion && dents != nil {
		dir.dents = dents
		patch(dir)
	}
	return nil
}

func (dir *Node) delDentLocked(name string) {
	if dir.dents != nil {
		dir.dents.Del(name)
	}
}

func (dir *Node) addDentLocked(name string, fid node.FID, typ node.Type) {
	if dir.dents == nil {
		dir.dents = &listing.Listing{}
	}
	dir.dents.Add(name, fid, typ)
}

// replaceNamed readies a remove of name in dir, or a rename over it, for
// the file the listing knows there: the request waits for a store of its
// writes under way, and a store that fails with ESTALE while the request
// is under way is one of a file this client is removing, whose writes are
// dropped (goneHere), not kept as lost. The file's writers' lock is not
// held across the request: a recall's store must still go out meanwhile,
// since until the request lands another client may open the file and must
// read those writes. (Lock order: a file's wmu before its directory's
// nsmu, as a store that settles takes them.)
func (c *Client) replaceNamed(dir *Node, name string) (done func()) {
	dir.mu.Lock()
	d, ok := dir.dents.Get(name)
	dir.mu.Unlock()
	if !ok || d.Type != node.TypeFile {
		return func() {}
	}
	c.nodesMu.Lock()
	n := c.nodes[d.FID]
	c.nodesMu.Unlock()
	if n == nil || n.made() != nil {
		// A file made here is stored only after its settle, which the
		// request's hold makes first (and which takes this lock).
		return func() {}
	}
	n.wmu.Lock()
	n.mu.Lock()
	n.replacing++
	n.mu.Unlock()
	n.wmu.Unlock()
	return func() {
		n.mu.Lock()
		n.replacing--
		n.mu.Unlock()
	}
}

// lookup finds name in dir for u, from the cache when dir's promise is
// valid.
func (c *Client) lookup(dir *Node, name string, u user.User) (*Node, error) {
	n, _, err := c.lookupAt(dir, name, u)
	return n, err
}

// lookupAt is lookup that also returns the status of dir the answer
// belongs to. An answer from the cache needs u's right to look in dir
// (l), as the server's would: known, or asked for first.
func (c *Client) lookupAt(dir *Node, name string, u user.User) (*Node, node.Status, error) {
	var n *Node
	var st node.Status
	err := dir.onServer(false, func(at *site.Site) (err error) {
		n, st, err = c.lookupAtHere(at, dir, name, u)
		return err
	})
	return n, st, err
}

// lookupAtHere is lookupAt at site at, which holds dir.
func (c *Client) lookupAtHere(at *site.Site, dir *Node, name string, u user.User) (*Node, node.Status, error) {
	if err := node.CheckName(name); err != nil {
		return nil, node.Status{}, err
	}
	for asked := false; c.current(dir); asked = true {
		dir.mu.Lock()
		d, ok := dir.dents.Get(name)
		complete := dir.dents.IsComplete()
		dir.mu.Unlock()
		var n *Node
		if ok {
			c.nodesMu.Lock()
			n = c.nodes[d.FID]
			c.nodesMu.Unlock()
			if n == nil || !c.current(n) {
				break
			}
		} else if !complete {
			break
		}
		st, known := dir.statusAs(u)
		if !known {
			if asked {
				break
			}
			if _, err := c.fresh(dir, u); err != nil {
				return nil, node.Status{}, err
			}
			continue
		}
		if !allows(st, access.Lookup) {
			return nil, node.Status{}, syscall.EACCES
		}
		if ok {
			return n, st, nil
		}
		if c.current(dir) {
			return nil, st, syscall.ENOENT
		}
	}
	if err := c.settle(dir); err != nil {
		return nil, node.Status{}, err
	}
	t := at.Begin()
	defer t.End()
	var reply *pb.LookupReply
	err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
		reply, err = at.RPC.Lookup(ctx, &pb.LookupRequest{Dir: pb.FromFID(dir.fid), Name: name})
		return err
	})
	if err != nil {
		return nil, node.Status{}, err
	}
	dst, _, err := reply.Dir.ToStatus()
	if err != nil {
		return nil, node.Status{}, err
	}
	if _, err := c.learnPB(t, reply.Dir, u); err != nil {
		return nil, node.Status{}, err
	}
	child, err := c.learnPB(t, reply.Status, u)
	if err != nil {
		return nil, node.Status{}, err
	}
	dir.addDent(reply.Dir.DataVersion, name, child, reply.Status.Type.ToType())
	return child, dst, nil
}

// readDir lists dir completely for u, from the cache when possible (with
// u's right to list it, l, known or asked for first). A listing fetched
// in pages is only kept if the directory did not change between pages;
// otherwise it is fetched again.
// It also returns the DataVersion the listing belongs to, 0 if the
// directory kept changing while it was fetched.
func (c *Client) readDir(dir *Node, u user.User) ([]DirEntry, uint64, error) {
	var ents []DirEntry
	var dv uint64
	err := dir.onServer(false, func(at *site.Site) (err error) {
		ents, dv, err = c.readDirHere(at, dir, u)
		return err
	})
	return ents, dv, err
}

// readDirHere is readDir at site at, which holds dir.
func (c *Client) readDirHere(at *site.Site, dir *Node, u user.User) ([]DirEntry, uint64, error) {
	for attempt := 0; ; attempt++ {
		if c.listed(dir) {
			st, err := c.fresh(dir, u)
			if err != nil {
				return nil, 0, err
			}
			if !allows(st, access.Lookup) {
				return nil, 0, syscall.EACCES
			}
			dir.mu.Lock()
			if dir.dents.IsComplete() {
				out := make([]DirEntry, 0, dir.dents.Len())
				for name, e := range dir.dents.All() {
					out = append(out, DirEntry{Name: name, Type: e.Type, FID: e.FID})
				}
				dv := dir.st.DataVersion
				dir.mu.Unlock()
				return out, dv, nil
			}
			dir.mu.Unlock()
		}
		out, dv, consistent, err := c.fetchDir(at, dir, u)
		if err != nil {
			return nil, 0, err
		}
		if !consistent && attempt < 3 {
			continue
		}
		if !consistent {
			dv = 0
		} else {
			dir.mu.Lock()
			if dir.st.DataVersion == dv {
				dents := listing.Complete(len(out))
				for _, e := range out {
					dents.Add(e.Name, e.FID, e.Type)
				}
				dir.dents = dents
			}
			dir.mu.Unlock()
		}
		return out, dv, nil
	}
}

func (c *Client) fetchDir(at *site.Site, dir *Node, u user.User) (out []DirEntry, dv uint64, consistent bool, err error) {
	if err := c.settle(dir); err != nil {
		return nil, 0, false, err
	}
	t := at.Begin()
	defer t.End()
	var cookie uint64
	consistent = true
	for first := true; ; first = false {
		var reply *pb.ReadDirReply
		err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
			reply, err = at.RPC.ReadDir(ctx, &pb.ReadDirRequest{Dir: pb.FromFID(dir.fid), Cookie: cookie, MaxEntries: 4096})
			return err
		})
		if err != nil {
			return nil, 0, false, err
		}
		if _, err := c.learnPB(t, reply.Dir, u); err != nil {
			return nil, 0, false, err
		}
		if first {
			dv = reply.Dir.DataVersion
		} else if reply.Dir.DataVersion != dv {
			consistent = false
		}
		for _, e := range reply.Entries {
			out = append(out, DirEntry{Name: e.Name, Type: e.Type.ToType(), FID: e.Fid.ToFID()})
			cookie = e.Cookie
		}
		if reply.Eof {
			return out, dv, consistent, nil
		}
		if len(reply.Entries) == 0 {
			return nil, 0, false, fmt.Errorf("protocol: empty readdir page before the end")
		}
	}
}

// volumeRoot returns the root directory of the volume a mount point's
// target names (node.MountTarget), for u. A volume not where its kept
// location says (removed, or made again elsewhere) is located again, once.
func (c *Client) volumeRoot(target string, u user.User) (*Node, error) {
	name, rw, ro := node.MountTarget(target)
	if !rw && !ro {
		// The read-only copy once there is one (released).
		l, err := c.sites.Locate(name, u.Token())
		if err != nil {
			return nil, err
		}
		ro = len(l.Ro) > 0 && l.RoId != 0
	}
	if ro {
		name += node.ReadOnlySuffix
	}
	for again := false; ; again = true {
		at, err := c.sites.Of(name, u.Token())
		if err != nil {
			return nil, err
		}
		n, err := c.rootOf(at, name, u)
		if err == nil || again || !c.sites.Stale(name, err) {
			return n, err
		}
	}
}

// rootOf is volumeRoot at the server holding the volume.
func (c *Client) rootOf(at *site.Site, name string, u user.User) (*Node, error) {
	c.volMu.Lock()
	v := c.vols[name]
	c.volMu.Unlock()
	if v == nil {
		err := at.As(u.Token()).Call(func(ctx context.Context) (err error) {
			v, err = at.RPC.GetVolume(ctx, &pb.GetVolumeRequest{Name: name})
			return err
		})
		if err != nil {
			return nil, err
		}
		c.volMu.Lock()
		c.vols[name] = v
		c.volMu.Unlock()
	}
	n := c.node(v.Root.ToFID(), at)
	if _, err := c.fresh(n, u); err != nil {
		return nil, err
	}
	return n, nil
}
