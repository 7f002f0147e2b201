package vnode

import (
	"bytes"
	"encoding/binary"
	"fmt"
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

// --- principals kept before the cell's registry ---

// Before the cell's principal registry (package principal), a server
// kept its groups and revoked tokens in its own store, and ACLs named
// their principals. The server hands them over once, at its first start
// with the registry (server.Migrate): OldPrincipals reads them, NumberACLs
// rewrites the ACLs, DropOldPrincipals forgets the rest.

// OldGroup is a group as a server's store kept it.
type OldGroup struct {
	Name, Owner string
	Members     []string
}

// getStrings decodes what the old groups bucket held: lengths then bytes.
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

// OldPrincipals is what the store kept of groups and revoked tokens (with
// their expiries) before the registry; nothing once dropped.
func (s *Store) OldPrincipals() (groups []OldGroup, revoked map[string]time.Time, err error) {
	revoked = map[string]time.Time{}
	err = s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bktGroups); b != nil {
			if err := b.ForEach(func(k, v []byte) error {
				ss, err := getStrings(v)
				if err != nil || len(ss) == 0 {
					return fmt.Errorf("group %q: %w", k, errCorrupt)
				}
				groups = append(groups, OldGroup{Name: string(k), Owner: ss[0], Members: ss[1:]})
				return nil
			}); err != nil {
				return err
			}
		}
		if b := tx.Bucket(bktRevoked); b != nil {
			return b.ForEach(func(k, v []byte) error {
				if len(v) != 12 {
					return fmt.Errorf("revoked token %q: %w", k, errCorrupt)
				}
				revoked[string(k)] = time.Unix(int64(getU64(v[:8])), int64(binary.BigEndian.Uint32(v[8:])))
				return nil
			})
		}
		return nil
	})
	return groups, revoked, err
}

// DropOldPrincipals forgets the groups and revocations OldPrincipals read,
// once the registry holds them.
func (s *Store) DropOldPrincipals() error {
	return s.update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bktGroups, bktMemberOf, bktRevoked} {
			if tx.Bucket(b) != nil {
				if err := tx.DeleteBucket(b); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// NumberACLs rewrites every ACL that names its principals
// (access.ErrNamedACL) to name them by number, asking id for each name;
// an entry whose name id does not know is dropped, and its name is
// returned, once, so that its loss is said.
func (s *Store) NumberACLs(id func(name string) (access.ID, bool)) (dropped []string, err error) {
	seen := map[string]bool{}
	err = s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bktVolumes).ForEachBucket(func(k []byte) error {
			acls := tx.Bucket(bktVolumes).Bucket(k).Bucket(bktACLs)
			if acls == nil {
				return nil
			}
			var keys, vals [][]byte
			if err := acls.ForEach(func(dn, b []byte) error {
				named, err := access.NamedACL(b)
				if err != nil {
					return nil // numbered already (or corrupt: reading it says so)
				}
				var a access.ACL
				for _, e := range named {
					if n, ok := id(e.Who); ok {
						a = a.Set(n, e.Rights)
					} else if !seen[e.Who] {
						seen[e.Who] = true
						dropped = append(dropped, e.Who)
					}
				}
				keys, vals = append(keys, bytes.Clone(dn)), append(vals, a.Encode())
				return nil
			}); err != nil {
				return err
			}
			for i := range keys {
				if err := acls.Put(keys[i], vals[i]); err != nil {
					return err
				}
			}
			return nil
		})
	})
	return dropped, err
}
