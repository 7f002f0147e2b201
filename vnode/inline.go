package vnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/node"
)

// Small files live in the metadata database, a value each in their
// volume's inline bucket, rather than in a data file of their own ("inline
// data", as ext4 and Btrfs keep small files in their metadata). A store of
// one is then one transaction, committed together with those of other
// requests (group): a data file costs a staging file's creation, its
// fsync, a rename, a directory fsync and a second commit to drop the redo
// record. A file that grows past inlineMax moves to a data file, and one
// that shrinks to it moves back, each in the store that does it.

// inlineMax is the largest file kept inline.
const inlineMax = 64 << 10

// genInline is the DataGen of a file whose bytes are inline.
const genInline = ^uint64(0)

// inlineData is a copy of the bytes of vnode if they are inline (nil if
// not): the transaction's own slice is valid only until it ends.
func (v *vtx) inlineData(vnode uint64, r *record) []byte {
	if r.DataGen != genInline {
		return nil
	}
	return bytes.Clone(v.inline.Get(u64(vnode)))
}

// content is the new bytes of a file of size bytes (at most inlineMax):
// the old ones below cut (inline, or read from the old data file), the
// staged ranges over them, zeros elsewhere.
func (u *Update) content(r record, oldInline []byte, cut, size uint64, ranges []extent) ([]byte, error) {
	data := make([]byte, size)
	switch keep := min(cut, size); {
	case r.DataGen == genInline:
		copy(data[:keep], oldInline)
	case r.DataGen != 0:
		old, err := os.Open(filepath.Join(u.s.dir, dataRel(u.fid.Volume, u.fid.Vnode, r.DataGen)))
		if err != nil {
			return nil, err
		}
		defer old.Close()
		if _, err := old.ReadAt(data[:keep], 0); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
	}
	for _, e := range ranges {
		if u.staging == nil {
			copy(data[e.off:e.end], u.mem[e.off:])
		} else if _, err := u.staging.ReadAt(data[e.off:e.end], e.off); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
	}
	return data, nil
}

// commitInline publishes data as the file's new version, inline: one
// transaction, no redo record. A data file the file had is deleted after.
func (u *Update) commitInline(old record, before uint64, data []byte, mtime time.Time, op node.Op) (node.Status, error) {
	s, f := u.s, u.fid
	st, made, err := s.publish(f, op, uint64(len(data)), before, mtime, func(v *vtx, r *record) error {
		if r.DataGen != 0 && r.DataGen != genInline {
			if err := v.tx.Bucket(bktGarbage).Put([]byte(dataRel(f.Volume, f.Vnode, r.DataGen)), nil); err != nil {
				return err
			}
		}
		if len(data) == 0 {
			r.DataGen = 0
			return v.inline.Delete(u64(f.Vnode))
		}
		r.DataGen = genInline
		return v.inline.Put(u64(f.Vnode), data)
	})
	if err != nil || made || old.DataGen == 0 || old.DataGen == genInline {
		return st, err
	}
	// The data file the file had: gone now (the file's lock is held, so
	// not collectGarbage, which takes it), or at the next start.
	garbage := dataRel(f.Volume, f.Vnode, old.DataGen)
	if err := os.Remove(filepath.Join(s.dir, garbage)); err == nil || errors.Is(err, os.ErrNotExist) {
		s.update(func(tx *bolt.Tx) error { return tx.Bucket(bktGarbage).Delete([]byte(garbage)) })
	}
	return st, nil
}

// fillGapsFrom writes old's bytes in gaps into the staging file, so that
// it becomes the whole new file (fillGaps, from inline bytes).
func fillGapsFrom(staging *os.File, old []byte, gaps []extent) error {
	for _, g := range gaps {
		if g.off >= int64(len(old)) {
			break
		}
		if _, err := staging.WriteAt(old[g.off:min(g.end, int64(len(old)))], g.off); err != nil {
			return fmt.Errorf("filling gaps: %w", err)
		}
	}
	return nil
}
