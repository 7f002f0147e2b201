package vnode

import (
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/node"
)

// statusOf is r's status (vnode in v's volume) with the blocks its data
// takes on this server's disk.
func (v *vtx) statusOf(r *record, vnode uint64) node.Status {
	st := r.status(v.id, vnode)
	st.Blocks = v.blocks(r, vnode)
	return st
}

// blocks counts the 512-byte blocks r's data occupies: a data file's own
// st_blocks (holes take none), inline bytes rounded up, and for the
// others what ext4 would give them, so that du adds up.
func (v *vtx) blocks(r *record, vnode uint64) uint64 {
	switch r.Type {
	case node.TypeDir, node.TypeMountPoint:
		return dirBlocks(r.Size)
	case node.TypeSymlink:
		if len(r.Target) < 60 {
			return 0 // ext4 keeps a short target in the inode
		}
		return 8
	case node.TypeFile:
	default:
		return 0
	}
	switch r.DataGen {
	case 0:
		return 0
	case genInline:
		return (r.Size + 511) / 512
	}
	if v.dir == "" {
		return 0
	}
	if b, ok := statBlocks(filepath.Join(v.dir, dataRel(v.id, vnode, r.DataGen))); ok {
		return b
	}
	// Published but not yet renamed into place (finish): the staging file
	// named by the redo record is the data file to be.
	if name := v.pendingSwap(vnode, r.DataGen); name != "" {
		if b, ok := statBlocks(filepath.Join(v.dir, "staging", name)); ok {
			return b
		}
	}
	return 0
}

// dirBlocks is a directory's blocks as ext4 counts them: whole 4 KiB
// blocks, one at least, of about 32 bytes an entry (entries is the
// directory's Size, the entries it ever had).
func dirBlocks(entries uint64) uint64 {
	return max(1, (entries*32+4095)/4096) * 8
}

func statBlocks(path string) (uint64, bool) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0, false
	}
	return uint64(st.Blocks), true
}

// pendingSwap names the staging file of an unfinished commit that makes
// generation gen of vnode, "" if there is none. Redo records are few:
// commits in flight.
func (v *vtx) pendingSwap(vnode, gen uint64) string {
	b := v.tx.Bucket(bktPending)
	if b == nil {
		return ""
	}
	var name string
	b.ForEach(func(k, val []byte) error {
		p, err := decodePending(val)
		if err == nil && p.vol == v.id && p.vnode == vnode && p.newGen == gen {
			name = string(k)
		}
		return nil
	})
	return name
}
