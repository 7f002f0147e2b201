package cache

import (
	"encoding/binary"
	"errors"
	"sort"
	"time"

	"github.com/hoardfs/hoard/node"
)

// The index record of one cached file, as stored in index.db.
type record struct {
	st     node.Status
	hasSt  bool
	cut    int64 // -1: no local truncation pending
	chunks []chunkRecord
	dirty  []Range
	policy map[string]string
}

type chunkRecord struct {
	idx   int64
	n     int64 // valid bytes
	crc   uint32
	dirty bool
}

const recordVersion = 1

var errBadRecord = errors.New("bad index record")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func (r *record) encode() []byte {
	b := []byte{recordVersion}
	if r.hasSt {
		s := r.st
		b = append(b, 1)
		b = append(b, s.FID.Key()...)
		b = append(b, byte(s.Type))
		for _, v := range []uint64{uint64(s.Mode), uint64(s.UID), uint64(s.GID), s.Size, uint64(s.Nlink), s.DataVersion,
			uint64(s.Atime.UnixNano()), uint64(s.Mtime.UnixNano()), uint64(s.Ctime.UnixNano())} {
			b = binary.AppendUvarint(b, v)
		}
		b = appendString(b, s.Target)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendVarint(b, r.cut)
	b = binary.AppendUvarint(b, uint64(len(r.chunks)))
	for _, c := range r.chunks {
		b = binary.AppendUvarint(b, uint64(c.idx))
		b = binary.AppendUvarint(b, uint64(c.n))
		b = binary.BigEndian.AppendUint32(b, c.crc)
		if c.dirty {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.dirty)))
	for _, d := range r.dirty {
		b = binary.AppendUvarint(b, uint64(d.Off))
		b = binary.AppendUvarint(b, uint64(d.Len))
	}
	keys := make([]string, 0, len(r.policy))
	for k := range r.policy {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendString(b, k)
		b = appendString(b, r.policy[k])
	}
	return b
}

// decoder reads a record, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) < 1 {
		d.err = errBadRecord
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errBadRecord
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errBadRecord
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil || len(d.b) < n || n < 0 {
		d.err = errBadRecord
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err = errBadRecord
		return ""
	}
	return string(d.bytes(int(n)))
}

func decodeRecord(b []byte) (record, error) {
	d := &decoder{b: b}
	var r record
	if d.byte() != recordVersion {
		return r, errBadRecord
	}
	if d.byte() == 1 {
		r.hasSt = true
		fid, _ := node.FIDOfKey(d.bytes(24))
		r.st.FID = fid
		r.st.Type = node.Type(d.byte())
		r.st.Mode = uint32(d.uvarint())
		r.st.UID = uint32(d.uvarint())
		r.st.GID = uint32(d.uvarint())
		r.st.Size = d.uvarint()
		r.st.Nlink = uint32(d.uvarint())
		r.st.DataVersion = d.uvarint()
		r.st.Atime = time.Unix(0, int64(d.uvarint()))
		r.st.Mtime = time.Unix(0, int64(d.uvarint()))
		r.st.Ctime = time.Unix(0, int64(d.uvarint()))
		r.st.Target = d.string()
	}
	r.cut = d.varint()
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		return r, errBadRecord
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		c := chunkRecord{idx: int64(d.uvarint()), n: int64(d.uvarint())}
		if crc := d.bytes(4); crc != nil {
			c.crc = binary.BigEndian.Uint32(crc)
		}
		c.dirty = d.byte() == 1
		r.chunks = append(r.chunks, c)
	}
	n = d.uvarint()
	if n > uint64(len(d.b)) {
		return r, errBadRecord
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		r.dirty = append(r.dirty, Range{Off: int64(d.uvarint()), Len: int64(d.uvarint())})
	}
	n = d.uvarint()
	if n > uint64(len(d.b)) {
		return r, errBadRecord
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		if r.policy == nil {
			r.policy = map[string]string{}
		}
		k := d.string()
		r.policy[k] = d.string()
	}
	return r, d.err
}
