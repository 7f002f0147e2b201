package vnode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/node"
)

// Access control is AFS's: a directory's ACL governs it and the files
// in it. The ACLs live in each volume's acls bucket, keyed by directory
// vnode. A directory without an entry has its nearest ancestor's ACL, and
// a root without one has access.DefaultACL(): so a volume made by a store
// that knew nothing of ACLs has the default everywhere, and the store
// needs no policy of its own when it makes a volume.
//
// A file's governing directory is its record's Parent: the directory it
// was made in, or last renamed into from another one. A hard link does not
// change it, so a file linked into a second directory keeps the first
// one's ACL (AFS refuses links across directories; hoard allows them and
// keeps one governing directory per file). A Parent of 0 (a record
// written before files had one), or one whose directory has been removed
// since, means the volume root.

// rootVnode is every volume's root directory.
const rootVnode = 1

// maxACLDepth bounds a walk up the directory tree: a longer one is a
// cycle, which only a corrupt store has.
const maxACLDepth = 1 << 20

// aclDir is the directory governing f, and its record.
func (v *vtx) aclDir(f node.FID) (node.FID, record, error) {
	r, err := v.get(f)
	if err != nil {
		return node.FID{}, record{}, err
	}
	if r.Type == node.TypeDir {
		return f, r, nil
	}
	if p := r.Parent; p != 0 && p != f.Vnode {
		if b := v.vnodes.Get(u64(p)); b != nil {
			pr, err := decodeRecord(b)
			if err != nil {
				return node.FID{}, record{}, fmt.Errorf("fid %v: directory %d: %w", f, p, err)
			}
			if pr.Type == node.TypeDir {
				return v.fid(p, &pr), pr, nil
			}
		}
	}
	b := v.vnodes.Get(u64(rootVnode))
	if b == nil {
		return node.FID{}, record{}, fmt.Errorf("volume %d: no root: %w", v.id, errCorrupt)
	}
	rr, err := decodeRecord(b)
	if err != nil {
		return node.FID{}, record{}, fmt.Errorf("volume %d: root: %w", v.id, err)
	}
	return v.fid(rootVnode, &rr), rr, nil
}

// acl is the ACL of directory dn (record r): its own, else its nearest
// ancestor's, else the default.
func (v *vtx) acl(dn uint64, r record) (access.ACL, error) {
	for range maxACLDepth {
		if b := v.acls.Get(u64(dn)); b != nil {
			a, err := access.DecodeACL(b)
			if err != nil {
				return nil, fmt.Errorf("directory %d.%d: %w: %v", v.id, dn, errCorrupt, err)
			}
			return a, nil
		}
		p := r.Parent
		if p == 0 {
			p = rootVnode
		}
		if dn == rootVnode || p == dn {
			return access.DefaultACL(), nil
		}
		b := v.vnodes.Get(u64(p))
		if b == nil {
			return nil, fmt.Errorf("directory %d.%d: parent %d is gone: %w", v.id, dn, p, errCorrupt)
		}
		var err error
		if r, err = decodeRecord(b); err != nil {
			return nil, fmt.Errorf("directory %d.%d: %w", v.id, p, err)
		}
		dn = p
	}
	return nil, fmt.Errorf("volume %d: directories' parents make a cycle: %w", v.id, errCorrupt)
}

// inheritACL gives new directory vn a copy of its parent's ACL, as AFS
// does; a parent without one of its own leaves vn inheriting too.
func (v *vtx) inheritACL(parent, vn uint64) error {
	b := v.acls.Get(u64(parent))
	if b == nil {
		return nil
	}
	// A copy: the value is the database's memory, valid only while the
	// transaction runs.
	return v.acls.Put(u64(vn), bytes.Clone(b))
}

// keepACL is called before directory vn (record r) moves to another
// parent: one without an ACL of its own would take its new ancestors',
// so it keeps the one it has (in AFS a directory's ACL moves with it).
func (v *vtx) keepACL(vn uint64, r record) error {
	if v.acls.Get(u64(vn)) != nil {
		return nil
	}
	a, err := v.acl(vn, r)
	if err != nil {
		return err
	}
	return v.acls.Put(u64(vn), a.Encode())
}

// aclDirOf is the directory whose ACL governs f: f itself when a
// directory, else its record's Parent (0: the volume root).
func (s *Store) aclDirOf(f node.FID) (node.FID, error) {
	var dir node.FID
	err := s.view(f.Volume, func(v *vtx) (err error) {
		dir, _, err = v.aclDir(f)
		return err
	})
	return dir, err
}

// aclOf is directory dir's ACL: its own entry, else (walking Parent links
// up to the root) the nearest ancestor's, else access.DefaultACL().
func (s *Store) aclOf(dir node.FID) (access.ACL, error) {
	var a access.ACL
	err := s.view(dir.Volume, func(v *vtx) error {
		r, err := v.getDir(dir)
		if err != nil {
			return err
		}
		a, err = v.acl(dir.Vnode, r)
		return err
	})
	return a, err
}

// SetACL stores a as dir's ACL (ENOTDIR if not a directory, EINVAL if a
// is not well formed: see access.ACL.Check), changes dir's ctime, and
// returns dir's status. Its data version stays: no entry changed.
func (s *Store) SetACL(dir node.FID, a access.ACL) (node.Status, error) {
	if err := a.Check(); err != nil {
		return node.Status{}, fmt.Errorf("set acl of %v: %w", dir, err)
	}
	b := a.Encode()
	var st node.Status
	err := s.mutate(dir.Volume, func(v *vtx) error {
		r, err := v.getDir(dir)
		if err != nil {
			return err
		}
		if err := v.acls.Put(u64(dir.Vnode), b); err != nil {
			return err
		}
		r.Ctime = v.now
		st = v.statusOf(&r, dir.Vnode)
		return v.put(dir.Vnode, &r)
	})
	return st, err
}

// GoverningACL is aclDirOf then aclOf in one read transaction, for the
// server's check of every request.
func (s *Store) GoverningACL(f node.FID) (dir node.FID, a access.ACL, err error) {
	err = s.view(f.Volume, func(v *vtx) error {
		var r record
		if dir, r, err = v.aclDir(f); err != nil {
			return err
		}
		a, err = v.acl(dir.Vnode, r)
		return err
	})
	return dir, a, err
}

// --- groups ---

// MaxMembers bounds a group: its members are one value, rewritten by
// every change.
const MaxMembers = 4096

// Group is a named set of users, as AFS's protection server keeps them.
type Group struct {
	Name, Owner string
	Members     []string // sorted
}

// The groups bucket maps a group's name to its owner and members; the
// memberof bucket maps a user to the sorted names of the groups they are
// in, so that a request's identity costs one Get. Both change in the same
// transactions.

// putStrings encodes ss, each at most 255 bytes, as length then bytes.
func putStrings(ss ...string) []byte {
	n := 0
	for _, s := range ss {
		n += 1 + len(s)
	}
	b := make([]byte, 0, n)
	for _, s := range ss {
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	return b
}

func getStrings(b []byte) ([]string, error) {
	var ss []string
	for len(b) > 0 {
		end := 1 + int(b[0])
		if len(b) < end {
			return nil, errCorrupt
		}
		ss = append(ss, string(b[1:end]))
		b = b[end:]
	}
	return ss, nil
}

func getGroup(tx *bolt.Tx, name string) (Group, bool, error) {
	b := tx.Bucket(bktGroups).Get([]byte(name))
	if b == nil {
		return Group{}, false, nil
	}
	g, err := decodeGroup(name, b)
	return g, err == nil, err
}

func decodeGroup(name string, b []byte) (Group, error) {
	ss, err := getStrings(b)
	if err != nil || len(ss) == 0 {
		return Group{}, fmt.Errorf("group %q: %w", name, errCorrupt)
	}
	return Group{Name: name, Owner: ss[0], Members: ss[1:]}, nil
}

func putGroup(tx *bolt.Tx, g Group) error {
	return tx.Bucket(bktGroups).Put([]byte(g.Name), putStrings(append([]string{g.Owner}, g.Members...)...))
}

func noGroup(name string) error { return fmt.Errorf("group %q: %w", name, syscall.ENOENT) }

// memberOf is the groups user is in, by the index.
func memberOf(tx *bolt.Tx, user string) ([]string, error) {
	ss, err := getStrings(tx.Bucket(bktMemberOf).Get([]byte(user)))
	if err != nil {
		return nil, fmt.Errorf("groups of %q: %w", user, err)
	}
	return ss, nil
}

// setMemberOf adds (in) or removes group from user's index entry.
func setMemberOf(tx *bolt.Tx, user, group string, in bool) error {
	gs, err := memberOf(tx, user)
	if err != nil {
		return err
	}
	i, found := slices.BinarySearch(gs, group)
	switch {
	case in && !found:
		gs = slices.Insert(gs, i, group)
	case !in && found:
		gs = slices.Delete(gs, i, i+1)
	default:
		return nil
	}
	idx := tx.Bucket(bktMemberOf)
	if len(gs) == 0 {
		return idx.Delete([]byte(user))
	}
	return idx.Put([]byte(user), putStrings(gs...))
}

// CreateGroup makes group name owned by owner, with no members: EEXIST if
// it exists, EINVAL for a bad name or a name in the "system:" space.
func (s *Store) CreateGroup(name, owner string) error {
	if err := access.CheckName(name); err != nil {
		return err
	}
	if access.IsSystem(name) {
		return fmt.Errorf("group %q: system groups are not made: %w", name, syscall.EINVAL)
	}
	if err := access.CheckName(owner); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		if tx.Bucket(bktGroups).Get([]byte(name)) != nil {
			return fmt.Errorf("group %q: %w", name, syscall.EEXIST)
		}
		return putGroup(tx, Group{Name: name, Owner: owner})
	})
}

// DeleteGroup removes group name and its members' index entries; ENOENT
// if there is none.
func (s *Store) DeleteGroup(name string) error {
	return s.update(func(tx *bolt.Tx) error {
		g, ok, err := getGroup(tx, name)
		if err != nil {
			return err
		}
		if !ok {
			return noGroup(name)
		}
		for _, m := range g.Members {
			if err := setMemberOf(tx, m, name, false); err != nil {
				return err
			}
		}
		return tx.Bucket(bktGroups).Delete([]byte(name))
	})
}

// AddMember adds user to group: ENOENT if there is no such group, EMLINK
// past MaxMembers, nothing if user is a member already.
func (s *Store) AddMember(group, user string) error {
	if err := access.CheckName(user); err != nil {
		return err
	}
	if access.IsSystem(user) {
		return fmt.Errorf("group %q: %s is no user: %w", group, user, syscall.EINVAL)
	}
	return s.member(group, user, true)
}

// RemoveMember removes user from group: ENOENT if there is no such group,
// nothing if user is no member (so that a retry succeeds).
func (s *Store) RemoveMember(group, user string) error { return s.member(group, user, false) }

// member makes user a member of group, or not, in one transaction with
// the user's index of groups.
func (s *Store) member(group, user string, in bool) error {
	return s.update(func(tx *bolt.Tx) error {
		g, ok, err := getGroup(tx, group)
		if err != nil {
			return err
		}
		if !ok {
			return noGroup(group)
		}
		i, found := slices.BinarySearch(g.Members, user)
		switch {
		case found == in:
			return nil
		case in && len(g.Members) >= MaxMembers:
			return fmt.Errorf("group %q has %d members, the most: %w", group, len(g.Members), syscall.EMLINK)
		case in:
			g.Members = slices.Insert(g.Members, i, user)
		default:
			g.Members = slices.Delete(g.Members, i, i+1)
		}
		if err := putGroup(tx, g); err != nil {
			return err
		}
		return setMemberOf(tx, user, group, in)
	})
}

// Groups lists every group, sorted by name.
func (s *Store) Groups() ([]Group, error) {
	var gs []Group
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bktGroups).ForEach(func(k, b []byte) error {
			g, err := decodeGroup(string(k), b)
			gs = append(gs, g)
			return err
		})
	})
	return gs, err
}

// Group is group name; ENOENT if there is none.
func (s *Store) Group(name string) (Group, error) {
	var g Group
	err := s.db.View(func(tx *bolt.Tx) error {
		var ok bool
		var err error
		if g, ok, err = getGroup(tx, name); err == nil && !ok {
			err = noGroup(name)
		}
		return err
	})
	return g, err
}

// GroupsOf is the sorted names of the groups user is in.
func (s *Store) GroupsOf(user string) ([]string, error) {
	var gs []string
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		gs, err = memberOf(tx, user)
		return err
	})
	return gs, err
}

// --- revoked tokens ---

// MaxTokenID is the longest token id Revoke takes.
const MaxTokenID = 255

// A revocation is its expiry as seconds then nanoseconds since the Unix
// epoch (UnixNano overflows past 2262).
func putExpiry(t time.Time) []byte {
	return binary.BigEndian.AppendUint32(u64(uint64(t.Unix())), uint32(t.Nanosecond()))
}

func getExpiry(b []byte) (time.Time, error) {
	if len(b) != 12 {
		return time.Time{}, errCorrupt
	}
	return time.Unix(int64(getU64(b[:8])), int64(binary.BigEndian.Uint32(b[8:]))), nil
}

// Revoke records token id as revoked until expires (a revoked token need
// not be remembered past its expiry). Revoking it again keeps the later
// expiry.
func (s *Store) Revoke(id string, expires time.Time) error {
	if id == "" || len(id) > MaxTokenID {
		return fmt.Errorf("token id of %d bytes, 1-%d: %w", len(id), MaxTokenID, syscall.EINVAL)
	}
	return s.update(func(tx *bolt.Tx) error {
		rev := tx.Bucket(bktRevoked)
		if b := rev.Get([]byte(id)); b != nil {
			if old, err := getExpiry(b); err == nil && old.After(expires) {
				return nil
			}
		}
		return rev.Put([]byte(id), putExpiry(expires))
	})
}

// Revoked reports whether token id was revoked.
func (s *Store) Revoked(id string) (bool, error) {
	if id == "" || len(id) > MaxTokenID {
		return false, nil
	}
	var revoked bool
	err := s.db.View(func(tx *bolt.Tx) error {
		revoked = tx.Bucket(bktRevoked).Get([]byte(id)) != nil
		return nil
	})
	return revoked, err
}

// revocations lists the revoked tokens with their expiries.
func (s *Store) revocations() (map[string]time.Time, error) {
	m := map[string]time.Time{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bktRevoked).ForEach(func(k, b []byte) error {
			t, err := getExpiry(b)
			if err != nil {
				return fmt.Errorf("revoked token %q: %w", k, err)
			}
			m[string(k)] = t
			return nil
		})
	})
	return m, err
}

// PruneRevoked forgets the revocations of tokens that expired before now.
func (s *Store) PruneRevoked(now time.Time) error {
	return s.update(func(tx *bolt.Tx) error {
		rev := tx.Bucket(bktRevoked)
		var drop [][]byte
		err := rev.ForEach(func(k, b []byte) error {
			// A revocation unread is kept: forgetting it would let the token in.
			if t, err := getExpiry(b); err == nil && t.Before(now) {
				drop = append(drop, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range drop {
			if err := rev.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}
