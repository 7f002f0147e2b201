package proxystore

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/hoardfs/hoard/chunkindex"
	"github.com/hoardfs/hoard/node"
)

const recordVersion = 1

var errBadRecord = errors.New("bad index record")

// encodeLocked is f's index record: its version and size, then each run
// with its chunks' CRCs and which of them are still to be verified.
func (s *Store) encodeLocked(f *file) []byte {
	b := []byte{recordVersion}
	b = binary.AppendUvarint(b, f.dv)
	b = binary.AppendUvarint(b, uint64(f.size))
	b = binary.AppendUvarint(b, uint64(len(f.runs)))
	for _, r := range f.runs {
		for _, v := range []uint64{uint64(r.first), uint64(r.at.pool), uint64(r.at.block), uint64(r.took), uint64(r.last), uint64(r.n()), uint64(len(r.unverified))} {
			b = binary.AppendUvarint(b, v)
		}
		for _, c := range r.crcs {
			b = binary.LittleEndian.AppendUint32(b, c)
		}
		for _, w := range r.unverified {
			b = binary.LittleEndian.AppendUint64(b, w)
		}
	}
	return b
}

// decode reads a record; the runs it returns are not yet in the store.
func decode(fid node.FID, b []byte) (*file, error) {
	if len(b) == 0 || b[0] != recordVersion {
		return nil, errBadRecord
	}
	b = b[1:]
	bad := false
	next := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			bad = true
			return 0
		}
		b = b[n:]
		return v
	}
	f := &file{fid: fid, dv: next(), size: int64(next())}
	nruns := next()
	for i := uint64(0); i < nruns && !bad; i++ {
		r := &run{f: f, first: int64(next()), at: loc{pool: int32(next()), block: int64(next())}, took: time.Duration(next()), last: int64(next())}
		n, nw := next(), next()
		if bad || n == 0 || n > 1<<32 || nw > (n+63)/64 || uint64(len(b)) < n*4+nw*8 {
			return nil, errBadRecord
		}
		r.crcs = make([]uint32, n)
		for j := range r.crcs {
			r.crcs[j] = binary.LittleEndian.Uint32(b)
			b = b[4:]
		}
		if nw > 0 {
			r.unverified = make([]uint64, nw)
			for j := range r.unverified {
				r.unverified[j] = binary.LittleEndian.Uint64(b)
				b = b[8:]
			}
		}
		f.runs = append(f.runs, r)
	}
	if bad || len(b) != 0 {
		return nil, errBadRecord
	}
	return f, nil
}

// load reads the index. After an unclean stop every chunk is marked to be
// verified before it is served, and a run whose room overlaps another's
// (its blocks were reused before the index caught up) is dropped.
func (s *Store) load(clean bool) error {
	return s.idx.Load(func(k, v []byte) error {
		fid, _ := node.FIDOfKey(k)
		f, err := decode(fid, v)
		if err != nil || fid.IsZero() {
			return chunkindex.Drop
		}
		runs := f.runs
		f.runs = nil
		prev := int64(-1)
		for _, r := range runs {
			if r.first <= prev || !s.layout.claim(r.at, r.n(), r.last) {
				continue
			}
			prev = r.first + r.n() - 1
			if !clean {
				r.unverified = make([]uint64, (r.n()+63)/64)
				for i := range r.n() {
					r.unverified[i/64] |= 1 << (i % 64)
				}
			}
			for i := range r.n() {
				s.used += blocks(r.chunkLen(i, s.cs))
			}
			r.elem = s.lru.PushBack(r)
			f.runs = append(f.runs, r)
			s.nruns++
			s.nchunks += r.n()
		}
		if len(f.runs) > 0 {
			s.files[fid] = f
		}
		if len(f.runs) != len(runs) {
			s.pending[fid] = true
		}
		return nil
	})
}

// commitInterval is how often changed records are written.
const commitInterval = time.Second

// changes encodes the records changed since the last commit.
func (s *Store) changes() map[string][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := make(map[string][]byte, len(s.pending))
	for fid := range s.pending {
		var v []byte
		if f := s.files[fid]; f != nil {
			v = s.encodeLocked(f)
		}
		recs[string(fid.Key())] = v
	}
	clear(s.pending)
	return recs
}
