package main

import (
	"context"
	"errors"
	"fmt"
	"path"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/chunkindex"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/mount"
	"github.com/hoardfs/hoard/node"
)

// cacheAt is where ls, warmup and evict act: a mount, through the control
// attributes of local paths (mountCache), or, with --server, a cache
// directory that no mount holds, through a library client of the cell on
// paths in the cell (cellCache): a cache warmed before its mount starts,
// as CernVM-FS's preload fills one. Errors name the path and say what
// went wrong in words.
type cacheAt interface {
	// files is the regular files the paths name: each path's own, a
	// directory's, or with recursive those in its whole tree.
	files(paths []string, recursive bool) ([]string, []error)
	info(path string) (client.FileCache, error)
	warm(ctx context.Context, path string) error
	evict(ctx context.Context, path string) error
	// cacheIt sets the file's own policy to cache.
	cacheIt(ctx context.Context, path string) error
	// waits: warm returns soon once ctx is done, so a warmup Ctrl-C
	// stops waits for it. A mount's warm ends only with the process,
	// whose exit interrupts its request.
	waits() bool
}

type mountCache struct{}

func (mountCache) files(paths []string, recursive bool) ([]string, []error) {
	return filesUnder(paths, recursive)
}

func (mountCache) info(p string) (client.FileCache, error) { return fileCache(p) }

func (mountCache) warm(ctx context.Context, p string) error {
	return ctlDone(p, setCtl(ctx, p, mount.WarmXattr, nil))
}

func (mountCache) evict(ctx context.Context, p string) error {
	return ctlDone(p, setCtl(ctx, p, mount.EvictXattr, nil))
}

func (mountCache) cacheIt(ctx context.Context, p string) error {
	return ctlDone(p, setCtl(ctx, p, mount.PolicyXattr, []byte(policy.Cache)))
}

func (mountCache) waits() bool { return false }

// ctlDone is nil, or err said for path.
func ctlDone(p string, err error) error {
	if err != nil {
		return ctlErr(p, err)
	}
	return nil
}

type cellCache struct{ c *pathfs.FS }

// withCacheAt runs fn with where the command's files are: the mount
// holding them, or with --server the cell, through a client on the cache
// directory --cache (the size the cache was made with, unless
// --cache-size says otherwise).
func withCacheAt(cmd *cobra.Command, cf *clientFlags, fn func(cacheAt) error) error {
	if !cmd.Flags().Changed("server") {
		return fn(mountCache{})
	}
	if cf.cache == "" {
		return usagef("--server: name the cache directory to act on with --cache (a memory cache ends with the command)")
	}
	if !cmd.Flags().Changed("cache-size") {
		if s, err := cache.ReadStats(cf.cache); err == nil && s.Limit > 0 {
			cf.cacheSize = fmt.Sprint(s.Limit)
		}
	}
	cf.cacheGiven = true // a cache a mount holds is an error, not a memory cache
	cf.noDeleg = true    // a short command must not hold writes back
	c, err := cf.dial()
	if err != nil {
		if errors.Is(err, chunkindex.ErrInUse) {
			return fmt.Errorf("%v: a mount holds it; name the files by their paths on the mount, without --server", err)
		}
		return err
	}
	return errors.Join(fn(cellCache{c}), c.Close())
}

// cellErr says what a failed call on path p in the cell means to a person.
func cellErr(p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, client.ErrCacheFull):
		return ctlErr(p, syscall.ENOSPC)
	case errors.Is(err, context.Canceled):
		return ctlErr(p, syscall.EINTR)
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("%s: no such file in the cell", p)
	}
	return fmt.Errorf("%s: %v", p, err)
}

func (cc cellCache) files(paths []string, recursive bool) (files []string, failed []error) {
	var walk func(dir string, deep bool)
	walk = func(dir string, deep bool) {
		ents, err := cc.c.ReadDir(dir)
		if err != nil {
			failed = append(failed, cellErr(dir, err))
			return
		}
		for _, e := range ents {
			p := path.Join(dir, e.Name)
			switch {
			case e.Type == node.TypeFile:
				files = append(files, p)
			case deep && (e.Type == node.TypeDir || e.Type == node.TypeMountPoint):
				walk(p, true)
			}
		}
	}
	for _, p := range paths {
		st, err := cc.c.Stat(p)
		switch {
		case err != nil:
			failed = append(failed, cellErr(p, err))
		case st.Type == node.TypeFile:
			files = append(files, p)
		case st.Type == node.TypeDir || st.Type == node.TypeMountPoint:
			walk(p, recursive)
		}
	}
	return files, failed
}

func (cc cellCache) info(p string) (client.FileCache, error) {
	fc, err := cc.c.CacheInfo(p)
	return fc, cellErr(p, err)
}

func (cc cellCache) warm(ctx context.Context, p string) error {
	return cellErr(p, cc.c.Warm(ctx, p, func(int64) {}))
}

func (cc cellCache) evict(_ context.Context, p string) error {
	return cellErr(p, cc.c.Evict(p))
}

func (cc cellCache) cacheIt(_ context.Context, p string) error {
	return cellErr(p, cc.c.SetPolicy(p, policy.Cache, false))
}

func (cellCache) waits() bool { return true }
