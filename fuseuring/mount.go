package fuseuring

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Mount mounts fs at dir (as root: it mounts directly) on a connection
// that asks for io_uring at INIT, and serves it. When the rings start,
// the Transport also reads what the kernel still sends on /dev/fuse
// (FORGET, and INTERRUPT, which must reach the protocol server that
// holds the request in flight), and Transport.Wait waits for the end of
// both. When they do not, the Transport is nil, err says why, and
// go-fuse's Server serves /dev/fuse alone; wait on it. The Server is nil
// only when the mount itself failed. Unmount with Unmount, not the
// Server's: it does not know the mount point.
func Mount(dir string, fs fuse.RawFileSystem, opts *fuse.MountOptions, cfg Config) (*fuse.Server, *Transport, error) {
	o := *opts
	o.DirectMount, o.DirectMountStrict = false, false
	o.ExtraCapabilities |= fuse.CAP_OVER_IO_URING
	fd, err := mountFD(dir, &o)
	if err != nil {
		return nil, nil, err
	}
	// go-fuse serves a connection mounted elsewhere by its magic path. It
	// answers INIT before it returns; its Server is what the file system
	// sends notifications through.
	server, err := fuse.NewServer(fs, fmt.Sprintf("/dev/fd/%d", fd), &o)
	if err != nil {
		syscall.Unmount(dir, syscall.MNT_DETACH)
		return nil, nil, err
	}
	t, err := Start(fd, server.KernelSettings(), fs, &o, cfg)
	if err != nil {
		go server.Serve()
		noPoll(dir)
		return server, nil, err
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.serveDev(fd)
		// The connection is gone: the Server's loop finds it so at once,
		// and closes the descriptor it owns.
		server.Serve()
	}()
	noPoll(dir)
	return server, t, nil
}

// noPoll has the kernel learn that the file system does not poll, as
// go-fuse's Server does at WaitMount for a mount point it knows (not for
// the /dev/fd path it is given here): a poll of go-fuse's own hidden file
// is answered ENOSYS by its protocol server, and the kernel asks no more.
// Otherwise the Go runtime's epoll registration of a file that the
// daemon's own process opens on the mount sends a POLL request, from a
// thread the garbage collector waits for, which the daemon's stopped
// threads cannot answer.
func noPoll(dir string) {
	fd, err := syscall.Open(dir+"/.go-fuse-epoll-hack", syscall.O_RDONLY, 0)
	if err != nil {
		return // nobody here can open it, nor any file of the mount
	}
	unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	syscall.Close(fd)
}

// mountFD opens /dev/fuse and mounts it at dir with opts, as fusermount
// would, and returns the descriptor.
func mountFD(dir string, opts *fuse.MountOptions) (int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return -1, err
	}
	fd, err := syscall.Open("/dev/fuse", os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("/dev/fuse: %w", err)
	}
	data := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", st.Mode&syscall.S_IFMT),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", max(opts.MaxWrite, 128<<10)),
	}
	flags := uintptr(syscall.MS_NOSUID | syscall.MS_NODEV)
	for _, opt := range opts.Options {
		switch opt {
		case "nodev":
			flags |= syscall.MS_NODEV
		case "dev":
			flags &^= syscall.MS_NODEV
		case "nosuid":
			flags |= syscall.MS_NOSUID
		case "suid":
			flags &^= syscall.MS_NOSUID
		case "noexec":
			flags |= syscall.MS_NOEXEC
		case "exec":
		default:
			data = append(data, opt)
		}
	}
	if opts.AllowOther {
		data = append(data, "allow_other")
	}
	source := opts.FsName
	if source == "" {
		source = opts.Name
	}
	if err := syscall.Mount(source, dir, "fuse."+opts.Name, flags, strings.Join(data, ",")); err != nil {
		syscall.Close(fd)
		return -1, fmt.Errorf("mount %s: %w", dir, err)
	}
	return fd, nil
}

// Unmount unmounts dir, retrying while the kernel still counts files open
// there, as go-fuse's Server.Unmount does.
func Unmount(dir string) error {
	var err error
	delay := time.Duration(0)
	for range 5 {
		if err = syscall.Unmount(dir, 0); err == nil {
			return nil
		}
		delay = 2*delay + 5*time.Millisecond
		time.Sleep(delay)
	}
	return fmt.Errorf("umount %s: %w", dir, err)
}
