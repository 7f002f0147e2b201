package node

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// The requests and answers client, proxy and server share. The server's
// store implements them (package vnode); the client and proxy speak them
// without linking that store.

// Attr is what a creator or setattr supplies.
type Attr struct {
	Mode uint32
	UID  uint32
	GID  uint32
	Rdev uint64 // device nodes
}

// RenameResult is everything a rename changed.
type RenameResult struct {
	SrcDir, DstDir Status
	Moved          Status
	// Replaced is the vnode that dst named before, if any (Nlink 0 if gone).
	Replaced *Status
}

// SetAttr bits say which fields of a SetAttr call apply.
const (
	SetMode uint32 = 1 << iota
	SetUID
	SetGID
	SetSize
	SetAtime
	SetMtime
)

// Change is a setattr request.
type Change struct {
	Mask         uint32
	Mode         uint32
	UID, GID     uint32
	Size         uint64
	Atime, Mtime time.Time
}

// DirEntry is one readdir result.
type DirEntry struct {
	Name   string
	FID    FID
	Type   Type
	Cookie uint64
}

// FSStat is file-system-wide space.
type FSStat struct {
	BlockSize, Blocks, BlocksFree, Files, FilesFree uint64
}

// Op names one client request that changes the namespace (create, link,
// remove, rename). A client sends a request again when its reply was lost
// (the connection broke, the server restarted), not knowing whether it was
// carried out; the outcome is recorded in the transaction that makes the
// change, so that the request sent again finds the change made rather than
// making it twice or failing (a rename applied before a crash must not
// answer ENOENT when retried after it). The empty Op names none.
type Op string

// NewOp names a new request: 128 random bits, as hex.
func NewOp() Op {
	var id [16]byte
	rand.Read(id[:])
	return Op(hex.EncodeToString(id[:]))
}

// MaxOp bounds an Op's length.
const MaxOp = 64

// Reserved is a file made under a directory delegation, to be created
// with the FID it was given.
type Reserved struct {
	Name  string
	FID   FID
	Attr  Attr
	Mtime time.Time
}

// Removed is a file removed under a directory delegation: Name named FID.
type Removed struct {
	Name string
	FID  FID
}

// RootVolume is the volume a new server creates and clients mount.
const RootVolume = "root"

// Volume describes one volume.
type Volume struct {
	ID      uint64
	Name    string
	Root    FID
	Created time.Time
	// Quota bounds the bytes of the volume's regular files (0: none);
	// Used is what they hold, Files how many vnodes the volume has.
	Quota, Used, Files uint64
}
