package server

import (
	"fmt"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/vnode"
)

// Backend is what a Server serves: a file server's own vnode store
// (Local), or a proxy's cache of a distant server. The Server adds
// sessions, callback promises, delegations and the wire format; a Backend
// only answers for the files.
type Backend interface {
	// Epoch changes at every start: clients of an earlier one reconnect.
	Epoch() uint64
	// MaxFileSize is the largest file size stored (0: unknown), told to
	// clients in the Welcome so that they refuse larger ones at once.
	MaxFileSize() uint64

	CreateVolume(name string) (node.Volume, error)
	VolumeByName(name string) (node.Volume, error)
	VolumeByID(id uint64) (node.Volume, error)
	Volumes() ([]node.Volume, error)
	// SetQuota bounds the bytes of a volume's files (0: no bound).
	SetQuota(name string, quota uint64) (node.Volume, error)

	GetStatus(f node.FID) (node.Status, error)
	Lookup(dir node.FID, name string) (child, d node.Status, err error)
	ReadDir(dir node.FID, cookie uint64, max int) (ents []node.DirEntry, eof bool, d node.Status, err error)
	Create(dir node.FID, name string, t node.Type, a node.Attr, target string, excl bool, op node.Op) (st, d node.Status, created bool, err error)
	Link(dir node.FID, name string, target node.FID, op node.Op) (st, d node.Status, err error)
	Remove(dir node.FID, name string, dirOnly bool, op node.Op) (d, st node.Status, err error)
	Rename(src node.FID, sname string, dst node.FID, dname, keep string, op node.Op) (node.RenameResult, error)
	SetAttr(f node.FID, c node.Change) (node.Status, error)
	// Reserve and CreateReserved serve directory delegations
	// (dirdeleg.go); a backend without them fails both with EOPNOTSUPP,
	// and its Delegation grants none on directories.
	Reserve(volume uint64, n int) ([]node.FID, error)
	CreateReserved(dir node.FID, fs []node.Reserved, rm []node.Removed, op node.Op) (made, removed []node.Status, d node.Status, err error)
	StatFS(volume uint64) (node.FSStat, error)
	// GoverningACL is the directory whose ACL governs f, and that ACL;
	// SetACLEntry gives who the rights r in directory dir (0: none) and
	// returns its ACL as it is now: a file server's store goes by who.ID,
	// a proxy passes who.Who on to its origin.
	GoverningACL(f node.FID) (node.FID, access.ACL, error)
	SetACLEntry(dir node.FID, who access.Entry, r access.Rights) (access.ACL, error)
	// GetXattr, ListXattr, SetXattr and RemoveXattr serve f's extended
	// attributes of the user namespace; a change returns f's status.
	GetXattr(f node.FID, name string) ([]byte, error)
	ListXattr(f node.FID) ([]string, error)
	SetXattr(f node.FID, name string, val []byte, flags uint32) (node.Status, error)
	RemoveXattr(f node.FID, name string) (node.Status, error)

	// ReadAt reads file bytes for user (the client's name until there
	// is authentication) along with the status of the version they
	// belong to.
	ReadAt(f node.FID, p []byte, off int64, user string) (n int, st node.Status, err error)
	// BeginUpdate starts staging a store based on version base, made
	// under a delegation of this server's if delegated.
	BeginUpdate(f node.FID, base uint64, delegated bool) (Update, error)
	// PromiseLimit bounds a promise on f: a proxy may promise no longer
	// than the promise it holds itself (0: none at all).
	PromiseLimit(f node.FID) time.Duration
	// Delegation is the strongest delegation an open of f (for writing,
	// if write) may be given: a proxy delegates only what it holds from
	// its origin, and asks for it here. still, if not nil, reports
	// whether that is held yet; the server asks under the lock it grants
	// under, so a delegation taken back after that finds the grant.
	Delegation(f node.FID, write bool) (kind callback.DelegKind, still func() bool)
}

// Update is one staged store, committed as one new data version.
type Update interface {
	WriteAt(p []byte, off int64) error
	// Truncate cuts the file before the writes land; SetSize sets its size
	// after them.
	Truncate(n uint64)
	SetSize(n uint64)
	// Commit makes the new version; op (if not empty) names the store,
	// which is made only once however often it is sent (node.Op).
	Commit(sync bool, mtime time.Time, op node.Op) (node.Status, error)
	Abort()
}

// Local is the Backend of a file server: its own vnode store.
func Local(store *vnode.Store) Backend { return local{store} }

type local struct{ *vnode.Store }

// StatFS is the data directory's file system, shrunk to the volume's
// quota if it has one.
func (l local) StatFS(volume uint64) (node.FSStat, error) {
	fs, err := l.Store.StatFS()
	if err != nil {
		return fs, err
	}
	v, err := l.Store.VolumeByID(volume)
	if err != nil {
		return node.FSStat{}, err
	}
	return withQuota(fs, v), nil
}

func (l local) ReadAt(f node.FID, p []byte, off int64, _ string) (int, node.Status, error) {
	return l.Store.ReadAt(f, p, off)
}

func (l local) BeginUpdate(f node.FID, _ uint64, _ bool) (Update, error) {
	u, err := l.Store.BeginUpdate(f)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return u, nil
}

func (local) PromiseLimit(node.FID) time.Duration { return 1<<63 - 1 }

// SetACLEntry reads and writes dir's ACL; the server holds dir busy
// across it, and ACL changes are an administrator's, rare and slow.
func (l local) SetACLEntry(dir node.FID, who access.Entry, r access.Rights) (access.ACL, error) {
	if who.ID == 0 {
		return nil, fmt.Errorf("set acl %s: this server has no principal registry: %w", who.Who, syscall.ENOTSUP)
	}
	_, cur, err := l.Store.GoverningACL(dir)
	if err != nil {
		return nil, err
	}
	acl := cur.Set(who.ID, r)
	if len(acl) > access.MaxEntries {
		return nil, fmt.Errorf("set acl: more than %d entries: %w", access.MaxEntries, syscall.ENOSPC)
	}
	if _, err := l.Store.SetACL(dir, acl); err != nil {
		return nil, err
	}
	return acl, nil
}

func (local) Delegation(node.FID, bool) (callback.DelegKind, func() bool) {
	return callback.DelegWrite, nil
}
