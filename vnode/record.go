package vnode

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/hoardfs/hoard/node"
)

// record is a vnode as stored in the metadata database.
type record struct {
	Unique  uint64
	Type    node.Type
	Mode    uint32
	UID     uint32
	GID     uint32
	Size    uint64
	Nlink   uint32
	DV      uint64
	Atime   int64
	Mtime   int64
	Ctime   int64
	DataGen uint64 // which data file holds the bytes; 0: none yet (all zeros)
	Parent  uint64 // directories: the parent's vnode (root: itself); others: the governing directory's (acl.go), 0 in old records
	Cookie  uint64 // directories: the last readdir cookie handed out
	Rdev    uint64 // device nodes
	Target  string
}

const recordFixed = 8 + 1 + 4*3 + 8 + 4 + 8 + 8*3 + 8*4

var errCorrupt = errors.New("corrupt metadata record")

func (r *record) encode() []byte {
	b := make([]byte, recordFixed, recordFixed+len(r.Target))
	o := 0
	put64 := func(v uint64) { binary.BigEndian.PutUint64(b[o:], v); o += 8 }
	put32 := func(v uint32) { binary.BigEndian.PutUint32(b[o:], v); o += 4 }
	put64(r.Unique)
	b[o] = byte(r.Type)
	o++
	put32(r.Mode)
	put32(r.UID)
	put32(r.GID)
	put64(r.Size)
	put32(r.Nlink)
	put64(r.DV)
	put64(uint64(r.Atime))
	put64(uint64(r.Mtime))
	put64(uint64(r.Ctime))
	put64(r.DataGen)
	put64(r.Parent)
	put64(r.Cookie)
	put64(r.Rdev)
	return append(b, r.Target...)
}

func decodeRecord(b []byte) (record, error) {
	var r record
	if len(b) < recordFixed {
		return r, errCorrupt
	}
	o := 0
	get64 := func() uint64 { v := binary.BigEndian.Uint64(b[o:]); o += 8; return v }
	get32 := func() uint32 { v := binary.BigEndian.Uint32(b[o:]); o += 4; return v }
	r.Unique = get64()
	r.Type = node.Type(b[o])
	o++
	r.Mode = get32()
	r.UID = get32()
	r.GID = get32()
	r.Size = get64()
	r.Nlink = get32()
	r.DV = get64()
	r.Atime = int64(get64())
	r.Mtime = int64(get64())
	r.Ctime = int64(get64())
	r.DataGen = get64()
	r.Parent = get64()
	r.Cookie = get64()
	r.Rdev = get64()
	r.Target = string(b[o:])
	return r, nil
}

func (r *record) status(vol, vnode uint64) node.Status {
	return node.Status{
		FID:         node.FID{Volume: vol, Vnode: vnode, Unique: r.Unique},
		Type:        r.Type,
		Mode:        r.Mode,
		UID:         r.UID,
		GID:         r.GID,
		Size:        r.Size,
		Nlink:       r.Nlink,
		DataVersion: r.DV,
		Atime:       time.Unix(0, r.Atime),
		Mtime:       time.Unix(0, r.Mtime),
		Ctime:       time.Unix(0, r.Ctime),
		Target:      r.Target,
		Rdev:        r.Rdev,
	}
}

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

// nameKey is a directory entry's key in the names bucket: dir vnode then name,
// so one directory's entries are contiguous.
func nameKey(dir uint64, name string) []byte {
	return append(u64(dir), name...)
}

func cookieKey(dir, cookie uint64) []byte {
	return append(u64(dir), u64(cookie)...)
}

// entry is a names-bucket value: the child and the entry's readdir cookie.
type entry struct {
	Vnode  uint64
	Cookie uint64
	Type   node.Type
}

func (e entry) encode() []byte {
	b := make([]byte, 17)
	binary.BigEndian.PutUint64(b, e.Vnode)
	binary.BigEndian.PutUint64(b[8:], e.Cookie)
	b[16] = byte(e.Type)
	return b
}

func decodeEntry(b []byte) (entry, error) {
	if len(b) != 17 {
		return entry{}, errCorrupt
	}
	return entry{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), node.Type(b[16])}, nil
}
