// Package chunkindex is what the client's cache and the proxy's store
// keep of their chunks besides the chunks: a lock that keeps a second
// process out of the directory, an index (bbolt, index.db) of one record
// per file that the store encodes and this package writes in groups in
// the background, the store's counters, kept in the index and published
// as stats.json for other processes, and the CRC32C every chunk is
// checked against.
//
// Commits are not synced while the store runs: an fsync would make the
// file system write back the chunks' new blocks with it, and throttle
// fetches to disk speed. What makes that safe is the clean mark, synced
// at Start (not clean) and at Close (clean): after an unclean stop the
// index may be ahead of or behind the data, and the store checks its
// chunks against their CRCs before it serves them.
package chunkindex

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

var (
	bktRecords = []byte("files")
	bktMeta    = []byte("meta")
	keyClean   = []byte("clean")
	keyStats   = []byte("stats")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC32C of a chunk, as records keep it.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Drop, returned by a Load callback, removes the record.
var Drop = errors.New("drop the record")

// Source is what a commit takes from the store.
type Source struct {
	// Changes returns the records changed since it was last called, by
	// key; a nil value removes the record.
	Changes func() map[string][]byte
	// Stats returns the store's counters, for json.Marshal.
	Stats func() any
}

// Index is an open index. Its methods are not for concurrent use, except
// Commit and Indexed, which the committer uses too.
type Index struct {
	dir   string
	lock  *os.File
	db    *bolt.DB
	clean bool

	src  Source
	stop chan struct{} // nil until Start
	done chan struct{}

	mu sync.Mutex // one commit at a time
	// retry holds the records a failed commit did not write.
	retry   map[string][]byte
	indexed atomic.Int64 // Unix nanoseconds
}

// ErrInUse says another process (a mount, most often) holds the index.
var ErrInUse = errors.New("in use by another process")

// Open locks dir, which must exist, and opens its index, making it if
// needed. An index that cannot be read is replaced by an empty one: the
// store finds it unclean and empty, and discards the data it described.
func Open(dir string) (*Index, error) {
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("%s is %w", dir, ErrInUse)
	}
	x := &Index{dir: dir, lock: lock}
	if err := x.open(); err != nil {
		slog.Warn("index unreadable; starting empty", "dir", dir, "err", err)
		err = x.Reset()
		if err != nil {
			lock.Close()
			return nil, err
		}
	}
	return x, nil
}

func (x *Index) path() string { return filepath.Join(x.dir, "index.db") }

func (x *Index) open() (err error) {
	x.db, err = bolt.Open(x.path(), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return err
	}
	x.db.NoSync = true
	err = x.db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bktRecords); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bktMeta)
		if err != nil {
			return err
		}
		// The cache wrote the mark as a byte 1, the proxy's store as the
		// digit: either is clean.
		v := meta.Get(keyClean)
		x.clean = len(v) == 1 && (v[0] == 1 || v[0] == '1')
		return nil
	})
	if err != nil {
		x.db.Close()
		x.db = nil
	}
	return err
}

// Reset replaces the index with an empty one, unclean: for a store that
// cannot use what it holds.
func (x *Index) Reset() error {
	if x.db != nil {
		x.db.Close()
		x.db = nil
	}
	if err := os.Remove(x.path()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return x.open()
}

// Clean reports whether the store was closed cleanly last time.
func (x *Index) Clean() bool { return x.clean }

// Setting returns the value kept under key, keeping def there first if
// there is none: a parameter the store was made with.
func (x *Index) Setting(key string, def []byte) ([]byte, error) {
	var v []byte
	err := x.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bktMeta)
		if have := meta.Get([]byte(key)); have != nil {
			v = append([]byte(nil), have...)
			return nil
		}
		v = def
		return meta.Put([]byte(key), def)
	})
	return v, err
}

// LoadStats decodes into v the counters of the last commit; false if
// there are none.
func (x *Index) LoadStats(v any) bool {
	ok := false
	x.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktMeta).Get(keyStats)
		ok = b != nil && json.Unmarshal(b, v) == nil
		return nil
	})
	return ok
}

// Load calls fn with every record; fn returns Drop to remove it, or
// another error to stop.
func (x *Index) Load(fn func(key, val []byte) error) error {
	return x.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktRecords)
		var drop [][]byte
		err := b.ForEach(func(k, v []byte) error {
			err := fn(k, v)
			if errors.Is(err, Drop) {
				drop = append(drop, k)
				return nil
			}
			return err
		})
		if err != nil {
			return err
		}
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// Start marks the store in use, durably, and commits what src gives
// every interval from now on; stats.json is written about once a second.
func (x *Index) Start(src Source, every time.Duration) error {
	x.src = src
	if err := x.setClean(false); err != nil {
		return err
	}
	x.stop, x.done = make(chan struct{}), make(chan struct{})
	go x.run(every)
	return nil
}

func (x *Index) run(every time.Duration) {
	defer close(x.done)
	t := time.NewTicker(every)
	defer t.Stop()
	publish := max(1, int(time.Second/every))
	for n := 1; ; n++ {
		select {
		case <-x.stop:
			return
		case <-t.C:
		}
		if err := x.Commit(); err != nil {
			slog.Warn("index commit failed", "dir", x.dir, "err", err)
		}
		if n%publish == 0 {
			x.publish()
		}
	}
}

// Commit writes the changed records and the counters now (once
// started).
func (x *Index) Commit() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	at := time.Now()
	stats, err := json.Marshal(x.src.Stats())
	if err != nil {
		return err
	}
	recs := x.retry
	x.retry = nil
	for k, v := range x.src.Changes() {
		if recs == nil {
			recs = map[string][]byte{}
		}
		recs[k] = v
	}
	err = x.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktRecords)
		for k, v := range recs {
			var err error
			if v == nil {
				err = b.Delete([]byte(k))
			} else {
				err = b.Put([]byte(k), v)
			}
			if err != nil {
				return err
			}
		}
		return tx.Bucket(bktMeta).Put(keyStats, stats)
	})
	if err != nil {
		x.retry = recs
		return err
	}
	x.indexed.Store(at.UnixNano())
	return nil
}

// Indexed is when the last commit began: every change the store made
// before then is in the index file (not necessarily synced; enough for a
// process killed after). Zero before the first commit.
func (x *Index) Indexed() time.Time {
	if n := x.indexed.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

func (x *Index) setClean(clean bool) error {
	v := []byte{0}
	if clean {
		v[0] = 1
	}
	if err := x.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bktMeta).Put(keyClean, v) }); err != nil {
		return err
	}
	return x.db.Sync()
}

// publish writes the counters to dir/stats.json, whole or not at all.
func (x *Index) publish() {
	b, err := json.MarshalIndent(x.src.Stats(), "", "  ")
	if err != nil {
		return
	}
	tmp := filepath.Join(x.dir, ".stats.json.tmp")
	if os.WriteFile(tmp, b, 0o600) == nil {
		os.Rename(tmp, filepath.Join(x.dir, "stats.json"))
	}
}

// ReadStats decodes into v the counters a store in dir last published.
func ReadStats(dir string, v any) error {
	b, err := os.ReadFile(filepath.Join(dir, "stats.json"))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func (x *Index) halt() {
	if x.stop != nil {
		close(x.stop)
		<-x.done
		x.stop = nil
	}
}

// Close ends a started index: it commits what is left, marks the store
// clean, durably, publishes the counters and releases the directory.
// The store's data must be on disk first if the clean mark is to vouch
// for it.
func (x *Index) Close() error {
	x.halt()
	err := x.Commit()
	if err == nil {
		err = x.db.Sync() // every record the clean mark vouches for first
	}
	if err == nil {
		err = x.setClean(true)
	}
	x.publish()
	if cerr := x.db.Close(); err == nil {
		err = cerr
	}
	x.lock.Close()
	return err
}

// Abandon releases the index as a killed process would: no last commit
// and no clean mark. For a store that fails to open, and for tests of
// what a crash leaves.
func (x *Index) Abandon() {
	x.halt()
	if x.db != nil {
		x.db.Close()
	}
	x.lock.Close()
}
