package vnode

import (
	"fmt"
	"syscall"
	"time"

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
			if err := res.Put(reservedKey(f), u64(f.Unique)); err != nil {
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

// Reserved is a file made under a directory delegation, to be created
// with the FID it was given.
type Reserved struct {
	Name  string
	FID   node.FID
	Attr  Attr
	Mtime time.Time
}

// CreateReserved makes the regular files fs in dir, in one transaction:
// all or none. Each FID must be reserved and each name free (the client
// held the directory's delegation: nobody else could take it), or already
// name that FID: an earlier attempt made it, and its reply was lost. dir's
// version goes up once per file made, as by one Create each.
func (s *Store) CreateReserved(dir node.FID, fs []Reserved, op Op) (sts []node.Status, d node.Status, err error) {
	for _, f := range fs {
		if err := node.CheckName(f.Name); err != nil {
			return nil, d, err
		}
		if f.FID.Volume != dir.Volume {
			return nil, d, fmt.Errorf("create %s: fid %v not in volume %d: %w", f.Name, f.FID, dir.Volume, syscall.EXDEV)
		}
	}
	err = s.mutate(dir.Volume, func(v *vtx) error {
		sts = nil // a run may be repeated (group)
		dr, err := v.getDir(dir)
		if err != nil {
			return err
		}
		if o, ok := v.findOp(op); ok && len(o.vnodes) == len(fs) {
			for _, n := range o.vnodes {
				sts = append(sts, v.statusNow(n))
			}
			d = dr.status(v.id, dir.Vnode)
			return nil
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
			if uq := res.Get(key); uq == nil || getU64(uq) != f.FID.Unique {
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
			if err := v.addEntry(dir.Vnode, &dr, f.Name, f.FID.Vnode, node.TypeFile); err != nil {
				return err
			}
			v.touchDir(&dr)
			st := r.status(v.id, f.FID.Vnode)
			sts = append(sts, st)
			made = append(made, namedBy(st))
		}
		if err := v.put(dir.Vnode, &dr); err != nil {
			return err
		}
		d = dr.status(v.id, dir.Vnode)
		return v.recordOp(op, done{vnodes: made})
	})
	if err != nil {
		return nil, d, err
	}
	return sts, d, nil
}
