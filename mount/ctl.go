package mount

import (
	"context"
	"encoding/json"
	"errors"
	"syscall"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/user"
)

// The `hoard cache` commands talk to a mount through extended attributes
// of the paths they name, as `hoard cache policy` does (PolicyXattr), and
// as OpenAFS's fs command talks to its cache manager through pioctls on
// paths: what a command may do to a file is what the caller's own lookup
// of it allows, and no socket needs finding.
const (
	// CacheXattr reads as JSON client.FileCache: what the cache holds of
	// the file and why.
	CacheXattr = "user.hoard.cache"
	// WarmXattr, set (any value), fetches the whole file into the cache,
	// whatever its policy; the caller's interrupt (Ctrl-C) stops it
	// between batches of chunks, and what came stays.
	WarmXattr = "user.hoard.warm"
	// EvictXattr, set, drops what the cache holds of the file but its
	// writes not yet stored.
	EvictXattr = "user.hoard.evict"
	// DirtyXattr, on any path of the mount, reads as a JSON
	// DirtyReport: the caller's files with writes not yet stored (the
	// mount's owner's: every user's).
	DirtyXattr = "user.hoard.dirty"
	// FlushXattr, set on any path of the mount, stores the caller's
	// files' writes now (the mount's owner's: every user's); DirtyXattr
	// then lists those that could not be, and those the server refused
	// (kept in lost/).
	FlushXattr = "user.hoard.flush"
)

// DirtyReport is what DirtyXattr reads as: how many files have writes
// not yet stored, how many bytes, and the largest of them (at most
// maxDirtyListed, which keeps the value under the kernel's 64 KiB bound
// on an attribute), most first.
type DirtyReport struct {
	Files   int                `json:"files"`
	Bytes   int64              `json:"bytes"`
	Largest []client.DirtyFile `json:"largest"`
	// Refused are the files the last flush found the server refusing,
	// whose writes were kept in lost/ (at most maxDirtyListed).
	Refused []client.Refusal `json:"refused,omitempty"`
}

const maxDirtyListed = 200

// getCtl answers a read of one of the control attributes; ok is false
// for any other attribute.
func (h *hnode) getCtl(ctx context.Context, attr string) ([]byte, bool, syscall.Errno) {
	var x any
	switch attr {
	case CacheXattr:
		base, parent := h.parentNode()
		fc, err := h.m.as(ctx).CacheInfo(h.n, parent, base)
		if err != nil {
			return nil, true, errno(err)
		}
		x = fc
	case DirtyXattr:
		fs := h.m.as(ctx).DirtyFiles()
		r := DirtyReport{Files: len(fs), Largest: fs[:min(len(fs), maxDirtyListed)], Refused: h.m.lastRefused(h.m.as(ctx).User())}
		for _, f := range fs {
			r.Bytes += f.Dirty
		}
		x = r
	default:
		return nil, false, 0
	}
	b, err := json.Marshal(x)
	if err != nil {
		return nil, true, syscall.EIO
	}
	return b, true, 0
}

// setCtl does what a write of one of the control attributes asks; ok is
// false for any other attribute.
func (h *hnode) setCtl(ctx context.Context, attr string) (bool, syscall.Errno) {
	k := h.m.as(ctx)
	switch attr {
	case WarmXattr:
		err := k.Warm(ctx, h.n, "/"+h.Path(h.Root()), func(int64) {})
		switch {
		case errors.Is(err, client.ErrCacheFull):
			return true, syscall.ENOSPC
		case ctx.Err() != nil:
			return true, syscall.EINTR
		}
		return true, errno(err)
	case EvictXattr:
		return true, errno(k.Evict(h.n))
	case FlushXattr:
		h.m.setRefused(k.User(), k.FlushAll())
		return true, 0
	}
	return false, 0
}

// setRefused keeps what u's last flush found refused, for u's DirtyXattr.
func (m *Mount) setRefused(u user.User, r []client.Refusal) {
	m.refusedMu.Lock()
	defer m.refusedMu.Unlock()
	if m.refused == nil {
		m.refused = map[user.User][]client.Refusal{}
	}
	m.refused[u] = r[:min(len(r), maxDirtyListed)]
}

func (m *Mount) lastRefused(u user.User) []client.Refusal {
	m.refusedMu.Lock()
	defer m.refusedMu.Unlock()
	return m.refused[u]
}
