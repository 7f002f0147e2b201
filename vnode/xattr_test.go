package vnode

import (
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/hoardfs/hoard/node"
)

// Extended attributes: setxattr's flags and errnos, ext4's bounds, the
// ctime they move, their removal with the file, and a move that carries
// them.
func TestXattrs(t *testing.T) {
	s := open(t, t.TempDir())
	v, err := s.CreateVolume("proj")
	if err != nil {
		t.Fatal(err)
	}
	f := mustCreate(t, s, v.Root, "f", node.TypeFile)
	wantErrno(t, second(s.GetXattr(f.FID, "user.a")), syscall.ENODATA)
	st, err := s.SetXattr(f.FID, "user.a", []byte("one"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Ctime.After(f.Ctime) || st.DataVersion != f.DataVersion {
		t.Fatalf("set: ctime %v (was %v), version %d (was %d)", st.Ctime, f.Ctime, st.DataVersion, f.DataVersion)
	}
	wantErrno(t, second(s.SetXattr(f.FID, "user.a", []byte("x"), node.XattrCreate)), syscall.EEXIST)
	wantErrno(t, second(s.SetXattr(f.FID, "user.b", []byte("x"), node.XattrReplace)), syscall.ENODATA)
	if _, err := s.SetXattr(f.FID, "user.a", []byte("two"), node.XattrReplace); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetXattr(f.FID, "user.b", nil, node.XattrCreate); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetXattr(f.FID, "user.a"); err != nil || string(got) != "two" {
		t.Fatalf("get: %q %v", got, err)
	}
	if got, err := s.GetXattr(f.FID, "user.b"); err != nil || len(got) != 0 {
		t.Fatalf("an empty value: %q %v", got, err)
	}
	if names, err := s.ListXattr(f.FID); err != nil || !slices.Equal(names, []string{"user.a", "user.b"}) {
		t.Fatalf("list: %v %v", names, err)
	}
	// Other namespaces are not stored; ext4's bounds.
	wantErrno(t, second(s.SetXattr(f.FID, "security.selinux", []byte("x"), 0)), syscall.ENOTSUP)
	wantErrno(t, second(s.SetXattr(f.FID, "trusted.x", []byte("x"), 0)), syscall.ENOTSUP)
	wantErrno(t, second(s.SetXattr(f.FID, "user.", []byte("x"), 0)), syscall.ENOTSUP)
	wantErrno(t, second(s.SetXattr(f.FID, "user.hoard.policy", []byte("x"), 0)), syscall.EPERM)
	wantErrno(t, second(s.SetXattr(f.FID, "user."+strings.Repeat("n", 251), []byte("x"), 0)), syscall.ERANGE)
	wantErrno(t, second(s.SetXattr(f.FID, "user.big", make([]byte, node.MaxXattrValue+1), 0)), syscall.E2BIG)
	if _, err := s.SetXattr(f.FID, "user.half", make([]byte, node.MaxXattrTotal/2), 0); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, second(s.SetXattr(f.FID, "user.more", make([]byte, node.MaxXattrTotal/2), 0)), syscall.ENOSPC)
	if _, err := s.RemoveXattr(f.FID, "user.half"); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, second(s.RemoveXattr(f.FID, "user.half")), syscall.ENODATA)

	// A move carries them.
	dst := open(t, t.TempDir())
	copyVolume(t, s, dst, v.ID, nil, 0, true)
	if got, err := dst.GetXattr(f.FID, "user.a"); err != nil || string(got) != "two" {
		t.Fatalf("after a move: %q %v", got, err)
	}

	// Removing the file removes them; a new file does not find them.
	if _, _, err := s.Remove(v.Root, "f", false, ""); err != nil {
		t.Fatal(err)
	}
	err = s.view(v.ID, func(v *vtx) error {
		v.eachXattr(f.FID.Vnode, func(name string, _ []byte) { t.Errorf("%s outlived its file", name) })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func second[T any](_ T, err error) error { return err }
