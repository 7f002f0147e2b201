package vnode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/node"
)

// A data store is staged in a file of its own, then committed in one of two
// ways. When the staged bytes make up the whole new file (the common case:
// a file written from the start), the staging file simply becomes the
// vnode's data file under a new generation number. Otherwise the staged
// ranges are copied into the data file in place. Either way the metadata
// transaction that publishes the new DataVersion also records a redo entry,
// so a crash after it is finished on restart, and one before it leaves the
// old version untouched. Readers take the vnode's lock, so nobody reads a
// half-applied version.

// ReadAt reads f's data at off into p under a shared lock and reports the
// data version the bytes belong to. Bytes past the size are not returned;
// io.EOF when off is at or past it.
func (s *Store) ReadAt(f node.FID, p []byte, off int64) (n int, st node.Status, err error) {
	if off < 0 {
		return 0, st, fmt.Errorf("read %v: negative offset: %w", f, syscall.EINVAL)
	}
	err = s.WithData(f, func(fst node.Status, data *os.File, mem []byte) error {
		st = fst
		if uint64(off) >= st.Size {
			return io.EOF
		}
		if rem := st.Size - uint64(off); uint64(len(p)) > rem {
			p = p[:rem]
		}
		switch {
		case data != nil:
			n, err = data.ReadAt(p, off)
		case off < int64(len(mem)):
			n = copy(p, mem[off:])
		}
		if data == nil || err == io.EOF {
			// No data file, or one shorter than the size after an
			// extending truncate: the rest are zeros.
			clear(p[n:])
			n, err = len(p), nil
		}
		return err
	})
	return n, st, err
}

// Update is one staged data change to a file. Writes are staged in
// memory while they stay below inlineMax, and in a staging file past it
// (spill).
type Update struct {
	s       *Store
	fid     node.FID
	mem     []byte   // staged bytes from 0, while no staging file is needed
	staging *os.File // nil until spill
	name    string
	ranges  []extent
	cut     uint64
	hasCut  bool
	size    uint64
	hasSize bool
	done    bool
}

type extent struct{ off, end int64 }

// BeginUpdate starts staging a change to the regular file f.
func (s *Store) BeginUpdate(f node.FID) (*Update, error) {
	var r record
	err := s.view(f.Volume, func(v *vtx) (err error) {
		r, err = v.get(f)
		return err
	})
	if err != nil {
		return nil, err
	}
	if r.Type != node.TypeFile {
		return nil, fmt.Errorf("write %v: %w", f, syscall.EISDIR)
	}
	return &Update{s: s, fid: f}, nil
}

// spill moves the staged bytes to a staging file, from which the commit of
// a file past inlineMax takes them.
func (u *Update) spill() error {
	if u.staging != nil {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Join(u.s.dir, "staging"), "s-*")
	if err != nil {
		return fmt.Errorf("write %v: %w", u.fid, errnoOf(err))
	}
	u.staging, u.name = tmp, filepath.Base(tmp.Name())
	if _, err := tmp.WriteAt(u.mem, 0); err != nil {
		return fmt.Errorf("write %v: %w", u.fid, errnoOf(err))
	}
	u.mem = nil
	return nil
}

// WriteAt stages p at off.
func (u *Update) WriteAt(p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) < off || off+int64(len(p)) > u.s.maxSize {
		return fmt.Errorf("write %v at %d: %w", u.fid, off, syscall.EFBIG)
	}
	if len(p) == 0 {
		return nil
	}
	end := off + int64(len(p))
	if u.staging == nil && end <= inlineMax {
		if int64(len(u.mem)) < end {
			u.mem = append(u.mem, make([]byte, end-int64(len(u.mem)))...)
		}
		copy(u.mem[off:], p)
	} else {
		if err := u.spill(); err != nil {
			return err
		}
		if _, err := u.staging.WriteAt(p, off); err != nil {
			return fmt.Errorf("write %v: %w", u.fid, errnoOf(err))
		}
	}
	u.ranges = append(u.ranges, extent{off, end})
	return nil
}

// probeMaxSize finds the largest size the file system under dir gives a
// file (ext4: 16 TiB less a block; XFS and tmpfs: far more), by growing a
// sparse scratch file: every size from the wire is checked against it
// before a change is published, since one the data file could not take
// would be published and then fail at every replay of its redo record.
func probeMaxSize(dir string) (int64, error) {
	f, err := os.CreateTemp(dir, "probe-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	lo, hi := int64(0), int64(math.MaxInt64) // lo fits; hi+1 does not
	for lo < hi {
		mid := lo + (hi-lo)/2 + 1
		if f.Truncate(mid) == nil {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo, f.Truncate(0)
}

// Truncate cuts the file to n before the staged writes land.
func (u *Update) Truncate(n uint64) {
	if !u.hasCut || n < u.cut {
		u.cut, u.hasCut = n, true
	}
}

// SetSize sets the file's size after the staged writes land: writes past it
// are dropped, and a size past the last byte written reads as zeros.
func (u *Update) SetSize(n uint64) { u.size, u.hasSize = n, true }

// Made reports whether a store named op was made already (its reply was
// lost), with the file's status now if so: a store sent again after the
// staged writes it would publish are gone can only be answered this way.
func (u *Update) Made(op node.Op) (st node.Status, made bool, err error) {
	if op == "" {
		return st, false, nil
	}
	err = u.s.view(u.fid.Volume, func(v *vtx) error {
		if d, ok := v.findOp(op); ok {
			st, made = v.statusNow(d.vnodes[0]), true
		}
		return nil
	})
	return st, made, err
}

// Abort discards the staged change.
func (u *Update) Abort() {
	if u.done {
		return
	}
	u.done = true
	if u.staging != nil {
		u.staging.Close()
		os.Remove(u.staging.Name())
	}
}

// pending is the redo record of a commit in flight.
type pending struct {
	vol, vnode uint64
	oldGen     uint64 // swap: the data file to delete afterwards
	newGen     uint64 // swap: the generation the staging file becomes; 0 for apply
	size       uint64
	ranges     []extent // apply: staged ranges to copy
}

func (p *pending) encode() []byte {
	b := make([]byte, 0, 40+16*len(p.ranges))
	for _, v := range []uint64{p.vol, p.vnode, p.oldGen, p.newGen, p.size} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	for _, e := range p.ranges {
		b = binary.BigEndian.AppendUint64(b, uint64(e.off))
		b = binary.BigEndian.AppendUint64(b, uint64(e.end))
	}
	return b
}

func decodePending(b []byte) (pending, error) {
	var p pending
	if len(b) < 40 || (len(b)-40)%16 != 0 {
		return p, errCorrupt
	}
	g := func(i int) uint64 { return binary.BigEndian.Uint64(b[i:]) }
	p.vol, p.vnode, p.oldGen, p.newGen, p.size = g(0), g(8), g(16), g(24), g(32)
	for i := 40; i < len(b); i += 16 {
		p.ranges = append(p.ranges, extent{int64(g(i)), int64(g(i + 8))})
	}
	return p, nil
}

// Commit publishes the staged change as the file's next data version. With
// sync, data and metadata are on stable storage before it returns. A
// commit named by an op already recorded changes nothing: it was made
// before, and its reply lost; the file's status is returned.
func (u *Update) Commit(sync bool, mtime time.Time, op node.Op) (node.Status, error) {
	if u.done {
		return node.Status{}, errors.New("update already finished")
	}
	defer u.Abort()
	s, f := u.s, u.fid
	ranges := mergeExtents(u.ranges)
	l := s.lock(f)
	l.Lock()
	defer l.Unlock()
	if err := s.checkStuck(f); err != nil {
		return node.Status{}, err
	}
	var r record
	var oldInline []byte
	var q room
	var before uint64 // what the file takes on disk before any byte moves
	err := s.view(f.Volume, func(v *vtx) (err error) {
		r, err = v.get(f)
		oldInline = v.inlineData(f.Vnode, &r)
		before = v.charge(&r, f.Vnode)
		if _, made := v.findOp(op); !made {
			q = v.room()
		}
		return err
	})
	if err != nil {
		return node.Status{}, err
	}
	// Old bytes survive below cut: the lowest of the old size, the
	// truncation point and the final size.
	cut := r.Size
	if u.hasCut {
		cut = min(cut, u.cut)
	}
	p := pending{vol: f.Volume, vnode: f.Vnode, size: cut}
	for _, e := range ranges {
		p.size = max(p.size, uint64(e.end))
	}
	if u.hasSize {
		p.size = u.size
		cut = min(cut, u.size)
		ranges = clipExtents(ranges, int64(u.size))
	}
	if p.size > uint64(s.maxSize) {
		return node.Status{}, fmt.Errorf("store %v: size %d: %w", f, p.size, syscall.EFBIG)
	}
	// Over the quota as it is now: refused before any byte is moved, by
	// what the store surely adds (its bytes past the old data; a size
	// alone adds none). publish checks again, by the blocks the new
	// version takes, in the transaction that counts them.
	var added int64
	for _, e := range ranges {
		added += max(0, e.end-max(e.off, int64(cut)))
	}
	if err := q.check(0, uint64(added)); err != nil {
		return node.Status{}, fmt.Errorf("store %v: %w", f, err)
	}
	if p.size <= inlineMax {
		data, err := u.content(r, oldInline, cut, p.size, ranges)
		if err != nil {
			return node.Status{}, fmt.Errorf("write %v: %w", f, errnoOf(err))
		}
		return u.commitInline(r, before, data, mtime, op)
	}
	if err := u.spill(); err != nil {
		return node.Status{}, err
	}
	old := filepath.Join(s.dir, dataRel(f.Volume, f.Vnode, r.DataGen))
	// Copy whichever is smaller: the staged bytes into the data file, or the
	// old bytes the store did not overwrite into the staging file. A file
	// with no data file yet is all zeros, as are the staging file's holes.
	gaps := gapsIn(ranges, int64(cut))
	switch {
	case r.DataGen == genInline:
		if err := fillGapsFrom(u.staging, oldInline, gaps); err != nil {
			return node.Status{}, fmt.Errorf("write %v: %w", f, errnoOf(err))
		}
		p.newGen = s.newGen()
	case r.DataGen == 0 || cut < r.Size && (len(ranges) > 0 || p.size > cut) ||
		len(ranges) > 0 && extentBytes(gaps) <= extentBytes(ranges):
		// In place, old bytes between cut and the new size would survive:
		// a truncation the size then grows past takes a new file.
		if r.DataGen != 0 {
			if err := fillGaps(u.staging, old, gaps); err != nil {
				return node.Status{}, fmt.Errorf("write %v: %w", f, errnoOf(err))
			}
		}
		p.oldGen, p.newGen = r.DataGen, s.newGen()
	default:
		p.ranges = ranges
		// Reserve the blocks first so that the in-place copy cannot run out
		// of space half way: a full disk fails here, before anything is
		// published.
		if err := reserve(old, ranges); err != nil {
			return node.Status{}, fmt.Errorf("write %v: %w", f, errnoOf(err))
		}
	}
	if p.newGen != 0 {
		// Cut now, as finish would: the quota counts the blocks it holds.
		if err := u.staging.Truncate(int64(p.size)); err != nil {
			return node.Status{}, fmt.Errorf("write %v: %w", f, errnoOf(err))
		}
	}
	if sync {
		if err := u.staging.Sync(); err != nil {
			return node.Status{}, fmt.Errorf("write %v: %w", f, errnoOf(err))
		}
	}
	st, made, err := s.publish(f, op, p.size, before, mtime, func(v *vtx, r *record) error {
		if r.DataGen == genInline {
			if err := v.inline.Delete(u64(f.Vnode)); err != nil {
				return err
			}
		}
		if p.newGen != 0 {
			r.DataGen = p.newGen
			if p.oldGen != 0 {
				if err := v.tx.Bucket(bktGarbage).Put([]byte(dataRel(f.Volume, f.Vnode, p.oldGen)), nil); err != nil {
					return err
				}
			}
		}
		return v.tx.Bucket(bktPending).Put([]byte(u.name), p.encode())
	})
	if err != nil || made {
		return st, err
	}
	if err := s.finish(u.name, p, sync); err != nil {
		// Published but not carried out: refuse this file until a restart
		// replays the redo record rather than serve a half-applied version.
		s.setStuck(f)
		return node.Status{}, fmt.Errorf("write %v: %w", f, errnoOf(err))
	}
	return st, nil
}

// publish runs the transaction that makes a store's new version of file
// f, of size bytes (mtime, if not zero, is the writer's): apply changes the
// record, read afresh, and the buckets that hold the bytes. The quota
// counts the blocks the new version takes (its staging file's, or its
// data file's with the blocks reserved for the store) in place of
// before, what it took before the store moved a byte. A store already
// made under op (its reply was lost) is answered with the status it made
// instead (made).
func (s *Store) publish(f node.FID, op node.Op, size, before uint64, mtime time.Time, apply func(v *vtx, r *record) error) (st node.Status, made bool, err error) {
	err = s.mutate(f.Volume, func(v *vtx) error {
		made = false // a run may be repeated (group)
		if d, ok := v.findOp(op); ok {
			st, made = v.statusNow(d.vnodes[0]), true
			return nil
		}
		r, err := v.get(f)
		if err != nil {
			return err
		}
		if err := apply(v, &r); err != nil {
			return err
		}
		r.Size = size
		if err := v.resize(before, v.charge(&r, f.Vnode)); err != nil {
			return fmt.Errorf("store %v: %w", f, err)
		}
		r.DV++
		if mtime.IsZero() {
			r.Mtime = v.now
		} else {
			r.Mtime = mtime.UnixNano()
		}
		r.Ctime = v.now
		st = v.statusOf(&r, f.Vnode)
		if err := v.put(f.Vnode, &r); err != nil {
			return err
		}
		return v.recordOp(op, done{vnodes: []named{namedBy(st)}})
	})
	return st, made, err
}

// finish carries out a published commit; recovery calls it again for any
// commit a crash interrupted, so every step is idempotent.
func (s *Store) finish(name string, p pending, sync bool) error {
	staging := filepath.Join(s.dir, "staging", name)
	var garbage []byte
	if p.newGen != 0 {
		final := filepath.Join(s.dir, dataRel(p.vol, p.vnode, p.newGen))
		if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
			return err
		}
		if err := os.Truncate(staging, int64(p.size)); err == nil {
			if err := os.Rename(staging, final); err != nil {
				return err
			}
		} else if _, serr := os.Stat(final); serr != nil {
			return err
		}
		if sync {
			if err := syncDir(filepath.Dir(final)); err != nil {
				return err
			}
		}
		if p.oldGen != 0 {
			garbage = []byte(dataRel(p.vol, p.vnode, p.oldGen))
			if err := os.Remove(filepath.Join(s.dir, string(garbage))); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	} else if err := s.apply(staging, p, sync); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		if garbage != nil {
			if err := tx.Bucket(bktGarbage).Delete(garbage); err != nil {
				return err
			}
		}
		return tx.Bucket(bktPending).Delete([]byte(name))
	})
}

// apply copies the staged ranges into the current data file in place.
func (s *Store) apply(staging string, p pending, sync bool) error {
	var gen uint64
	err := s.view(p.vol, func(v *vtx) error {
		b := v.vnodes.Get(u64(p.vnode))
		if b == nil {
			return nil // removed since (recovery only): nothing to apply
		}
		r, err := decodeRecord(b)
		gen = r.DataGen
		return err
	})
	if err != nil || gen == 0 || gen == genInline {
		os.Remove(staging)
		return err
	}
	src, err := os.Open(staging)
	if errors.Is(err, os.ErrNotExist) {
		return nil // applied before a crash took the redo record's deletion
	}
	if err != nil {
		return err
	}
	defer src.Close()
	// Readers that pinned this generation (PinData) are not waited for:
	// those whose bytes are about to change learn it.
	s.spoil(p.vol, p.vnode, gen, p.ranges)
	dst, err := os.OpenFile(filepath.Join(s.dir, dataRel(p.vol, p.vnode, gen)), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer dst.Close()
	for _, e := range p.ranges {
		if err := copyRange(dst, src, e); err != nil {
			return err
		}
	}
	if err := dst.Truncate(int64(p.size)); err != nil {
		return err
	}
	if sync {
		if err := unix.Fdatasync(int(dst.Fd())); err != nil {
			return err
		}
	}
	return os.Remove(staging)
}

// fillGaps copies the old file's bytes in gaps into the staging file, so
// that the staging file becomes the whole new file.
func fillGaps(staging *os.File, old string, gaps []extent) error {
	if len(gaps) == 0 {
		return nil
	}
	src, err := os.Open(old)
	if err != nil {
		return err
	}
	defer src.Close()
	for _, g := range gaps {
		if err := copyRange(staging, src, g); err != nil {
			return err
		}
	}
	return nil
}

// gapsIn returns the parts of [0, size) that ranges (merged, sorted) miss.
func gapsIn(ranges []extent, size int64) []extent {
	var gaps []extent
	at := int64(0)
	for _, e := range ranges {
		if e.off >= size {
			break
		}
		if e.off > at {
			gaps = append(gaps, extent{at, e.off})
		}
		at = max(at, e.end)
	}
	if at < size {
		gaps = append(gaps, extent{at, size})
	}
	return gaps
}

// clipExtents drops what lies at or past size.
func clipExtents(es []extent, size int64) []extent {
	var out []extent
	for _, e := range es {
		if e.off < size {
			out = append(out, extent{e.off, min(e.end, size)})
		}
	}
	return out
}

func extentBytes(es []extent) int64 {
	var n int64
	for _, e := range es {
		n += e.end - e.off
	}
	return n
}

// copyRange copies one extent between files inside the kernel.
func copyRange(dst, src *os.File, e extent) error {
	for off := e.off; off < e.end; {
		roff, woff := off, off
		n, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(e.end-off), 0)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("staging file short at %d", off)
		}
		off += int64(n)
	}
	return nil
}

// reserve allocates the blocks of ranges in the file at path without
// changing its size.
func reserve(path string, ranges []extent) error {
	fd, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer fd.Close()
	for _, e := range ranges {
		if err := unix.Fallocate(int(fd.Fd()), unix.FALLOC_FL_KEEP_SIZE, e.off, e.end-e.off); err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
			return err
		}
	}
	return nil
}

func mergeExtents(in []extent) []extent {
	if len(in) == 0 {
		return nil
	}
	es := append([]extent(nil), in...)
	sort.Slice(es, func(i, j int) bool { return es[i].off < es[j].off })
	out := es[:1]
	for _, e := range es[1:] {
		last := &out[len(out)-1]
		if e.off <= last.end {
			last.end = max(last.end, e.end)
		} else {
			out = append(out, e)
		}
	}
	return out
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// errnoOf digs the errno out of an *os.PathError and friends.
func errnoOf(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// recover finishes interrupted commits, deletes freed data files, and
// empties the staging directory.
func (s *Store) recover() error {
	type item struct {
		name string
		p    pending
	}
	var todo []item
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bktPending).ForEach(func(k, v []byte) error {
			p, err := decodePending(v)
			if err != nil {
				return fmt.Errorf("redo record %q: %w", k, err)
			}
			todo = append(todo, item{string(k), p})
			return nil
		})
	})
	if err != nil {
		return err
	}
	for _, it := range todo {
		if err := s.finish(it.name, it.p, true); err != nil {
			// One file must not keep the server from starting: it
			// is refused (EIO) until a later start can carry the
			// commit out, and the others are served.
			f := node.FID{Volume: it.p.vol, Vnode: it.p.vnode}
			s.quarantine(f, fmt.Errorf("redo %s: %w", it.name, err))
		}
	}
	s.collectGarbage()
	ents, err := os.ReadDir(filepath.Join(s.dir, "staging"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		os.Remove(filepath.Join(s.dir, "staging", e.Name()))
	}
	return nil
}

// collectGarbage deletes data files that committed transactions freed.
// The data file of a removed vnode is deleted under the vnode's lock: a
// store committed just before the remove may still be moving its staging
// file into place under that name, and its redo record must be gone before
// the file is, or a crash in between leaves a redo that cannot be carried
// out. (The value names the vnode; a swapped-out generation has none, and
// its commit deletes it itself.)
func (s *Store) collectGarbage() {
	var paths []string
	var owners [][]byte
	s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bktGarbage).ForEach(func(k, v []byte) error {
			paths = append(paths, string(k))
			owners = append(owners, bytes.Clone(v))
			return nil
		})
	})
	if len(paths) == 0 {
		return
	}
	for i, p := range paths {
		if o := owners[i]; len(o) == 16 {
			l := s.lock(node.FID{Volume: binary.BigEndian.Uint64(o), Vnode: binary.BigEndian.Uint64(o[8:])})
			l.Lock()
			os.Remove(filepath.Join(s.dir, p))
			l.Unlock()
		} else {
			os.Remove(filepath.Join(s.dir, p))
		}
	}
	s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktGarbage)
		for _, p := range paths {
			if err := b.Delete([]byte(p)); err != nil {
				return err
			}
		}
		return nil
	})
}

// WithData calls fn with f's status and its bytes: its open data file, or
// a copy of them when they are inline (mem), or neither while the file
// has no data (all zeros). It runs under the file's shared lock, so the
// bytes fn reads belong to that status's data version. fn should be
// quick: a store of f waits for it.
func (s *Store) WithData(f node.FID, fn func(st node.Status, file *os.File, mem []byte) error) error {
	l := s.lock(f)
	l.RLock()
	defer l.RUnlock()
	st, _, fd, mem, err := s.openData(f)
	if err != nil {
		return err
	}
	if fd != nil {
		defer fd.Close()
	}
	return fn(st, fd, mem)
}

// openData is f's status and its bytes now: its data file opened (of
// generation gen), or its inline bytes, or neither (no data yet). The
// caller holds f's lock.
func (s *Store) openData(f node.FID) (st node.Status, gen uint64, fd *os.File, mem []byte, err error) {
	if err := s.checkStuck(f); err != nil {
		return st, 0, nil, nil, err
	}
	var r record
	err = s.view(f.Volume, func(v *vtx) (err error) {
		r, err = v.get(f)
		mem = v.inlineData(f.Vnode, &r)
		st = v.statusOf(&r, f.Vnode)
		return err
	})
	switch {
	case err != nil:
		return st, 0, nil, nil, err
	case r.Type != node.TypeFile:
		return st, 0, nil, nil, fmt.Errorf("read %v: %w", f, syscall.EISDIR)
	case r.DataGen == genInline && uint64(len(mem)) != r.Size:
		return st, 0, nil, nil, fmt.Errorf("read %v: %d bytes inline for a size of %d: %w", f, len(mem), r.Size, syscall.EIO)
	case r.DataGen == 0 || r.DataGen == genInline:
		return st, 0, nil, mem, nil
	}
	fd, err = os.Open(filepath.Join(s.dir, dataRel(f.Volume, f.Vnode, r.DataGen)))
	return st, r.DataGen, fd, nil, err
}
