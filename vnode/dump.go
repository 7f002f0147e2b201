package vnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/node"
)

// A volume travels between servers (a move) as its metadata, every key of
// its buckets read in one transaction, then the data files its records
// name: the metadata is small (a few hundred bytes a file) and is sent
// whole at every pass, the data files only when the receiver lacks that
// version. The receiver publishes the metadata in one transaction, once
// every data file it names is on its disk.

// KV is one key of a volume's metadata: the bucket, the key, the value.
type KV struct {
	Bucket, Key, Value []byte
}

// DataFile names one data file of a volume and the version it holds.
type DataFile struct {
	Vnode, Unique, Gen, DV uint64
}

// volumeBuckets are the buckets a volume's metadata is in.
var volumeBuckets = [][]byte{bktVnodes, bktNames, bktCookies, bktVolMeta, bktInline, bktACLs, bktXattrs}

// NoVolumeError is a request for a volume this store does not hold.
type NoVolumeError struct{ ID uint64 }

func (e *NoVolumeError) Error() string { return fmt.Sprintf("volume %d: not on this server", e.ID) }
func (e *NoVolumeError) Unwrap() error { return syscall.ENOENT }

// DumpMeta reads volume id's metadata as it is at one moment, and the
// data files its records name.
func (s *Store) DumpMeta(id uint64) (name string, kvs []KV, files []DataFile, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		vb := tx.Bucket(bktVolumes).Bucket(u64(id))
		if vb == nil {
			return &NoVolumeError{id}
		}
		name = string(vb.Bucket(bktVolMeta).Get([]byte("name")))
		for _, b := range volumeBuckets {
			if err := vb.Bucket(b).ForEach(func(k, v []byte) error {
				kvs = append(kvs, KV{b, bytes.Clone(k), bytes.Clone(v)})
				if string(b) != string(bktVnodes) {
					return nil
				}
				r, err := decodeRecord(v)
				if err != nil {
					return err
				}
				if r.Type == node.TypeFile && r.DataGen != 0 && r.DataGen != genInline {
					files = append(files, DataFile{Vnode: getU64(k), Unique: r.Unique, Gen: r.DataGen, DV: r.DV})
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return name, kvs, files, err
}

// ReadVersion reads file f's bytes at off into p if they are still of
// version dv: a move reads a data file after the metadata naming it, and
// a file changed since is sent at the next pass instead. It returns
// ErrChanged when the file changed.
func (s *Store) ReadVersion(f node.FID, dv uint64, p []byte, off int64) (int, error) {
	n, st, err := s.ReadAt(f, p, off)
	if err == nil && st.DataVersion != dv || errors.Is(err, syscall.ESTALE) || errors.Is(err, syscall.ENOENT) {
		return 0, ErrChanged
	}
	if err == io.EOF {
		err = nil
	}
	return n, err
}

// ErrChanged says a file changed while a move read it.
var ErrChanged = errors.New("file changed while read")

// Receiving is one pass of a dump being received into volume vol (or,
// copy set, into read-only copy vol). Its data files are written
// unsynced; Sync makes them all durable at once, one syncfs rather than
// an fsync per file, before the pass says it has them or its metadata
// is published.
type Receiving struct {
	s    *Store
	vol  uint64
	copy bool
	got  []received // a copy's files, recorded at Sync
}

type received struct {
	df  DataFile
	gen uint64
}

// Receive begins a pass into volume vol, or into read-only copy vol.
func (s *Store) Receive(vol uint64, copy bool) *Receiving {
	return &Receiving{s: s, vol: vol, copy: copy}
}

// RestoreFile is a data file being received; Commit puts it in place.
type RestoreFile struct {
	rv   *Receiving
	f    *os.File
	path string
	df   DataFile
}

// File begins receiving the data file of the read-write volume's version
// df.
func (rv *Receiving) File(df DataFile) (*RestoreFile, error) {
	f, err := os.CreateTemp(filepath.Join(rv.s.dir, "staging"), "restore-")
	if err != nil {
		return nil, diskErr(err)
	}
	return &RestoreFile{rv: rv, f: f, path: f.Name(), df: df}, nil
}

// WriteAt writes received bytes.
func (r *RestoreFile) WriteAt(p []byte, off int64) error {
	_, err := r.f.WriteAt(p, off)
	return diskErr(err)
}

// Commit makes the received file the data file its version names (in a
// copy, a new generation of its own: release.go); Abort drops it. It is
// durable once the pass's Sync returns.
func (r *RestoreFile) Commit() error {
	err := r.f.Close()
	if err == nil {
		err = r.place()
	}
	if err != nil {
		os.Remove(r.path)
		return diskErr(err)
	}
	return nil
}

// place renames a received file into place.
func (r *RestoreFile) place() error {
	rv := r.rv
	gen := r.df.Gen
	if rv.copy {
		gen = rv.s.newGen()
	}
	final := filepath.Join(rv.s.dir, dataRel(rv.vol, r.df.Vnode, gen))
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return err
	}
	if err := os.Rename(r.path, final); err != nil {
		return err
	}
	if rv.copy {
		rv.got = append(rv.got, received{r.df, gen})
	}
	return nil
}

// Sync makes the files received so far durable, and a copy's record of
// them.
func (rv *Receiving) Sync() error {
	d, err := os.Open(rv.s.dir)
	if err != nil {
		return err
	}
	err = unix.Syncfs(int(d.Fd()))
	d.Close()
	if err != nil || !rv.copy || len(rv.got) == 0 {
		return diskErr(err)
	}
	err = rv.s.update(func(tx *bolt.Tx) error {
		b, err := tx.Bucket(bktCopies).CreateBucketIfNotExists(u64(rv.vol))
		if err != nil {
			return err
		}
		for _, g := range rv.got {
			if err := b.Put(g.df.key(), u64(g.gen)); err != nil {
				return err
			}
		}
		return nil
	})
	rv.got = nil
	return err
}

// Abort drops a file not committed.
func (r *RestoreFile) Abort() {
	r.f.Close()
	os.Remove(r.path)
}

// diskErr turns a full disk into ENOSPC for the wire.
func diskErr(err error) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%v: %w", err, syscall.ENOSPC)
	}
	return err
}

// RestoreMeta makes volume id (named name) hold kvs, replacing what it
// held, in one transaction: every data file the records name must be on
// disk already. Data files no record names any more are deleted after.
func (s *Store) RestoreMeta(id uint64, name string, kvs []KV) error {
	want := map[string]bool{}
	for _, kv := range kvs {
		if string(kv.Bucket) != string(bktVnodes) {
			continue
		}
		r, err := decodeRecord(kv.Value)
		if err != nil {
			return fmt.Errorf("restore volume %s: vnode %d: %w", name, getU64(kv.Key), err)
		}
		if r.Type == node.TypeFile && r.DataGen != 0 && r.DataGen != genInline {
			rel := dataRel(id, getU64(kv.Key), r.DataGen)
			if _, err := os.Stat(filepath.Join(s.dir, rel)); err != nil {
				return fmt.Errorf("restore volume %s: data file of vnode %d missing: %w", name, getU64(kv.Key), syscall.EIO)
			}
			want[rel] = true
		}
	}
	err := s.update(func(tx *bolt.Tx) error {
		vols := tx.Bucket(bktVolumes)
		if vols.Bucket(u64(id)) != nil {
			if err := vols.DeleteBucket(u64(id)); err != nil {
				return err
			}
		}
		if other := tx.Bucket(bktVolNames).Get([]byte(name)); other != nil && getU64(other) != id {
			return fmt.Errorf("restore volume %s: the name is volume %d's here: %w", name, getU64(other), syscall.EEXIST)
		}
		vb, err := vols.CreateBucket(u64(id))
		if err != nil {
			return err
		}
		for _, b := range volumeBuckets {
			if _, err := vb.CreateBucket(b); err != nil {
				return err
			}
		}
		for _, kv := range kvs {
			b := vb.Bucket(kv.Bucket)
			if b == nil {
				return fmt.Errorf("restore volume %s: unknown bucket %q: %w", name, kv.Bucket, syscall.EINVAL)
			}
			if err := b.Put(kv.Key, kv.Value); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bktMeta)
		if id > getU64(meta.Get(keyNextVol)) {
			if err := meta.Put(keyNextVol, u64(id)); err != nil {
				return err
			}
		}
		return tx.Bucket(bktVolNames).Put([]byte(name), u64(id))
	})
	if err != nil {
		return err
	}
	root := filepath.Join(s.dir, "data", strconv.FormatUint(id, 10))
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if rel, _ := filepath.Rel(s.dir, p); !want[rel] {
			os.Remove(p)
		}
		return nil
	})
}
