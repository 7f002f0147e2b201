package vnode

import (
	"fmt"
	"syscall"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/node"
)

// A volume's meta bucket counts the bytes its regular files take on this
// server's disk (charge: their blocks, so a hole costs nothing, as in
// ext4's and AFS's quotas; a size alone, set far past the data, fills no
// quota) and its vnodes. Every transaction that changes a file's data or
// makes or frees a vnode changes them too, so they are never off by a
// crash. A quota, if set, bounds the bytes: growth past it is refused,
// shrinking never is.
var (
	keyUsed  = []byte("used")
	keyFiles = []byte("files")
	keyQuota = []byte("quota") // absent: none
)

// room is a volume's quota and the bytes its files use, as one
// transaction saw them; the zero room bounds nothing.
type room struct {
	name        string
	quota, used uint64
}

func (v *vtx) room() room {
	return room{name: string(v.meta.Get([]byte("name"))), quota: getU64(v.meta.Get(keyQuota)), used: getU64(v.meta.Get(keyUsed))}
}

// check refuses a file's growth from `from` to `to` bytes past the quota.
func (q room) check(from, to uint64) error {
	if to <= from || q.quota == 0 || q.used+(to-from) <= q.quota {
		return nil
	}
	return fmt.Errorf("volume %s: %d bytes more would exceed its quota of %d (%d used): %w",
		q.name, to-from, q.quota, q.used, syscall.EDQUOT)
}

// resize counts a regular file's size going from `from` to `to` bytes,
// refusing growth past the quota before anything is written.
func (v *vtx) resize(from, to uint64) error {
	if from == to {
		return nil
	}
	q := v.room()
	if err := q.check(from, to); err != nil {
		return err
	}
	used := q.used + to - from
	if to < from {
		used = q.used - min(q.used, from-to)
	}
	return v.meta.Put(keyUsed, u64(used))
}

// charge is what regular file r (vnode in v's volume) counts against the
// quota: the bytes of the blocks its data file takes (blocks), or of its
// inline data.
func (v *vtx) charge(r *record, vnode uint64) uint64 {
	switch {
	case r.Type != node.TypeFile:
		return 0
	case r.DataGen == genInline:
		return r.Size
	}
	return v.blocks(r, vnode) * 512
}

// countVnode counts a vnode made (+1) or freed (-1).
func (v *vtx) countVnode(delta int) error {
	n := getU64(v.meta.Get(keyFiles))
	if delta < 0 {
		n -= min(n, uint64(-delta))
	} else {
		n += uint64(delta)
	}
	return v.meta.Put(keyFiles, u64(n))
}

// countUsage sets volume id's counters from its vnodes: once, for a
// volume of a store from before they were kept, or kept as sizes.
func countUsage(tx *bolt.Tx, id uint64, dir string) error {
	v, err := openVol(tx, id)
	if err != nil {
		return err
	}
	v.dir = dir
	var used, files uint64
	err = v.vnodes.ForEach(func(k, b []byte) error {
		r, err := decodeRecord(b)
		if err != nil {
			return fmt.Errorf("vnode %d: %w", getU64(k), err)
		}
		files++
		used += v.charge(&r, getU64(k))
		return nil
	})
	if err != nil {
		return err
	}
	vm := v.meta
	if err := vm.Put(keyUsed, u64(used)); err != nil {
		return err
	}
	return vm.Put(keyFiles, u64(files))
}

// SetQuota bounds the bytes of volume name's files (0: no bound). A
// quota below what they use already is taken: the volume may then only
// shrink.
func (s *Store) SetQuota(name string, quota uint64) (node.Volume, error) {
	var v node.Volume
	err := s.update(func(tx *bolt.Tx) error {
		id := tx.Bucket(bktVolNames).Get([]byte(name))
		if id == nil {
			return fmt.Errorf("volume %q: %w", name, syscall.ENOENT)
		}
		vb := tx.Bucket(bktVolumes).Bucket(id)
		vm := vb.Bucket(bktVolMeta)
		var err error
		if quota == 0 {
			err = vm.Delete(keyQuota)
		} else {
			err = vm.Put(keyQuota, u64(quota))
		}
		v = volumeOf(getU64(id), vb)
		return err
	})
	return v, err
}
