package pathfs

import (
	"context"
	"fmt"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/policy"
)

// CacheInfo is client.Nodes.CacheInfo of the file at path p: what
// `hoard cache` tells of a cache directory that no mount holds.
func (fs *FS) CacheInfo(p string) (client.FileCache, error) {
	n, err := fs.resolve(p, true)
	if err != nil {
		return client.FileCache{}, err
	}
	// The parent and name let name rules apply; the root has neither.
	parent, base, err := fs.resolveParent(p)
	if err != nil {
		parent, base = nil, ""
	}
	return fs.k.CacheInfo(n, parent, base)
}

// Warm is client.Nodes.Warm of the file at p.
func (fs *FS) Warm(ctx context.Context, p string, progress func(int64)) error {
	n, err := fs.resolve(p, true)
	if err != nil {
		return err
	}
	return fs.k.Warm(ctx, n, p, progress)
}

// Evict is client.Nodes.Evict of the file at p.
func (fs *FS) Evict(p string) error {
	n, err := fs.resolve(p, true)
	if err != nil {
		return err
	}
	return fs.k.Evict(n)
}

// Policy reports the policy that an open of name would use now, and
// why. For a directory it reports the override its files inherit.
func (fs *FS) Policy(name string) (policy.Decision, error) {
	n, err := fs.resolve(name, true)
	if err != nil {
		return policy.Decision{}, errOf("policy", name, err)
	}
	parent, base := fs.parentOf(name)
	return fs.k.Policy(n, parent, base)
}

// SetPolicy sets the override of name (cache, bypass, or auto to remove
// it); with recursive, of everything under a directory too. A file that
// turns to bypass first stores its local writes, then drops its chunks.
func (fs *FS) SetPolicy(name, mode string, recursive bool) error {
	if mode != policy.Cache && mode != policy.Bypass && mode != policy.Auto {
		return fmt.Errorf("policy %q: want cache, bypass or auto", mode)
	}
	n, err := fs.resolve(name, true)
	if err != nil {
		return errOf("policy", name, err)
	}
	return errOf("policy", name, fs.k.SetPolicy(n, mode, recursive))
}
