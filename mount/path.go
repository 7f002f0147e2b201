package mount

import "github.com/hoardfs/hoard/node"

// PathOf is a path of f under the mount point ("/a/b"), by the names the
// kernel last looked it up under; false if the kernel holds no inode of
// f. For display: a file renamed elsewhere keeps its old path until
// looked up again.
func (m *Mount) PathOf(f node.FID) (string, bool) {
	h := m.current(f)
	if h == nil {
		return "", false
	}
	return "/" + h.Path(h.Root()), true
}
