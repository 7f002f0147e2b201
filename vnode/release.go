package vnode

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/node"
)

// A read-only copy of a volume (a release, docs/cell.md) arrives as a
// move's does, a dump of the read-write volume, but is read while the
// next release arrives: a data file its readers may be reading is never
// written over. Each data file received gets a generation of its own
// here, and the copy's bucket of bktCopies maps the read-write volume's
// version of the file (DataFile) to it (Receiving, in dump.go). A pass
// that is not published only adds files; the published pass rewrites
// the records to name the copy's generations, in one transaction, and
// then drops the files no record names.

func (d DataFile) key() []byte {
	k := make([]byte, 32)
	binary.BigEndian.PutUint64(k, d.Vnode)
	binary.BigEndian.PutUint64(k[8:], d.Unique)
	binary.BigEndian.PutUint64(k[16:], d.Gen)
	binary.BigEndian.PutUint64(k[24:], d.DV)
	return k
}

// CopyHas lists the read-write versions of the data files copy id holds
// (those on disk: a crash may have dropped a file before its entry).
func (s *Store) CopyHas(id uint64) ([]DataFile, error) {
	var out []DataFile
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktCopies).Bucket(u64(id))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(k) != 32 {
				return nil
			}
			df := DataFile{getU64(k[:8]), getU64(k[8:16]), getU64(k[16:24]), getU64(k[24:])}
			if fileExists(filepath.Join(s.dir, dataRel(id, df.Vnode, getU64(v)))) {
				out = append(out, df)
			}
			return nil
		})
	})
	return out, err
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// PublishCopy makes read-only copy id (named name) hold kvs, a dump of
// the read-write volume whose data files are all received: its records
// are rewritten to name the copy's own files.
func (s *Store) PublishCopy(id uint64, name string, kvs []KV) error {
	gens := map[string]uint64{}
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bktCopies).Bucket(u64(id)); b != nil {
			return b.ForEach(func(k, v []byte) error {
				gens[string(k)] = getU64(v)
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return err
	}
	used := map[string]bool{}
	out := make([]KV, len(kvs))
	for i, kv := range kvs {
		out[i] = kv
		switch string(kv.Bucket) {
		case string(bktVolMeta):
			if string(kv.Key) == "name" {
				out[i].Value = []byte(name)
			}
		case string(bktVnodes):
			r, err := decodeRecord(kv.Value)
			if err != nil {
				return fmt.Errorf("release %s: vnode %d: %w", name, getU64(kv.Key), err)
			}
			if r.Type != node.TypeFile || r.DataGen == 0 || r.DataGen == genInline {
				continue
			}
			k := string(DataFile{getU64(kv.Key), r.Unique, r.DataGen, r.DV}.key())
			gen, ok := gens[k]
			if !ok {
				return fmt.Errorf("release %s: data file of vnode %d not received: %w", name, getU64(kv.Key), syscall.EIO)
			}
			used[k] = true
			r.DataGen = gen
			out[i].Value = r.encode()
		}
	}
	if err := s.RestoreMeta(id, name, out); err != nil {
		return err
	}
	// Files no record names were dropped by RestoreMeta; so are their
	// entries.
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktCopies).Bucket(u64(id))
		if b == nil {
			return nil
		}
		var drop [][]byte
		b.ForEach(func(k, _ []byte) error {
			if !used[string(k)] {
				drop = append(drop, k)
			}
			return nil
		})
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}
