// Package node holds the vocabulary every part of hoard shares: file
// identifiers, file status and the rules for names. It has no I/O.
package node

import (
	"encoding/binary"
	"fmt"
	"time"
)

// FID names a file or directory for its whole life. Vnode numbers are never
// reused within a volume; Unique is checked as well, so a FID held by a client
// across a volume restore or re-creation is detected as stale instead of being
// confused with a newer file.
type FID struct {
	Volume uint64
	Vnode  uint64
	Unique uint64
}

func (f FID) String() string { return fmt.Sprintf("%d.%d.%d", f.Volume, f.Vnode, f.Unique) }

// Key is f as 24 bytes, big-endian: a key that sorts as FIDs do, for the
// caches' indexes.
func (f FID) Key() []byte {
	b := make([]byte, 24)
	binary.BigEndian.PutUint64(b, f.Volume)
	binary.BigEndian.PutUint64(b[8:], f.Vnode)
	binary.BigEndian.PutUint64(b[16:], f.Unique)
	return b
}

// FIDOfKey is the FID whose Key is b; false if b is not 24 bytes.
func FIDOfKey(b []byte) (FID, bool) {
	if len(b) != 24 {
		return FID{}, false
	}
	return FID{Volume: binary.BigEndian.Uint64(b), Vnode: binary.BigEndian.Uint64(b[8:]), Unique: binary.BigEndian.Uint64(b[16:])}, true
}

// IsZero reports whether f is the zero FID, which names nothing.
func (f FID) IsZero() bool { return f == FID{} }

// Type is the kind of a vnode.
type Type uint8

const (
	TypeFile Type = iota + 1
	TypeDir
	TypeSymlink
	// TypeMountPoint is an AFS-style mount point: a directory entry whose
	// target is the root of another volume, named by Target.
	TypeMountPoint
	// Special files carry no data in hoard, only their type (and Rdev):
	// the kernel that opens them gives them meaning, as with NFS.
	TypeFifo
	TypeSocket
	TypeCharDev
	TypeBlockDev
)

// Special reports whether t is a fifo, socket or device node.
func (t Type) Special() bool { return t >= TypeFifo && t <= TypeBlockDev }

func (t Type) String() string {
	switch t {
	case TypeFile:
		return "file"
	case TypeDir:
		return "dir"
	case TypeSymlink:
		return "symlink"
	case TypeMountPoint:
		return "mountpoint"
	case TypeFifo:
		return "fifo"
	case TypeSocket:
		return "socket"
	case TypeCharDev:
		return "chardev"
	case TypeBlockDev:
		return "blockdev"
	}
	return fmt.Sprintf("type(%d)", t)
}

// Status is what the server says about a vnode at one DataVersion.
type Status struct {
	FID   FID
	Type  Type
	Mode  uint32 // permission bits only (07777)
	UID   uint32
	GID   uint32
	Size  uint64
	Nlink uint32
	// DataVersion increases with every change to the vnode's data (file
	// contents, directory entries); it never decreases.
	DataVersion uint64
	Atime       time.Time
	Mtime       time.Time
	Ctime       time.Time
	// Target is the link text of a symlink or the volume name of a mount point.
	Target string
	// Rdev is a device node's device number.
	Rdev uint64
	// Blocks is the 512-byte blocks the data takes on the server (a sparse
	// file's holes take none), for st_blocks: du and quotas add these up.
	Blocks uint64
	// Rights is what the user of the request that got this status may do
	// with the file (access.Rights, with RightsKnown set): not the
	// file's, the asker's. Zero in a status the client made itself.
	Rights uint8
}

// RightsKnown marks Status.Rights as the server's answer.
const RightsKnown = 1 << 7

// MaxName is the longest name a directory entry may have, in bytes.
const MaxName = 255

// MaxTarget is the longest symlink or mount-point target, in bytes.
const MaxTarget = 4096
