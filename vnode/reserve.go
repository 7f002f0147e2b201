package vnode

import (
	"bytes"
	"fmt"
	"syscall"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/node"
)

// FIDs set aside for files a client creates on its own under a directory
// delegation: it names them with these, and makes them known later, many
// in one transaction (CreateReserved). Only a reserved FID can be created
// so, once: a FID never names two files.

// MaxReserve bounds one reservation.
const MaxReserve = 1024

// Reserve sets aside n FIDs of volume vol.
func (s *Store) Reserve(vol uint64, n int) ([]node.FID, error) {
	if n <= 0 || n > MaxReserve {
		return nil, fmt.Errorf("reserve %d fids: %w", n, syscall.EINVAL)
	}
	var fids []node.FID
	err := s.mutate(vol, func(v *vtx) error {
		fids = nil // a run may be repeated (group)
		vn := getU64(v.meta.Get(keyNextVnode))
		uq := getU64(v.meta.Get(keyUnique))
		res := v.tx.Bucket(bktReserved)
		for i := range uint64(n) {
			f := node.FID{Volume: vol, Vnode: vn + 1 + i, Unique: uq + 1 + i}
			if err := res.Put(reservedKey(f), reservation(f.Unique, s.epoch)); err != nil {
				return err
			}
			fids = append(fids, f)
		}
		if err := v.meta.Put(keyNextVnode, u64(vn+uint64(n))); err != nil {
			return err
		}
		return v.meta.Put(keyUnique, u64(uq+uint64(n)))
	})
	return fids, err
}

func reservedKey(f node.FID) []byte { return append(u64(f.Volume), u64(f.Vnode)...) }

// A reservation records the FID's uniquifier and the epoch it was made in:
// one made two starts ago or more is dropped when the store opens
// (pruneReserved). Its files were to be settled before the grace period
// after the restart since ended, and a client that reserves and never
// creates would otherwise fill the store.
func reservation(unique, epoch uint64) []byte { return append(u64(unique), u64(epoch)...) }

// parseReservation reads a reservation; one written before they carried
// their epoch counts as made in the previous life.
func parseReservation(b []byte, current uint64) (unique, epoch uint64) {
	switch len(b) {
	case 16:
		return getU64(b[:8]), getU64(b[8:])
	case 8:
		return getU64(b), current - 1
	}
	return 0, 0
}

// pruneReserved drops the reservations made two starts ago or more, and
// stamps those without an epoch with the previous one.
func pruneReserved(tx *bolt.Tx, current uint64) error {
	res := tx.Bucket(bktReserved)
	var drop, stamp [][]byte
	var uniques []uint64
	err := res.ForEach(func(k, v []byte) error {
		uq, e := parseReservation(v, current)
		switch {
		case e+1 < current:
			drop = append(drop, bytes.Clone(k))
		case len(v) != 16:
			stamp = append(stamp, bytes.Clone(k))
			uniques = append(uniques, uq)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range drop {
		if err := res.Delete(k); err != nil {
			return err
		}
	}
	for i, k := range stamp {
		if err := res.Put(k, reservation(uniques[i], current-1)); err != nil {
			return err
		}
	}
	return nil
}

// CreateReserved removes the files rm from dir and makes the regular
// files fs in it, in one transaction: all or none. Each FID of fs must be
// reserved and each name free once rm are gone (the client held the
// directory's delegation: nobody else could take it), or already name
// that FID: an earlier attempt made it, and its reply was lost. A name of
// rm that no longer names its FID was removed by such an attempt. dir's
// version goes up once per file made or removed, as by one Create or
// Remove each. It returns the statuses of fs, then those of rm (Nlink 0
// once gone).
func (s *Store) CreateReserved(dir node.FID, fs []node.Reserved, rm []node.Removed, op node.Op) (sts, gone []node.Status, d node.Status, err error) {
	for _, f := range fs {
		if err := node.CheckName(f.Name); err != nil {
			return nil, nil, d, err
		}
		if f.FID.Volume != dir.Volume {
			return nil, nil, d, fmt.Errorf("create %s: fid %v not in volume %d: %w", f.Name, f.FID, dir.Volume, syscall.EXDEV)
		}
	}
	for _, f := range rm {
		if err := node.CheckName(f.Name); err != nil {
			return nil, nil, d, err
		}
	}
	err = s.mutate(dir.Volume, func(v *vtx) error {
		sts, gone = nil, nil // a run may be repeated (group)
		dr, err := v.getDir(dir)
		if err != nil {
			return err
		}
		if o, ok := v.findOp(op); ok && len(o.vnodes) == len(fs)+len(rm) {
			for _, n := range o.vnodes[:len(fs)] {
				sts = append(sts, v.statusNow(n))
			}
			for _, n := range o.vnodes[len(fs):] {
				gone = append(gone, v.statusNow(n))
			}
			d = v.statusOf(&dr, dir.Vnode)
			return nil
		}
		var removed []named
		for _, f := range rm {
			st, err := v.removeReserved(&dr, dir, f)
			if err != nil {
				return err
			}
			gone = append(gone, st)
			removed = append(removed, namedBy(st))
		}
		res := v.tx.Bucket(bktReserved)
		var made []named
		for _, f := range fs {
			if e, ok, err := v.lookup(dir.Vnode, f.Name); err != nil {
				return err
			} else if ok && e.Vnode == f.FID.Vnode {
				// Made by an earlier attempt whose reply was lost.
				if st := v.statusNow(named{f.FID, node.TypeFile}); st.FID == f.FID && st.Nlink > 0 {
					sts = append(sts, st)
					made = append(made, namedBy(st))
					continue
				}
				return fmt.Errorf("%s: %w", f.Name, syscall.EEXIST)
			} else if ok {
				return fmt.Errorf("%s: %w", f.Name, syscall.EEXIST)
			}
			key := reservedKey(f.FID)
			if uq, _ := parseReservation(res.Get(key), s.epoch); uq == 0 || uq != f.FID.Unique {
				return fmt.Errorf("create %s: fid %v was not reserved: %w", f.Name, f.FID, syscall.EINVAL)
			}
			mt := f.Mtime.UnixNano()
			r := record{Type: node.TypeFile, Mode: f.Attr.Mode & 0o7777, UID: f.Attr.UID, GID: f.Attr.GID, Nlink: 1, DV: 1,
				Atime: mt, Mtime: mt, Ctime: mt, Parent: dir.Vnode, Unique: f.FID.Unique}
			if err := res.Delete(key); err != nil {
				return err
			}
			if err := v.put(f.FID.Vnode, &r); err != nil {
				return err
			}
			if err := v.countVnode(1); err != nil {
				return err
			}
			if err := v.addEntry(dir.Vnode, &dr, f.Name, f.FID.Vnode, node.TypeFile); err != nil {
				return err
			}
			v.touchDir(&dr)
			st := v.statusOf(&r, f.FID.Vnode)
			sts = append(sts, st)
			made = append(made, namedBy(st))
		}
		if err := v.put(dir.Vnode, &dr); err != nil {
			return err
		}
		d = v.statusOf(&dr, dir.Vnode)
		return v.recordOp(op, done{vnodes: append(made, removed...)})
	})
	if err != nil {
		return nil, nil, d, err
	}
	return sts, gone, d, nil
}

// removeReserved removes f from dir (record dr) for CreateReserved: a
// regular file, or a symbolic link or special file, never a directory.
func (v *vtx) removeReserved(dr *record, dir node.FID, f node.Removed) (node.Status, error) {
	e, ok, err := v.lookup(dir.Vnode, f.Name)
	if err != nil {
		return node.Status{}, err
	}
	if !ok || e.Vnode != f.FID.Vnode {
		// Removed by an earlier attempt whose reply was lost (and
		// perhaps made again, by the same batch).
		return v.statusNow(named{f.FID, node.TypeFile}), nil
	}
	r, err := decodeRecord(v.vnodes.Get(u64(e.Vnode)))
	if err != nil {
		return node.Status{}, err
	}
	if r.Unique != f.FID.Unique {
		return node.Status{}, fmt.Errorf("remove %s: fid %v: %w", f.Name, f.FID, syscall.ESTALE)
	}
	if r.Type == node.TypeDir {
		return node.Status{}, fmt.Errorf("%s: %w", f.Name, syscall.EISDIR)
	}
	if err := v.delEntry(dir.Vnode, f.Name, e); err != nil {
		return node.Status{}, err
	}
	v.touchDir(dr)
	if err := v.unlinkVnode(e.Vnode, &r); err != nil {
		return node.Status{}, err
	}
	return v.statusOf(&r, e.Vnode), nil
}
