// Package vnode is the file server's store: volumes of vnodes whose metadata
// (status, directory entries) lives in one bbolt database and whose data lives
// in one file per vnode, or, for a small file, in the database too
// (inline.go). Every change is one bbolt transaction, so a crash leaves
// either the old or the new state; data stores to files are staged and
// then committed under a redo record (see data.go).
//
// bbolt was chosen over pebble and SQLite: it is a pure-Go, single-file B+tree
// with serialisable transactions and durable commits (etcd's store), readers
// never block the writer, and the metadata workload is small keys read far
// more often than written, where an LSM's write speed buys nothing.
package vnode

import (
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/hoardfs/hoard/dirs"
	"github.com/hoardfs/hoard/node"
)

var (
	bktMeta     = []byte("meta")
	bktVolumes  = []byte("volumes")
	bktVolNames = []byte("volnames")
	bktPending  = []byte("pending")
	bktGarbage  = []byte("garbage")
	bktOps      = []byte("ops")      // node.Op → outcome (once.go)
	bktOpTimes  = []byte("optimes")  // time, node.Op → nothing: for forgetting old outcomes
	bktReserved = []byte("reserved") // volume, vnode → uniquifier: FIDs set aside (reserve.go)
	// Kept before the cell's principal registry, read once to move them
	// there (acl.go).
	bktGroups   = []byte("groups")   // group → owner, members
	bktMemberOf = []byte("memberof") // user → the groups they are in
	bktRevoked  = []byte("revoked")  // token id → expiry
	bktCopies   = []byte("copies")   // read-only copy's id → its data files (release.go)
	// Per-volume sub-buckets.
	bktVnodes  = []byte("vnodes")
	bktNames   = []byte("names")
	bktCookies = []byte("cookies")
	bktVolMeta = []byte("vmeta")
	bktInline  = []byte("inline") // vnode → a small file's bytes (inline.go)
	bktACLs    = []byte("acls")   // directory vnode → its ACL (acl.go)
	bktXattrs  = []byte("xattrs") // vnode, name → an extended attribute's value (xattr.go)

	keyEpoch     = []byte("epoch")
	keyNextVol   = []byte("nextvol")
	keyNextVnode = []byte("nextvnode")
	keyUnique    = []byte("unique")
	keyFormat    = []byte("format")
)

// formatVersion 3 added the volumes' inline buckets, 4 their acls
// buckets and the store's groups and revoked tokens, 5 their counts of
// bytes and vnodes (quota.go); a store of format 2 to 4 is upgraded when
// opened (it has no ACLs: every directory has the default, acl.go; its
// counts are made). An older hoard refuses format 5: it would not keep
// the counts. 6 counts a file's blocks against the quota, not its size
// (quota.go): a store of format 5 has its counts made again.
const formatVersion = 6

// Store is an open server data directory.
type Store struct {
	dir   string
	db    *bolt.DB
	epoch uint64
	locks [256]sync.RWMutex // vnode data locks, sharded by FID
	seed  maphash.Seed
	// gen hands out data-file generations; unique per store life because it
	// starts from the epoch in the high bits.
	genMu sync.Mutex
	gen   uint64
	// stuck holds files whose published commit could not be carried out
	// (an I/O error); they fail with EIO until a restart replays the redo.
	// quarantined holds those whose redo failed at this start too, with
	// why (Quarantined).
	stuckMu     sync.Mutex
	stuck       map[node.FID]bool
	quarantined map[node.FID]error
	// group commits the read-write transactions of concurrent requests
	// together (update).
	group group
	// maxSize is the largest file the data file system takes.
	maxSize int64
	// pins are data files read after their lock was released (pin.go).
	pins pins
}

// Open opens (creating on first use) the store in dir, replays interrupted
// data commits, and starts a new epoch.
func Open(dir string) (*Store, error) {
	if err := dirs.Ensure("data directory", dir, false); err != nil {
		return nil, err
	}
	for _, sub := range []string{"data", "staging"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("data directory %s: %w", dir, err)
		}
	}
	// Small files' bytes live in the database (inline.go), so pages are
	// freed and reused at their pace: as etcd does, the freelist is a map
	// and is not written at every commit (it is rebuilt when opening).
	db, err := bolt.Open(filepath.Join(dir, "hoard.db"), 0o600, &bolt.Options{Timeout: time.Second,
		NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("data directory %s is in use by another server", dir)
		}
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	s := &Store{dir: dir, db: db, seed: maphash.MakeSeed(), group: group{db: db}}
	if err := s.init(); err != nil {
		db.Close()
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	s.gen = s.epoch << 32
	if s.maxSize, err = probeMaxSize(filepath.Join(dir, "staging")); err != nil {
		db.Close()
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := s.recover(); err != nil {
		db.Close()
		return nil, fmt.Errorf("data directory %s: recovery: %w", dir, err)
	}
	return s, nil
}

func (s *Store) init() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bktMeta, bktVolumes, bktVolNames, bktPending, bktGarbage, bktOps, bktOpTimes, bktReserved,
			bktCopies} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bktMeta)
		f := meta.Get(keyFormat)
		if f != nil && (getU64(f) < 2 || getU64(f) > formatVersion) {
			return fmt.Errorf("format version %d, this hoard reads %d", getU64(f), formatVersion)
		}
		if err := tx.Bucket(bktVolumes).ForEachBucket(func(k []byte) error {
			vb := tx.Bucket(bktVolumes).Bucket(k)
			for _, b := range [][]byte{bktInline, bktACLs, bktXattrs} {
				if _, err := vb.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			if vb.Bucket(bktVolMeta).Get(keyUsed) == nil || f != nil && getU64(f) < 6 {
				return countUsage(tx, getU64(k), s.dir)
			}
			return nil
		}); err != nil {
			return err
		}
		if err := meta.Put(keyFormat, u64(formatVersion)); err != nil {
			return err
		}
		s.epoch = getU64(meta.Get(keyEpoch)) + 1
		if err := meta.Put(keyEpoch, u64(s.epoch)); err != nil {
			return err
		}
		if err := pruneReserved(tx, s.epoch); err != nil {
			return err
		}
		if tx.Bucket(bktVolNames).Get([]byte(node.RootVolume)) == nil {
			_, err := createVolume(tx, 0, node.RootVolume)
			return err
		}
		return nil
	})
}

// Close releases the database.
func (s *Store) Close() error { return s.db.Close() }

// Epoch is this server start's epoch: it increases with every Open.
func (s *Store) Epoch() uint64 { return s.epoch }

// MaxFileSize is the largest file the data file system takes.
func (s *Store) MaxFileSize() uint64 { return uint64(s.maxSize) }

// Dir is the data directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) lock(f node.FID) *sync.RWMutex { return &s.locks[s.Shard(f)] }

// Shard is which of the data locks guards f: a commit to a file waits
// for whatever holds its shard's lock, whichever file of the shard that
// is for.
func (s *Store) Shard(f node.FID) int {
	var h maphash.Hash
	h.SetSeed(s.seed)
	var b [16]byte
	copy(b[:8], u64(f.Volume))
	copy(b[8:], u64(f.Vnode))
	h.Write(b[:])
	return int(h.Sum64() % uint64(len(s.locks)))
}

func (s *Store) setStuck(f node.FID) {
	s.stuckMu.Lock()
	defer s.stuckMu.Unlock()
	if s.stuck == nil {
		s.stuck = map[node.FID]bool{}
	}
	s.stuck[f] = true
}

// quarantine refuses file f (its vnode: a redo record carries no
// uniquifier) for this server's life: its last commit could not be
// carried out at the start, for why.
func (s *Store) quarantine(f node.FID, why error) {
	s.stuckMu.Lock()
	defer s.stuckMu.Unlock()
	if s.quarantined == nil {
		s.quarantined = map[node.FID]error{}
	}
	s.quarantined[f] = why
}

// Quarantined lists the files whose last commit could not be carried out
// when the store was opened, with why: they fail with EIO, and a later
// start tries again.
func (s *Store) Quarantined() map[node.FID]error {
	s.stuckMu.Lock()
	defer s.stuckMu.Unlock()
	return maps.Clone(s.quarantined)
}

func (s *Store) checkStuck(f node.FID) error {
	s.stuckMu.Lock()
	defer s.stuckMu.Unlock()
	if why, ok := s.quarantined[node.FID{Volume: f.Volume, Vnode: f.Vnode}]; ok {
		return fmt.Errorf("fid %v: quarantined at the server's start (%v): %w", f, why, syscall.EIO)
	}
	if s.stuck[f] {
		return fmt.Errorf("fid %v: an earlier commit failed, restart the server to repair: %w", f, syscall.EIO)
	}
	return nil
}

func (s *Store) newGen() uint64 {
	s.genMu.Lock()
	defer s.genMu.Unlock()
	s.gen++
	return s.gen
}

func getU64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// --- volumes ---

// createVolume makes volume name with id, or, with id 0, the next id
// this store has not given.
func createVolume(tx *bolt.Tx, id uint64, name string) (node.Volume, error) {
	if err := node.CheckVolumeName(name); err != nil {
		return node.Volume{}, err
	}
	names := tx.Bucket(bktVolNames)
	if names.Get([]byte(name)) != nil {
		return node.Volume{}, fmt.Errorf("volume %s: %w", name, syscall.EEXIST)
	}
	meta := tx.Bucket(bktMeta)
	if id == 0 {
		id = getU64(meta.Get(keyNextVol)) + 1
	}
	if id > getU64(meta.Get(keyNextVol)) {
		if err := meta.Put(keyNextVol, u64(id)); err != nil {
			return node.Volume{}, err
		}
	}
	vb, err := tx.Bucket(bktVolumes).CreateBucket(u64(id))
	if errors.Is(err, bolterrors.ErrBucketExists) {
		return node.Volume{}, fmt.Errorf("volume id %d: %w", id, syscall.EEXIST)
	}
	if err != nil {
		return node.Volume{}, err
	}
	for _, b := range volumeBuckets {
		if _, err := vb.CreateBucket(b); err != nil {
			return node.Volume{}, err
		}
	}
	now := time.Now().UnixNano()
	root := record{Unique: 1, Type: node.TypeDir, Mode: 0o755, Nlink: 2, DV: 1,
		Atime: now, Mtime: now, Ctime: now, Parent: 1}
	vm := vb.Bucket(bktVolMeta)
	for _, kv := range [][2][]byte{
		{keyNextVnode, u64(1)}, {keyUnique, u64(1)},
		{[]byte("name"), []byte(name)}, {[]byte("created"), u64(uint64(now))},
		{keyUsed, u64(0)}, {keyFiles, u64(1)}, // the root directory
	} {
		if err := vm.Put(kv[0], kv[1]); err != nil {
			return node.Volume{}, err
		}
	}
	if err := vb.Bucket(bktVnodes).Put(u64(1), root.encode()); err != nil {
		return node.Volume{}, err
	}
	if err := names.Put([]byte(name), u64(id)); err != nil {
		return node.Volume{}, err
	}
	return volumeOf(id, vb), nil
}

func volumeOf(id uint64, vb *bolt.Bucket) node.Volume {
	vm := vb.Bucket(bktVolMeta)
	return node.Volume{
		ID:      id,
		Name:    string(vm.Get([]byte("name"))),
		Root:    node.FID{Volume: id, Vnode: 1, Unique: 1},
		Created: time.Unix(0, int64(getU64(vm.Get([]byte("created"))))),
		Quota:   getU64(vm.Get(keyQuota)),
		Used:    getU64(vm.Get(keyUsed)),
		Files:   getU64(vm.Get(keyFiles)),
	}
}

// CreateVolume makes a new, empty volume.
func (s *Store) CreateVolume(name string) (node.Volume, error) {
	return s.CreateVolumeID(0, name)
}

// CreateVolumeID makes a new, empty volume with the id a cell's location
// database gave it (0: the next this store has not given).
func (s *Store) CreateVolumeID(id uint64, name string) (node.Volume, error) {
	var v node.Volume
	err := s.update(func(tx *bolt.Tx) (err error) {
		v, err = createVolume(tx, id, name)
		return err
	})
	return v, err
}

// RemoveVolume deletes volume id, its metadata in one transaction and
// then its data files. Files still open keep their bytes until closed,
// as any removed file does.
func (s *Store) RemoveVolume(id uint64) error {
	var name string
	err := s.update(func(tx *bolt.Tx) error {
		vb := tx.Bucket(bktVolumes).Bucket(u64(id))
		if vb == nil {
			return fmt.Errorf("volume %d: %w", id, syscall.ENOENT)
		}
		name = string(vb.Bucket(bktVolMeta).Get([]byte("name")))
		if err := tx.Bucket(bktVolumes).DeleteBucket(u64(id)); err != nil {
			return err
		}
		if tx.Bucket(bktCopies).Bucket(u64(id)) != nil {
			if err := tx.Bucket(bktCopies).DeleteBucket(u64(id)); err != nil {
				return err
			}
		}
		return tx.Bucket(bktVolNames).Delete([]byte(name))
	})
	if err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(s.dir, "data", strconv.FormatUint(id, 10)))
}

// VolumeByName finds a volume; ENOENT if there is none.
func (s *Store) VolumeByName(name string) (node.Volume, error) {
	var v node.Volume
	err := s.db.View(func(tx *bolt.Tx) error {
		id := tx.Bucket(bktVolNames).Get([]byte(name))
		if id == nil {
			return fmt.Errorf("volume %q: %w", name, syscall.ENOENT)
		}
		v = volumeOf(getU64(id), tx.Bucket(bktVolumes).Bucket(id))
		return nil
	})
	return v, err
}

// VolumeByID finds a volume; ENOENT if there is none.
func (s *Store) VolumeByID(id uint64) (node.Volume, error) {
	var v node.Volume
	err := s.db.View(func(tx *bolt.Tx) error {
		vb := tx.Bucket(bktVolumes).Bucket(u64(id))
		if vb == nil {
			return fmt.Errorf("volume %d: %w", id, syscall.ENOENT)
		}
		v = volumeOf(id, vb)
		return nil
	})
	return v, err
}

// Volumes lists every volume by id.
func (s *Store) Volumes() ([]node.Volume, error) {
	var vs []node.Volume
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bktVolumes).ForEachBucket(func(k []byte) error {
			vs = append(vs, volumeOf(getU64(k), tx.Bucket(bktVolumes).Bucket(k)))
			return nil
		})
	})
	return vs, err
}

// update runs one read-write transaction, committed together with those of
// concurrent calls (group), turning a full disk into ENOSPC.
func (s *Store) update(fn func(tx *bolt.Tx) error) error {
	err := s.group.update(fn)
	if err != nil && errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("metadata: %w", syscall.ENOSPC)
	}
	return err
}

// Pristine reports whether volume id is as createVolume made it: its
// root directory alone, never changed.
func (s *Store) Pristine(id uint64) bool {
	pristine := false
	s.db.View(func(tx *bolt.Tx) error {
		vb := tx.Bucket(bktVolumes).Bucket(u64(id))
		if vb == nil {
			return nil
		}
		vn := vb.Bucket(bktVnodes)
		k, b := vn.Cursor().First()
		if k == nil || getU64(k) != 1 {
			return nil
		}
		if next, _ := vn.Cursor().Last(); getU64(next) != 1 {
			return nil
		}
		r, err := decodeRecord(b)
		pristine = err == nil && r.DV == 1
		return nil
	})
	return pristine
}
