package pathfs

import (
	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/admin"
	"github.com/hoardfs/hoard/client/site"
	"github.com/hoardfs/hoard/node"
)

// Admin is the cell's administration (admin.Admin) with the changes that
// name a path in the cell: those resolve it here.
type Admin struct {
	admin.Admin
	fs *FS
}

// Admin is the cell's administration as fs's client's user.
func (fs *FS) Admin() Admin { return Admin{fs.c.Admin(), fs} }

// MountVolume makes name a mount point for volume: the volume's root
// appears there, and the tree spans volumes as in AFS. In a volume's
// read-only copy (a replicated root, as AFS's root.afs) it is made in
// the read-write volume, and reaches readers at its next release:
// CopyOf says so.
func (adm Admin) MountVolume(name, volume string) error {
	fs := adm.fs
	dir, base, err := fs.resolveParent(name)
	if err == nil {
		dir, _, err = fs.k.Writable(dir)
	}
	if err == nil {
		_, err = fs.k.Create(client.Make{Dir: dir, Name: base, Type: node.TypeMountPoint, Mode: 0o755, Who: creator(), Target: volume, Excl: true})
	}
	return errOf("mount", name, err)
}

// writable is path name where it can be changed (client.Nodes.Writable).
func (adm Admin) writable(name string) (*client.Node, string, error) {
	n, err := adm.fs.resolve(name, true)
	if err != nil {
		return nil, "", err
	}
	return adm.fs.k.Writable(n)
}

// CopyOf names the volume whose read-only copy holds path name, or ""
// when name is not in a copy: what the administration changes there
// (MountVolume, SetACL) is changed in that volume, and readers of the
// copy see it after its next release.
func (adm Admin) CopyOf(name string) (string, error) {
	_, rw, err := adm.writable(name)
	return rw, err
}

// GetACL reads the ACL governing name.
func (adm Admin) GetACL(name string) (admin.ACL, error) {
	n, err := adm.fs.resolve(name, true)
	if err != nil {
		return admin.ACL{}, site.ErrTold("get acl", name, err)
	}
	a, err := adm.ACLOf(n.FID())
	return a, site.ErrTold("get acl", name, err)
}

// SetACL gives who the rights r in directory name (none: removes who's
// entry), and returns the list as it is now. In a read-only copy, the
// read-write volume's is changed (CopyOf).
func (adm Admin) SetACL(name, who string, r access.Rights) (admin.ACL, error) {
	w, _, err := adm.writable(name)
	if err != nil {
		return admin.ACL{}, site.ErrTold("set acl", name, err)
	}
	a, err := adm.SetACLOf(w.FID(), who, r)
	return a, site.ErrTold("set acl", name, err)
}
