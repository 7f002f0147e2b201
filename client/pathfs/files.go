package pathfs

import (
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/client"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Open opens a file as os.OpenFile does: O_CREATE, O_EXCL, O_TRUNC and
// O_APPEND are honoured. A file is fetched lazily, chunk by chunk, as it
// is read. A directory is not a file: opening one fails with EISDIR.
func (fs *FS) Open(name string, flag int, perm os.FileMode) (*client.File, error) {
	if flag&os.O_CREATE != 0 {
		f, err := fs.create(name, flag, perm)
		if client.Errno(err) != syscall.EEXIST || flag&os.O_EXCL != 0 {
			return f, errOf("open", name, err)
		}
		// Exists as something else: a symlink to follow, or a directory.
	}
	n, err := fs.resolve(name, true)
	if err != nil {
		return nil, errOf("open", name, err)
	}
	parent, base := fs.parentOf(name)
	return fs.k.Open(n, parent, base, name, flag)
}

// create makes name a regular file and opens it, or opens the one there
// without O_EXCL (client.Nodes.CreateOpen).
func (fs *FS) create(name string, flag int, perm os.FileMode) (*client.File, error) {
	dir, base, err := fs.resolveParent(name)
	if err != nil {
		return nil, err
	}
	_, f, err := fs.k.CreateOpen(client.Make{Dir: dir, Name: base, Mode: unixMode(perm), Who: creator(), Excl: flag&os.O_EXCL != 0}, name, flag)
	return f, err
}

// Create creates or truncates a file for reading and writing.
func (fs *FS) Create(name string) (*client.File, error) {
	return fs.Open(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// Stat returns the status of name, following symlinks and mount points.
func (fs *FS) Stat(name string) (node.Status, error) { return fs.stat("stat", name, true) }

// Lstat is Stat without following a final symlink or mount point.
func (fs *FS) Lstat(name string) (node.Status, error) { return fs.stat("lstat", name, false) }

func (fs *FS) stat(op, name string, follow bool) (node.Status, error) {
	n, err := fs.resolve(name, follow)
	if err != nil {
		return node.Status{}, errOf(op, name, err)
	}
	st, err := fs.ids.Status(n)
	return st, errOf(op, name, err)
}

// ReadDir lists a directory in the server's stable order; mount points
// are listed as such.
func (fs *FS) ReadDir(name string) ([]client.DirEntry, error) {
	n, err := fs.resolve(name, true)
	if err == nil {
		err = fs.checkDir(n)
	}
	if err != nil {
		return nil, errOf("readdir", name, err)
	}
	ents, err := fs.k.List(n)
	return ents, errOf("readdir", name, err)
}

// Mkdir makes a directory.
func (fs *FS) Mkdir(name string, perm os.FileMode) error {
	return errOf("mkdir", name, fs.makeNew(name, client.Make{Type: node.TypeDir, Mode: unixMode(perm)}))
}

// Symlink makes link a symbolic link to target.
func (fs *FS) Symlink(target, link string) error {
	return errOf("symlink", link, fs.makeNew(link, client.Make{Type: node.TypeSymlink, Mode: 0o777, Target: target}))
}

// makeNew makes m, named name, in name's directory: it must not exist.
func (fs *FS) makeNew(name string, m client.Make) error {
	dir, base, err := fs.resolveParent(name)
	if err != nil {
		return err
	}
	m.Dir, m.Name, m.Who, m.Excl = dir, base, creator(), true
	_, err = fs.k.Create(m)
	return err
}

// Readlink returns a symlink's target.
func (fs *FS) Readlink(name string) (string, error) {
	n, err := fs.resolve(name, false)
	if err != nil {
		return "", errOf("readlink", name, err)
	}
	st, err := fs.ids.Status(n)
	if err == nil && st.Type != node.TypeSymlink {
		err = syscall.EINVAL
	}
	return st.Target, errOf("readlink", name, err)
}

// Link makes newname a hard link to oldname.
func (fs *FS) Link(oldname, newname string) error {
	return errOf("link", newname, fs.link(oldname, newname))
}

func (fs *FS) link(oldname, newname string) error {
	target, err := fs.resolve(oldname, false)
	if err != nil {
		return err
	}
	dir, base, err := fs.resolveParent(newname)
	if err != nil {
		return err
	}
	_, err = fs.k.Link(dir, base, target)
	return err
}

// Remove removes a file, symlink, mount point or empty directory.
func (fs *FS) Remove(name string) error {
	return errOf("remove", name, fs.remove(name))
}

func (fs *FS) remove(name string) error {
	dir, base, err := fs.resolveParent(name)
	if err != nil {
		return err
	}
	err = fs.k.Remove(dir, base, false)
	if pb.Errno(err) == syscall.EISDIR || errors.Is(err, syscall.EISDIR) {
		err = fs.k.Remove(dir, base, true)
	}
	return err
}

// Rename renames oldname to newname, replacing newname if it exists (and
// is not a non-empty directory), atomically.
func (fs *FS) Rename(oldname, newname string) error {
	return errOf("rename", oldname, fs.rename(oldname, newname))
}

func (fs *FS) rename(oldname, newname string) error {
	sdir, sbase, err := fs.resolveParent(oldname)
	if err != nil {
		return err
	}
	ddir, dbase, err := fs.resolveParent(newname)
	if err != nil {
		return err
	}
	_, err = fs.k.Rename(sdir, sbase, ddir, dbase)
	return err
}

// setAttr changes a of name (op: for the error).
func (fs *FS) setAttr(op, name string, a client.Attr) error {
	n, err := fs.resolve(name, true)
	if err == nil {
		_, err = fs.k.SetAttr(n, a)
	}
	return errOf(op, name, err)
}

// Chmod changes the permission bits.
func (fs *FS) Chmod(name string, mode os.FileMode) error {
	m := unixMode(mode)
	return fs.setAttr("chmod", name, client.Attr{Mode: &m})
}

// Chown changes the owner and group; -1 leaves one as it is.
func (fs *FS) Chown(name string, uid, gid int) error {
	var a client.Attr
	if uid >= 0 {
		u := uint32(uid)
		a.UID = &u
	}
	if gid >= 0 {
		g := uint32(gid)
		a.GID = &g
	}
	if a.UID == nil && a.GID == nil {
		return nil
	}
	return fs.setAttr("chown", name, a)
}

// Chtimes changes the access and modification times.
func (fs *FS) Chtimes(name string, atime, mtime time.Time) error {
	return fs.setAttr("chtimes", name, client.Attr{Atime: &atime, Mtime: &mtime})
}

// Truncate changes a file's size: in the cache under a write delegation,
// otherwise at the server at once (after storing any local writes to it).
func (fs *FS) Truncate(name string, size int64) error {
	if size < 0 {
		return errOf("truncate", name, syscall.EINVAL)
	}
	n, err := fs.resolve(name, true)
	if err == nil {
		sz := uint64(size)
		var here bool
		if here, err = fs.k.TruncateHere(n, sz); err == nil && !here {
			_, err = fs.k.SetAttr(n, client.Attr{Size: &sz})
		}
	}
	return errOf("truncate", name, err)
}

// StatFS reports the root volume's space: its quota if it has one, or
// its server's.
func (fs *FS) StatFS() (client.FSStat, error) {
	root, err := fs.k.Root()
	if err != nil {
		return client.FSStat{}, errOf("statfs", "/", err)
	}
	return fs.k.StatFS(root)
}
