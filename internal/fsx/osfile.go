package fsx

import (
	"fmt"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// OSFile is a File on a real descriptor: every call is one system call.
type OSFile struct{ *os.File }

// OpenOS opens path read-write, creating it, as an OSFile.
func OpenOS(path string) (File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return OSFile{f}, nil
}

// Size is fstat's.
func (f OSFile) Size() (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	return st.Size, nil
}

// Allocate is posix_fallocate (mode 0).
func (f OSFile) Allocate(off, n int64) error {
	return unix.Fallocate(int(f.Fd()), 0, off, n)
}

// MapRead reads through a shared read-only mapping of the file. A page the
// file system fails to read (or one past the real end) is SIGBUS: an error
// here, not the checker's death.
func (f OSFile) MapRead(p []byte, off int64) (err error) {
	page := int64(os.Getpagesize())
	base := off / page * page
	m, err := unix.Mmap(int(f.Fd()), base, int(off-base)+len(p), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	defer unix.Munmap(m)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mapped read of %d+%d faulted (SIGBUS): %v", off, len(p), r)
		}
	}()
	copy(p, m[off-base:])
	return nil
}
