package mount

import (
	"context"
	"io"
	"os"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/client"
)

type openMode uint8

const (
	modeCached openMode = iota
	modePassthrough
	modeDirect // bypass: no kernel page cache
	// modeServed is an open the kernel counts as passthrough but whose
	// reads and writes come to the daemon (FOPEN_DIRECT_IO): the inode's
	// backing file holds another version than the one it opened.
	modeServed
)

// handle is one open file: reads and writes go to the cache manager, as
// the user who opened it (the File's), whose view of the client k is.
type handle struct {
	h    *hnode
	f    *client.File
	k    *client.Nodes
	mode openMode
}

var (
	_ = (fs.FileReader)((*handle)(nil))
	_ = (fs.FileWriter)((*handle)(nil))
	_ = (fs.FileFlusher)((*handle)(nil))
	_ = (fs.FileFsyncer)((*handle)(nil))
	_ = (fs.FileReleaser)((*handle)(nil))
	_ = (fs.FilePassthroughFder)((*ptHandle)(nil))
)

func (fh *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := fh.f.ReadAt(dest, off)
	if err != nil && err != io.EOF {
		return nil, errno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (fh *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := fh.f.WriteAt(data, off)
	if n > 0 {
		fh.h.m.wrote(fh.h)
	}
	return uint32(n), errno(err)
}

// Flush is close(2): the file's writes are stored, durably, before it
// returns, so that a later open anywhere sees them.
func (fh *handle) Flush(ctx context.Context) syscall.Errno {
	return errno(fh.f.Flush())
}

func (fh *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return errno(fh.f.Sync())
}

func (fh *handle) Release(ctx context.Context) syscall.Errno {
	err := fh.f.Close()
	fh.h.released(fh.mode)
	return errno(err)
}

// Allocate supports plain posix_fallocate (mode 0); punching holes and the
// other modes are not supported.
func (fh *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if mode != 0 {
		return syscall.EOPNOTSUPP
	}
	return errno(fh.f.Allocate(int64(off), int64(size)))
}

// ptHandle is an open whose reads the kernel serves from the cache file.
type ptHandle struct {
	*handle
	backing *os.File
}

func (p *ptHandle) Release(ctx context.Context) syscall.Errno {
	if p.backing != nil {
		p.backing.Close()
	}
	return p.handle.Release(ctx)
}

// PassthroughFd opens the cache file for the kernel to read from; the
// entry is pinned, so its chunks stay until Release.
func (p *ptHandle) PassthroughFd() (int, bool) {
	path := p.h.n.CachePath()
	if path == "" {
		return 0, false
	}
	// Read-write: a later writer of the same inode shares this backing
	// file (the kernel registers one per inode).
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, false
	}
	// go-fuse registers the descriptor with the kernel; keep it open
	// until release.
	p.backing = f
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) == nil {
		p.h.mu.Lock()
		p.h.ptFile = fileID{uint64(st.Dev), st.Ino}
		p.h.mu.Unlock()
	}
	return int(f.Fd()), true
}
