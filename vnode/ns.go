package vnode

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/node"
)

// vtx is one transaction's view of one volume.
type vtx struct {
	tx      *bolt.Tx
	id      uint64
	vnodes  *bolt.Bucket
	names   *bolt.Bucket
	cookies *bolt.Bucket
	meta    *bolt.Bucket
	inline  *bolt.Bucket // small files' bytes (inline.go)
	acls    *bolt.Bucket // directories' ACLs (acl.go)
	xattrs  *bolt.Bucket // extended attributes (xattr.go)
	now     int64
	garbage bool   // a data file was queued for deletion
	dir     string // the store's directory, where data files are
}

func openVol(tx *bolt.Tx, id uint64) (*vtx, error) {
	vb := tx.Bucket(bktVolumes).Bucket(u64(id))
	if vb == nil {
		return nil, &NoVolumeError{id}
	}
	return &vtx{tx: tx, id: id, vnodes: vb.Bucket(bktVnodes), names: vb.Bucket(bktNames),
		cookies: vb.Bucket(bktCookies), meta: vb.Bucket(bktVolMeta), inline: vb.Bucket(bktInline), acls: vb.Bucket(bktACLs), xattrs: vb.Bucket(bktXattrs),
		now: time.Now().UnixNano()}, nil
}

// get loads the vnode f names. A FID whose vnode is gone or whose uniquifier
// differs is stale: the client holds a name for a file that no longer exists.
func (v *vtx) get(f node.FID) (record, error) {
	if f.Volume != v.id {
		return record{}, fmt.Errorf("fid %v: %w", f, syscall.EXDEV)
	}
	b := v.vnodes.Get(u64(f.Vnode))
	if b == nil {
		return record{}, fmt.Errorf("fid %v: %w", f, syscall.ESTALE)
	}
	r, err := decodeRecord(b)
	if err != nil {
		return r, fmt.Errorf("fid %v: %w", f, err)
	}
	if r.Unique != f.Unique {
		return record{}, fmt.Errorf("fid %v: %w", f, syscall.ESTALE)
	}
	return r, nil
}

func (v *vtx) getDir(f node.FID) (record, error) {
	r, err := v.get(f)
	if err == nil && r.Type != node.TypeDir {
		err = fmt.Errorf("fid %v: %w", f, syscall.ENOTDIR)
	}
	return r, err
}

func (v *vtx) put(vnode uint64, r *record) error { return v.vnodes.Put(u64(vnode), r.encode()) }

func (v *vtx) fid(vnode uint64, r *record) node.FID {
	return node.FID{Volume: v.id, Vnode: vnode, Unique: r.Unique}
}

func (v *vtx) lookup(dir uint64, name string) (entry, bool, error) {
	b := v.names.Get(nameKey(dir, name))
	if b == nil {
		return entry{}, false, nil
	}
	e, err := decodeEntry(b)
	return e, err == nil, err
}

// addEntry links name in dir to child; the directory's data changes.
func (v *vtx) addEntry(dir uint64, d *record, name string, child uint64, t node.Type) error {
	d.Cookie++
	e := entry{Vnode: child, Cookie: d.Cookie, Type: t}
	if err := v.names.Put(nameKey(dir, name), e.encode()); err != nil {
		return err
	}
	return v.cookies.Put(cookieKey(dir, e.Cookie), []byte(name))
}

func (v *vtx) delEntry(dir uint64, name string, e entry) error {
	if err := v.names.Delete(nameKey(dir, name)); err != nil {
		return err
	}
	return v.cookies.Delete(cookieKey(dir, e.Cookie))
}

// touchDir records one change to a directory's data: every operation bumps
// each directory it changes exactly once, so a client that sees a version
// one past its own knows that nobody else came between.
func (v *vtx) touchDir(d *record) {
	d.DV++
	d.Mtime, d.Ctime = v.now, v.now
	d.Size = d.Cookie // grows with entries; only informative for directories
}

func (v *vtx) alloc(r *record) (uint64, error) {
	vn := getU64(v.meta.Get(keyNextVnode)) + 1
	uq := getU64(v.meta.Get(keyUnique)) + 1
	if err := v.meta.Put(keyNextVnode, u64(vn)); err != nil {
		return 0, err
	}
	if err := v.meta.Put(keyUnique, u64(uq)); err != nil {
		return 0, err
	}
	r.Unique = uq
	if err := v.countVnode(1); err != nil {
		return 0, err
	}
	return vn, v.put(vn, r)
}

// unlinkVnode drops one link; the last one frees the vnode and queues its
// data file for deletion once the transaction has committed.
func (v *vtx) unlinkVnode(vnode uint64, r *record) error {
	if r.Type == node.TypeDir {
		r.Nlink = 0
	} else if r.Nlink > 0 {
		r.Nlink--
	}
	r.Ctime = v.now
	if r.Nlink > 0 {
		return v.put(vnode, r)
	}
	if err := v.vnodes.Delete(u64(vnode)); err != nil {
		return err
	}
	if err := v.dropXattrs(vnode); err != nil {
		return err
	}
	if err := v.countVnode(-1); err != nil {
		return err
	}
	if r.Type == node.TypeFile {
		if err := v.resize(v.charge(r, vnode), 0); err != nil {
			return err
		}
	}
	if r.Type == node.TypeDir {
		return v.acls.Delete(u64(vnode))
	}
	if r.DataGen == genInline {
		return v.inline.Delete(u64(vnode))
	}
	if r.DataGen != 0 {
		v.garbage = true
		return v.tx.Bucket(bktGarbage).Put([]byte(dataRel(v.id, vnode, r.DataGen)), append(u64(v.id), u64(vnode)...))
	}
	return nil
}

// dataRel is a data file's path relative to the data directory. It is built
// from numbers only: nothing from the wire ever becomes part of a path.
func dataRel(vol, vnode, gen uint64) string {
	return filepath.Join("data", strconv.FormatUint(vol, 10), fmt.Sprintf("%02x", vnode&0xff),
		strconv.FormatUint(vnode, 10)+"."+strconv.FormatUint(gen, 16))
}

// isEmptyDir reports whether dir has no entries.
func (v *vtx) isEmptyDir(dir uint64) bool {
	k, _ := v.names.Cursor().Seek(u64(dir))
	return k == nil || !bytes.HasPrefix(k, u64(dir))
}

// --- operations ---

// mutate runs fn in one transaction on volume vol, then deletes data files
// the transaction freed.
func (s *Store) mutate(vol uint64, fn func(v *vtx) error) error {
	var freed bool
	err := s.update(func(tx *bolt.Tx) error {
		v, err := openVol(tx, vol)
		if err != nil {
			return err
		}
		v.dir = s.dir
		err = fn(v)
		freed = v.garbage
		return err
	})
	if err == nil && freed {
		s.collectGarbage()
	}
	return err
}

func (s *Store) view(vol uint64, fn func(v *vtx) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		v, err := openVol(tx, vol)
		if err != nil {
			return err
		}
		v.dir = s.dir
		return fn(v)
	})
}

// GetStatus returns the status of f.
func (s *Store) GetStatus(f node.FID) (node.Status, error) {
	var st node.Status
	err := s.view(f.Volume, func(v *vtx) error {
		r, err := v.get(f)
		st = v.statusOf(&r, f.Vnode)
		return err
	})
	return st, err
}

// Lookup finds name in dir; it returns the child's and the directory's status.
func (s *Store) Lookup(dir node.FID, name string) (child, d node.Status, err error) {
	if err := node.CheckName(name); err != nil {
		return child, d, err
	}
	err = s.view(dir.Volume, func(v *vtx) error {
		dr, err := v.getDir(dir)
		if err != nil {
			return err
		}
		d = v.statusOf(&dr, dir.Vnode)
		e, cr, err := v.entry(dir.Vnode, name)
		if err != nil {
			return err
		}
		child = v.statusOf(&cr, e.Vnode)
		return nil
	})
	return child, d, err
}

// Create makes name in dir as a file, directory, symlink or mount point. An
// existing file is returned with created=false unless excl (O_CREAT without
// O_EXCL); any other existing entry is EEXIST. A repeated op answers as
// the first one did, with the statuses as they are now and created=false:
// name may have been changed since, so the reply must not say it names st
// at d's version.
func (s *Store) Create(dir node.FID, name string, t node.Type, a node.Attr, target string, excl bool, op node.Op) (st, d node.Status, created bool, err error) {
	if err := node.CheckName(name); err != nil {
		return st, d, false, err
	}
	switch {
	case t == node.TypeFile || t == node.TypeDir || t.Special():
		target = ""
	case t == node.TypeSymlink || t == node.TypeMountPoint:
		if err := node.CheckTarget(target); err != nil {
			return st, d, false, err
		}
	default:
		return st, d, false, fmt.Errorf("create %s: type %v: %w", name, t, syscall.EINVAL)
	}
	err = s.mutate(dir.Volume, func(v *vtx) error {
		created = false // a run may be repeated (group)
		dr, err := v.getDir(dir)
		if err != nil {
			return err
		}
		if o, ok := v.findOp(op); ok && len(o.vnodes) == 1 {
			st, d = v.statusNow(o.vnodes[0]), v.statusOf(&dr, dir.Vnode)
			return nil
		}
		if e, ok, err := v.lookup(dir.Vnode, name); err != nil {
			return err
		} else if ok {
			if excl || t != node.TypeFile || e.Type != node.TypeFile {
				return fmt.Errorf("%s: %w", name, syscall.EEXIST)
			}
			cr, err := decodeRecord(v.vnodes.Get(u64(e.Vnode)))
			st, d = v.statusOf(&cr, e.Vnode), v.statusOf(&dr, dir.Vnode)
			return err
		}
		r := record{Type: t, Mode: a.Mode & 0o7777, UID: a.UID, GID: a.GID, Nlink: 1, DV: 1,
			Atime: v.now, Mtime: v.now, Ctime: v.now, Target: target, Parent: dir.Vnode}
		if t == node.TypeCharDev || t == node.TypeBlockDev {
			r.Rdev = a.Rdev
		}
		switch t {
		case node.TypeDir:
			r.Nlink = 2
			dr.Nlink++
		case node.TypeSymlink, node.TypeMountPoint:
			r.Size = uint64(len(target))
		}
		vn, err := v.alloc(&r)
		if err != nil {
			return err
		}
		if t == node.TypeDir {
			if err := v.inheritACL(dir.Vnode, vn); err != nil {
				return err
			}
		}
		if err := v.addEntry(dir.Vnode, &dr, name, vn, t); err != nil {
			return err
		}
		v.touchDir(&dr)
		if err := v.put(dir.Vnode, &dr); err != nil {
			return err
		}
		st, d, created = v.statusOf(&r, vn), v.statusOf(&dr, dir.Vnode), true
		return v.recordOp(op, done{vnodes: []named{namedBy(st)}})
	})
	return st, d, created, err
}

// Link adds name in dir for the existing non-directory target. The
// target's governing directory (acl.go) stays the one it was made or last
// renamed into: a file has one ACL, whichever name it is reached by.
func (s *Store) Link(dir node.FID, name string, target node.FID, op node.Op) (st, d node.Status, err error) {
	if err := node.CheckName(name); err != nil {
		return st, d, err
	}
	if dir.Volume != target.Volume {
		return st, d, fmt.Errorf("link %s: across volumes: %w", name, syscall.EXDEV)
	}
	err = s.mutate(dir.Volume, func(v *vtx) error {
		dr, err := v.getDir(dir)
		if err != nil {
			return err
		}
		if o, ok := v.findOp(op); ok && len(o.vnodes) == 1 {
			st, d = v.statusNow(o.vnodes[0]), v.statusOf(&dr, dir.Vnode)
			return nil
		}
		tr, err := v.get(target)
		if err != nil {
			return err
		}
		if tr.Type == node.TypeDir {
			return fmt.Errorf("link %s: target is a directory: %w", name, syscall.EPERM)
		}
		if _, ok, err := v.lookup(dir.Vnode, name); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("%s: %w", name, syscall.EEXIST)
		}
		if tr.Nlink >= 65000 {
			return fmt.Errorf("link %s: %w", name, syscall.EMLINK)
		}
		tr.Nlink++
		tr.Ctime = v.now
		if err := v.put(target.Vnode, &tr); err != nil {
			return err
		}
		if err := v.addEntry(dir.Vnode, &dr, name, target.Vnode, tr.Type); err != nil {
			return err
		}
		v.touchDir(&dr)
		if err := v.put(dir.Vnode, &dr); err != nil {
			return err
		}
		st, d = v.statusOf(&tr, target.Vnode), v.statusOf(&dr, dir.Vnode)
		return v.recordOp(op, done{vnodes: []named{namedBy(st)}})
	})
	return st, d, err
}

// Remove unlinks name from dir: with dirOnly it removes only an empty
// directory (rmdir), otherwise only a non-directory (unlink). It returns the
// directory's status and the removed vnode's (Nlink 0 when it is gone).
func (s *Store) Remove(dir node.FID, name string, dirOnly bool, op node.Op) (d, st node.Status, err error) {
	if err := node.CheckName(name); err != nil {
		return d, st, err
	}
	err = s.mutate(dir.Volume, func(v *vtx) error {
		dr, err := v.getDir(dir)
		if err != nil {
			return err
		}
		if o, ok := v.findOp(op); ok && len(o.vnodes) == 1 {
			d, st = v.statusOf(&dr, dir.Vnode), v.statusNow(o.vnodes[0])
			return nil
		}
		e, r, err := v.entry(dir.Vnode, name)
		if err != nil {
			return err
		}
		if err := v.unlinkEntry(dir.Vnode, &dr, name, e, &r, dirOnly); err != nil {
			return err
		}
		v.touchDir(&dr)
		if err := v.put(dir.Vnode, &dr); err != nil {
			return err
		}
		d, st = v.statusOf(&dr, dir.Vnode), v.statusOf(&r, e.Vnode)
		return v.recordOp(op, done{vnodes: []named{namedBy(st)}})
	})
	return d, st, err
}

// entry is name's entry in directory dir, and the record of the vnode it
// names: ENOENT if there is none.
func (v *vtx) entry(dir uint64, name string) (entry, record, error) {
	e, ok, err := v.lookup(dir, name)
	if err != nil {
		return e, record{}, err
	}
	if !ok {
		return e, record{}, fmt.Errorf("%s: %w", name, syscall.ENOENT)
	}
	r, err := decodeRecord(v.vnodes.Get(u64(e.Vnode)))
	return e, r, err
}

// unlinkEntry removes name, entry e of vnode record r, from directory dir
// (record dr, one link fewer for a subdirectory) and unlinks the vnode,
// refusing what rmdir, unlink and a rename over it refuse: a file where
// a directory is wanted (ENOTDIR), a directory where a file is (EISDIR),
// a directory not empty. r is left as unlinked.
func (v *vtx) unlinkEntry(dir uint64, dr *record, name string, e entry, r *record, wantDir bool) error {
	switch {
	case wantDir && r.Type != node.TypeDir:
		return fmt.Errorf("%s: %w", name, syscall.ENOTDIR)
	case !wantDir && r.Type == node.TypeDir:
		return fmt.Errorf("%s: %w", name, syscall.EISDIR)
	case r.Type == node.TypeDir && !v.isEmptyDir(e.Vnode):
		return fmt.Errorf("%s: %w", name, syscall.ENOTEMPTY)
	}
	if err := v.delEntry(dir, name, e); err != nil {
		return err
	}
	if r.Type == node.TypeDir {
		dr.Nlink--
	}
	return v.unlinkVnode(e.Vnode, r)
}

// keepReplaced moves name, entry e of file record r, to keep in directory
// dir (record dr), for a rename that replaces it: the file keeps its link.
func (v *vtx) keepReplaced(dir uint64, dr *record, name, keep string, e entry, r *record) error {
	if _, taken, err := v.lookup(dir, keep); err != nil {
		return err
	} else if taken {
		return fmt.Errorf("%s: %w", keep, syscall.EEXIST)
	}
	if err := v.delEntry(dir, name, e); err != nil {
		return err
	}
	r.Ctime = v.now
	if err := v.put(e.Vnode, r); err != nil {
		return err
	}
	return v.addEntry(dir, dr, keep, e.Vnode, e.Type)
}

// Rename moves src/sname to dst/dname atomically, replacing an existing
// target as POSIX rename(2) does. If keep is set, a file the rename
// replaces is not unlinked but moved to dst/keep in the same change: a
// client hides a file it has open so, and a rename that fails leaves the
// file where it was.
func (s *Store) Rename(src node.FID, sname string, dst node.FID, dname, keep string, op node.Op) (res node.RenameResult, err error) {
	if err := node.CheckName(sname); err != nil {
		return res, err
	}
	if err := node.CheckName(dname); err != nil {
		return res, err
	}
	if keep != "" {
		if err := node.CheckName(keep); err != nil {
			return res, err
		}
	}
	if src.Volume != dst.Volume {
		return res, fmt.Errorf("rename %s: across volumes: %w", sname, syscall.EXDEV)
	}
	err = s.mutate(src.Volume, func(v *vtx) error {
		res = node.RenameResult{} // a run may be repeated (group)
		sd, err := v.getDir(src)
		if err != nil {
			return err
		}
		dd := sd
		same := src == dst
		if !same {
			if dd, err = v.getDir(dst); err != nil {
				return err
			}
		}
		if o, ok := v.findOp(op); ok && len(o.vnodes) >= 1 {
			res = node.RenameResult{SrcDir: v.statusOf(&sd, src.Vnode), DstDir: v.statusOf(&dd, dst.Vnode), Moved: v.statusNow(o.vnodes[0])}
			if len(o.vnodes) == 2 {
				rst := v.statusNow(o.vnodes[1])
				res.Replaced = &rst
			}
			return nil
		}
		se, mr, err := v.entry(src.Vnode, sname)
		if err != nil {
			return err
		}
		de, exists, err := v.lookup(dst.Vnode, dname)
		if err != nil {
			return err
		}
		if exists && de.Vnode == se.Vnode {
			// Both names already refer to the same vnode: POSIX says do nothing.
			res = node.RenameResult{SrcDir: v.statusOf(&sd, src.Vnode), DstDir: v.statusOf(&dd, dst.Vnode), Moved: v.statusOf(&mr, se.Vnode)}
			return nil
		}
		isDir := mr.Type == node.TypeDir
		if isDir && !same {
			// A directory may not move into its own subtree.
			for p := dst.Vnode; ; {
				if p == se.Vnode {
					return fmt.Errorf("rename %s: into its own subtree: %w", sname, syscall.EINVAL)
				}
				pr, err := decodeRecord(v.vnodes.Get(u64(p)))
				if err != nil {
					return err
				}
				if pr.Parent == p {
					break
				}
				p = pr.Parent
			}
		}
		if exists {
			rr, err := decodeRecord(v.vnodes.Get(u64(de.Vnode)))
			if err != nil {
				return err
			}
			if keep != "" && !isDir && rr.Type != node.TypeDir {
				err = v.keepReplaced(dst.Vnode, &dd, dname, keep, de, &rr)
			} else {
				err = v.unlinkEntry(dst.Vnode, &dd, dname, de, &rr, isDir)
			}
			if err != nil {
				return err
			}
			rst := v.statusOf(&rr, de.Vnode)
			res.Replaced = &rst
		}
		if err := v.delEntry(src.Vnode, sname, se); err != nil {
			return err
		}
		if err := v.addEntry(dst.Vnode, &dd, dname, se.Vnode, se.Type); err != nil {
			return err
		}
		v.touchDir(&dd)
		if !same {
			v.touchDir(&sd)
		}
		if isDir && !same {
			if err := v.keepACL(se.Vnode, mr); err != nil {
				return err
			}
			sd.Nlink--
			dd.Nlink++
		}
		if !same {
			// A file moved to another directory is governed by that
			// one's ACL from now on (acl.go).
			mr.Parent = dst.Vnode
		}
		mr.Ctime = v.now
		if err := v.put(se.Vnode, &mr); err != nil {
			return err
		}
		if !same {
			if err := v.put(src.Vnode, &sd); err != nil {
				return err
			}
		} else {
			sd = dd
		}
		if err := v.put(dst.Vnode, &dd); err != nil {
			return err
		}
		res.SrcDir, res.DstDir, res.Moved = v.statusOf(&sd, src.Vnode), v.statusOf(&dd, dst.Vnode), v.statusOf(&mr, se.Vnode)
		o := done{vnodes: []named{namedBy(res.Moved)}}
		if res.Replaced != nil {
			o.vnodes = append(o.vnodes, namedBy(*res.Replaced))
		}
		return v.recordOp(op, o)
	})
	return res, err
}

// SetAttr changes status fields; a size change is a data change and goes
// through the same staged commit as a store.
func (s *Store) SetAttr(f node.FID, c node.Change) (node.Status, error) {
	if c.Mask&node.SetSize != 0 {
		u, err := s.BeginUpdate(f)
		if err != nil {
			return node.Status{}, err
		}
		u.SetSize(c.Size)
		st, err := u.Commit(true, time.Time{}, "")
		if err != nil || c.Mask&^node.SetSize == 0 {
			return st, err
		}
	}
	var st node.Status
	err := s.mutate(f.Volume, func(v *vtx) error {
		r, err := v.get(f)
		if err != nil {
			return err
		}
		if c.Mask&node.SetMode != 0 {
			r.Mode = c.Mode & 0o7777
		}
		if c.Mask&node.SetUID != 0 {
			r.UID = c.UID
		}
		if c.Mask&node.SetGID != 0 {
			r.GID = c.GID
		}
		if c.Mask&node.SetAtime != 0 {
			r.Atime = c.Atime.UnixNano()
		}
		if c.Mask&node.SetMtime != 0 {
			r.Mtime = c.Mtime.UnixNano()
		}
		r.Ctime = v.now
		st = v.statusOf(&r, f.Vnode)
		return v.put(f.Vnode, &r)
	})
	return st, err
}

// ReadDir lists up to max entries of dir after cookie (0: from the start).
// Cookies are per-entry sequence numbers, stable while the entry exists, so
// a listing of a huge directory resumes exactly where it stopped even when
// entries are added or removed in between.
func (s *Store) ReadDir(dir node.FID, cookie uint64, max int) (ents []node.DirEntry, eof bool, d node.Status, err error) {
	if max <= 0 || max > 10000 {
		max = 10000
	}
	err = s.view(dir.Volume, func(v *vtx) error {
		dr, err := v.getDir(dir)
		if err != nil {
			return err
		}
		d = v.statusOf(&dr, dir.Vnode)
		prefix := u64(dir.Vnode)
		c := v.cookies.Cursor()
		for k, name := c.Seek(cookieKey(dir.Vnode, cookie+1)); k != nil && bytes.HasPrefix(k, prefix); k, name = c.Next() {
			if len(ents) == max {
				return nil
			}
			e, ok, err := v.lookup(dir.Vnode, string(name))
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("directory %v: entry %q: %w", dir, name, errCorrupt)
			}
			ents = append(ents, node.DirEntry{Name: string(name), FID: node.FID{Volume: v.id, Vnode: e.Vnode, Unique: v.unique(e.Vnode)}, Type: e.Type, Cookie: e.Cookie})
		}
		eof = true
		return nil
	})
	return ents, eof, d, err
}

func (v *vtx) unique(vnode uint64) uint64 {
	b := v.vnodes.Get(u64(vnode))
	if len(b) < 8 {
		return 0
	}
	return getU64(b[:8])
}

// StatFS reports the space of the file system holding the data directory.
func (s *Store) StatFS() (node.FSStat, error) {
	var sf syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &sf); err != nil {
		return node.FSStat{}, err
	}
	return node.FSStat{BlockSize: uint64(sf.Bsize), Blocks: sf.Blocks, BlocksFree: sf.Bavail, Files: sf.Files, FilesFree: sf.Ffree}, nil
}
