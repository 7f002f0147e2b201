package node

import (
	"fmt"
	"strings"
	"syscall"
)

// NameError says why a name was refused; Unwrap gives the errno.
type NameError struct {
	Name  string
	Errno syscall.Errno
	Why   string
}

func (e *NameError) Error() string { return fmt.Sprintf("bad name %q: %s", e.Name, e.Why) }
func (e *NameError) Unwrap() error { return e.Errno }

// CheckName accepts a single directory-entry name. The server calls it on
// every name it receives; a client calls it only to fail early.
func CheckName(name string) error {
	switch {
	case name == "":
		return &NameError{name, syscall.EINVAL, "empty"}
	case name == "." || name == "..":
		return &NameError{name, syscall.EINVAL, "'.' and '..' are not names"}
	case len(name) > MaxName:
		return &NameError{name[:32] + "...", syscall.ENAMETOOLONG, fmt.Sprintf("%d bytes, limit %d", len(name), MaxName)}
	case strings.IndexByte(name, '/') >= 0:
		return &NameError{name, syscall.EINVAL, "contains '/'"}
	case strings.IndexByte(name, 0) >= 0:
		return &NameError{name, syscall.EINVAL, "contains NUL"}
	}
	return nil
}

// CheckTarget accepts a symlink target: any bytes but NUL, not empty, bounded.
func CheckTarget(target string) error {
	switch {
	case target == "":
		return &NameError{target, syscall.EINVAL, "empty link target"}
	case len(target) > MaxTarget:
		return &NameError{target[:32] + "...", syscall.ENAMETOOLONG, fmt.Sprintf("link target of %d bytes, limit %d", len(target), MaxTarget)}
	case strings.IndexByte(target, 0) >= 0:
		return &NameError{target, syscall.EINVAL, "link target contains NUL"}
	}
	return nil
}

// CheckVolumeName accepts a volume name: 1-64 bytes of [A-Za-z0-9._+-],
// not starting with '.'. A leading "__" marks a bypass volume (as in
// Improving AFS Performance via Selective Caching).
// ReadOnlySuffix ends the name of a volume's read-only copy, as in AFS:
// a mount point naming NAME.readonly reaches the copy only.
const ReadOnlySuffix = ".readonly"

// ReadWritePrefix begins a mount point's target that reaches the
// read-write volume even when a read-only copy is released (AFS's '%').
const ReadWritePrefix = "%"

// MountTarget splits a mount point's target into the volume it names and
// which copy it asks for: the read-write one (%NAME), the read-only one
// (NAME.readonly), or either (NAME: the read-only copy once released).
func MountTarget(t string) (name string, rw, ro bool) {
	switch {
	case strings.HasPrefix(t, ReadWritePrefix):
		return t[len(ReadWritePrefix):], true, false
	case strings.HasSuffix(t, ReadOnlySuffix):
		return t[:len(t)-len(ReadOnlySuffix)], false, true
	}
	return t, false, false
}

func CheckVolumeName(name string) error {
	if name == "" || len(name) > 64 {
		return &NameError{name, syscall.EINVAL, "volume names are 1-64 bytes"}
	}
	if strings.HasSuffix(name, ReadOnlySuffix) {
		return &NameError{name, syscall.EINVAL, "volume names ending in " + ReadOnlySuffix + " name read-only copies"}
	}
	if name[0] == '.' {
		return &NameError{name, syscall.EINVAL, "volume names may not start with '.'"}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '+'
		if !ok {
			return &NameError{name, syscall.EINVAL, "volume names use only letters, digits and . _ - +"}
		}
	}
	return nil
}
