// Package pathfs is hoard's path API: a POSIX-like file API (the
// cacheDAFS thesis's API, in Go) over a client's cache, as the client's
// own user. Paths are resolved here, a name at a time, through the
// client's node-level view (client.Nodes), as a kernel resolves them for
// the mount: the client itself knows no paths.
package pathfs

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/site"
	"github.com/hoardfs/hoard/node"
)

// FS is the path API over one client. Its methods are safe for
// concurrent use.
type FS struct {
	c *client.Client
	// k and ids act as the client's own user: k crosses mount points,
	// ids (for Lstat and the like) does not.
	k   *client.Nodes
	ids *client.FIDs
}

// New is the path API over c.
func New(c *client.Client) *FS { return &FS{c: c, k: c.Nodes(), ids: c.FIDs()} }

// Dial dials a client (client.Dial) for the path API over it.
func Dial(opts client.Options) (*FS, error) {
	c, err := client.Dial(opts)
	if err != nil {
		return nil, err
	}
	return New(c), nil
}

// Client is the client fs is over.
func (fs *FS) Client() *client.Client { return fs.c }

// Close closes fs's client (client.Client.Close).
func (fs *FS) Close() error { return fs.c.Close() }

// maxLinks bounds symlink hops in one path resolution, as Linux's 40.
const maxLinks = 40

// splitPath cleans an absolute or root-relative path into names. ".."
// cannot climb above the root: the path is cleaned lexically first.
func splitPath(p string) ([]string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return nil, &explained{"path contains NUL", syscall.EINVAL}
	}
	p = path.Clean("/" + p)
	if p == "/" {
		return nil, nil
	}
	comps := strings.Split(p[1:], "/")
	for _, c := range comps {
		if err := node.CheckName(c); err != nil {
			return nil, err
		}
	}
	return comps, nil
}

// resolve walks p from the root. Mount points and relative symlinks are
// followed in the middle of a path, and at its end when follow is set.
func (fs *FS) resolve(p string, follow bool) (*client.Node, error) {
	comps, err := splitPath(p)
	if err != nil {
		return nil, err
	}
	links := 0
	root, err := fs.k.Root()
	if err != nil {
		return nil, err
	}
walk:
	cur := root
	for i, name := range comps {
		if err := fs.checkDir(cur); err != nil {
			return nil, err
		}
		last := i == len(comps)-1
		var child *client.Node
		if last && !follow {
			child, _, err = fs.ids.Lookup(cur, name)
		} else {
			child, _, err = fs.k.Lookup(cur, name)
		}
		if err != nil {
			return nil, err
		}
		if st := child.Status(); st.Type == node.TypeSymlink && (!last || follow) {
			if links++; links > maxLinks {
				return nil, syscall.ELOOP
			}
			if path.IsAbs(st.Target) {
				return nil, &explained{fmt.Sprintf("symlink %s points to %s, outside hoard", "/"+path.Join(comps[:i+1]...), st.Target), syscall.ENOENT}
			}
			rest := path.Join(append([]string{path.Join(comps[:i]...), st.Target}, comps[i+1:]...)...)
			if comps, err = splitPath(rest); err != nil {
				return nil, err
			}
			goto walk
		}
		cur = child
	}
	return cur, nil
}

// checkDir makes sure n is a directory to look names up in, as the
// server says now. resolve has crossed the mount points on the way.
func (fs *FS) checkDir(n *client.Node) error {
	st, err := fs.ids.Status(n)
	if err == nil && st.Type != node.TypeDir {
		err = syscall.ENOTDIR
	}
	return err
}

// resolveParent resolves all but the last name of p.
func (fs *FS) resolveParent(p string) (*client.Node, string, error) {
	comps, err := splitPath(p)
	if err != nil {
		return nil, "", err
	}
	if len(comps) == 0 {
		return nil, "", &explained{"the root has no parent", syscall.EINVAL}
	}
	dir, err := fs.resolve("/"+path.Join(comps[:len(comps)-1]...), true)
	if err != nil {
		return nil, "", err
	}
	if err := fs.checkDir(dir); err != nil {
		return nil, "", err
	}
	return dir, comps[len(comps)-1], nil
}

// parentOf resolves the directory name is in, best effort.
func (fs *FS) parentOf(name string) (*client.Node, string) {
	dir, base, err := fs.resolveParent(name)
	if err != nil {
		return nil, path.Base(name)
	}
	return dir, base
}

func unixMode(m os.FileMode) uint32 {
	mode := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// creator is who files made through the path API belong to: the calling
// process.
func creator() client.Creator {
	return client.Creator{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
}

// explained is an error of the path layer's own, whose text says why;
// errOf keeps it, where a server's reply is cut to its errno.
type explained struct {
	why   string
	errno syscall.Errno
}

func (e *explained) Error() string { return e.why + ": " + e.errno.Error() }
func (e *explained) Unwrap() error { return e.errno }

// errOf is err as an *os.PathError of op on name (site.ErrOf), saying
// why where the path layer itself refused.
func errOf(op, name string, err error) error {
	if x := (*explained)(nil); errors.As(err, &x) {
		return &os.PathError{Op: op, Path: name, Err: x}
	}
	return site.ErrOf(op, name, err)
}
