package vnode

import (
	"bytes"
	"fmt"
	"syscall"

	"github.com/hoardfs/hoard/node"
)

// Extended attributes of the user namespace (node.CheckXattrName), kept
// in the volume's xattrs bucket under vnode + name, so that a move or a
// release carries them with the rest of the volume's metadata.

func xattrKey(vnode uint64, name string) []byte {
	return append(u64(vnode), name...)
}

// GetXattr is the value of f's attribute name (ENODATA: none).
func (s *Store) GetXattr(f node.FID, name string) ([]byte, error) {
	if err := node.CheckXattrName(name); err != nil {
		return nil, err
	}
	var val []byte
	err := s.view(f.Volume, func(v *vtx) error {
		if _, err := v.get(f); err != nil {
			return err
		}
		b := v.xattrs.Get(xattrKey(f.Vnode, name))
		if b == nil {
			return fmt.Errorf("%v: extended attribute %q: %w", f, name, syscall.ENODATA)
		}
		val = bytes.Clone(b)
		return nil
	})
	return val, err
}

// ListXattr lists f's attribute names, sorted.
func (s *Store) ListXattr(f node.FID) ([]string, error) {
	var names []string
	err := s.view(f.Volume, func(v *vtx) error {
		if _, err := v.get(f); err != nil {
			return err
		}
		v.eachXattr(f.Vnode, func(name string, _ []byte) { names = append(names, name) })
		return nil
	})
	return names, err
}

// SetXattr sets f's attribute name to val, as setxattr(2) with flags
// (XattrCreate, XattrReplace), and returns f's status, whose ctime it
// changes.
func (s *Store) SetXattr(f node.FID, name string, val []byte, flags uint32) (node.Status, error) {
	if err := node.CheckXattrName(name); err != nil {
		return node.Status{}, err
	}
	if len(val) > node.MaxXattrValue {
		return node.Status{}, fmt.Errorf("extended attribute value of %d bytes (at most %d): %w", len(val), node.MaxXattrValue, syscall.E2BIG)
	}
	return s.changeXattrs(f, func(v *vtx) error {
		key := xattrKey(f.Vnode, name)
		old := v.xattrs.Get(key)
		switch {
		case flags&node.XattrCreate != 0 && old != nil:
			return fmt.Errorf("%v: extended attribute %q: %w", f, name, syscall.EEXIST)
		case flags&node.XattrReplace != 0 && old == nil:
			return fmt.Errorf("%v: extended attribute %q: %w", f, name, syscall.ENODATA)
		}
		total := len(name) + len(val)
		v.eachXattr(f.Vnode, func(n string, b []byte) {
			if n != name {
				total += len(n) + len(b)
			}
		})
		if total > node.MaxXattrTotal {
			return fmt.Errorf("%v: extended attributes of %d bytes (at most %d a file): %w", f, total, node.MaxXattrTotal, syscall.ENOSPC)
		}
		return v.xattrs.Put(key, bytes.Clone(val))
	})
}

// RemoveXattr removes f's attribute name (ENODATA: none).
func (s *Store) RemoveXattr(f node.FID, name string) (node.Status, error) {
	if err := node.CheckXattrName(name); err != nil {
		return node.Status{}, err
	}
	return s.changeXattrs(f, func(v *vtx) error {
		key := xattrKey(f.Vnode, name)
		if v.xattrs.Get(key) == nil {
			return fmt.Errorf("%v: extended attribute %q: %w", f, name, syscall.ENODATA)
		}
		return v.xattrs.Delete(key)
	})
}

// changeXattrs runs change on f's attributes and moves its ctime.
func (s *Store) changeXattrs(f node.FID, change func(v *vtx) error) (node.Status, error) {
	var st node.Status
	err := s.mutate(f.Volume, func(v *vtx) error {
		r, err := v.get(f)
		if err != nil {
			return err
		}
		if err := change(v); err != nil {
			return err
		}
		r.Ctime = v.now
		st = v.statusOf(&r, f.Vnode)
		return v.put(f.Vnode, &r)
	})
	return st, err
}

// eachXattr calls fn with each of vnode's attributes, in name order.
func (v *vtx) eachXattr(vnode uint64, fn func(name string, val []byte)) {
	prefix := u64(vnode)
	c := v.xattrs.Cursor()
	for k, val := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, val = c.Next() {
		fn(string(k[len(prefix):]), val)
	}
}

// dropXattrs removes a freed vnode's attributes.
func (v *vtx) dropXattrs(vnode uint64) error {
	prefix := u64(vnode)
	c := v.xattrs.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}
