package node

import (
	"fmt"
	"strings"
	"syscall"
)

// Extended attributes: hoard stores those of the user namespace at the
// server with the file, but for ReservedXattrPrefix. The bounds are
// ext4's with large values (ea_inode): a name of at most 255 bytes, a
// value of at most 64 KiB, and at most 64 KiB of names and values a file.
const (
	XattrPrefix = "user."
	// ReservedXattrPrefix names the mount's control attributes (the
	// cache commands'), never stored.
	ReservedXattrPrefix = "user.hoard."
	MaxXattrName        = 255
	MaxXattrValue       = 64 << 10
	MaxXattrTotal       = 64 << 10
	// XattrCreate and XattrReplace are setxattr(2)'s flags.
	XattrCreate  = 1
	XattrReplace = 2
)

// CheckXattrName refuses a name hoard does not store: another namespace
// (ENOTSUP, as a file system without it says), one too long (ERANGE), a
// reserved one (EPERM).
func CheckXattrName(name string) error {
	switch {
	case !strings.HasPrefix(name, XattrPrefix) || len(name) == len(XattrPrefix):
		return fmt.Errorf("extended attribute %q: only user.* names are stored: %w", name, syscall.ENOTSUP)
	case len(name) > MaxXattrName:
		return fmt.Errorf("extended attribute name of %d bytes (at most %d): %w", len(name), MaxXattrName, syscall.ERANGE)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("extended attribute name with a NUL: %w", syscall.EINVAL)
	case strings.HasPrefix(name, ReservedXattrPrefix):
		return fmt.Errorf("extended attribute %q: %s names are the cache commands' (hoard cache): %w", name, ReservedXattrPrefix, syscall.EPERM)
	}
	return nil
}
