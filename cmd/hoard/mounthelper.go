package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/hoardfs/hoard/mount"
	"github.com/hoardfs/hoard/mounthelper"
)

// helperName is the name mount(8) runs for file system type fuse.hoard
// (/sbin/mount.fuse.hoard, a link to this binary): fstab entries and
// mount -t fuse.hoard.
const helperName = "mount.fuse.hoard"

// umountHelperName is the name umount(8) runs for a mount of type
// fuse.hoard (/sbin/umount.fuse.hoard, a link to this binary): umount,
// and systemd stopping a mount unit, then wait as hoard umount does
// until the daemon has stored the writes it held.
const umountHelperName = "umount.fuse.hoard"

func init() {
	switch filepath.Base(os.Args[0]) {
	case helperName:
		os.Exit(mountHelper(os.Args[1:], os.Stderr))
	case umountHelperName:
		os.Exit(umountHelper(os.Args[1:], os.Stderr))
	}
}

// mountHelper mounts as mount(8) asked, through hoard mount --daemon,
// and returns the exit status. It returns once the mount is up (mount -a
// and systemd's mount units count on that) or failed, its reason on w.
func mountHelper(argv []string, w io.Writer) int {
	call, err := mounthelper.Parse(argv)
	if err != nil {
		fmt.Fprintf(w, "hoard: %s: %v\n", helperName, err)
		return 2
	}
	flags := mountCmd().Flags()
	flags.String("log-level", "warn", "") // the root command's
	args, vfs, err := mounthelper.Args(call, flags, w)
	if err != nil {
		fmt.Fprintf(w, "hoard: %v\n", err)
		return 2
	}
	if call.Verbose {
		fmt.Fprintf(w, "hoard: running hoard %s\n", strings.Join(args, " "))
		if vfs != 0 {
			fmt.Fprintf(w, "hoard: then setting %s on %s\n", vfs, call.Dir)
		}
	}
	if call.Fake {
		return 0
	}
	if status := runSelf(w, call.Verbose, args...); status != 0 {
		return status
	}
	if err := vfs.Apply(call.Dir); err != nil {
		mount.Unmount(call.Dir)
		fmt.Fprintf(w, "hoard: %v; unmounted\n", err)
		return 1
	}
	return 0
}

// umountHelper unmounts as umount(8) asked,
//
//	umount.fuse.hoard MOUNTPOINT [-flnrv] [-N NS] [-t TYPE]
//
// through hoard umount, and returns the exit status once the daemon has
// stored what it held (or said why it could not). -f and -l need nothing
// more: hoard umount detaches a mount it cannot unmount at once.
func umountHelper(argv []string, w io.Writer) int {
	var dir string
	verbose := false
	for i := 0; i < len(argv); i++ {
		switch a := argv[i]; {
		case a == "-N":
			fmt.Fprintf(w, "hoard: %s: -N (another mount namespace) is not supported\n", umountHelperName)
			return 2
		case a == "-t":
			i++ // fuse.hoard
		case strings.HasPrefix(a, "-"):
			verbose = verbose || strings.Contains(a, "v")
		case dir == "":
			dir = a
		default:
			fmt.Fprintf(w, "hoard: %s: one mount point, not %q and %q\n", umountHelperName, dir, a)
			return 2
		}
	}
	if dir == "" {
		fmt.Fprintf(w, "hoard: %s: needs MOUNTPOINT\n", umountHelperName)
		return 2
	}
	return runSelf(w, verbose, "umount", dir)
}

// runSelf runs this binary with args, for a helper, and returns its exit
// status; its output goes to w when it fails, or with verbose.
func runSelf(w io.Writer, verbose bool, args ...string) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(w, "hoard: %v\n", err)
		return 1
	}
	if os.Getenv("HOME") == "" {
		// Run by systemd or at boot: the logins and default cache are
		// where they are for this user in a shell.
		if u, err := user.Current(); err == nil && u.HomeDir != "" {
			os.Setenv("HOME", u.HomeDir)
		}
	}
	out, err := exec.Command(self, args...).CombinedOutput()
	if err != nil {
		w.Write(out)
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			return ee.ExitCode()
		}
		fmt.Fprintf(w, "hoard: %v\n", err)
		return 1
	}
	if verbose {
		w.Write(out)
	}
	return 0
}

// umountHelperPaths are where umount(8) finds umountHelperName.
var umountHelperPaths = []string{"/sbin/" + umountHelperName, "/usr/sbin/" + umountHelperName}

// registerUmountHelper makes umount(8) of dir run umountHelperName, which
// waits for the daemon to store what it holds. umount(8) learns a FUSE
// mount's type from statfs, which says only "fuse", and so runs no
// helper of its own accord; a uhelper= option in libmount's utab, which
// mount --fake records (it makes no mount; --internal-only keeps it from
// running mount.fuse.hoard), makes it run ours. Only root may, and only
// where the helper is installed; it returns whether it did.
func registerUmountHelper(dir string) bool {
	if os.Geteuid() != 0 {
		return false
	}
	installed := false
	for _, p := range umountHelperPaths {
		if _, err := os.Stat(p); err == nil {
			installed = true
		}
	}
	if !installed {
		return false
	}
	out, err := exec.Command("mount", "--no-canonicalize", "--fake", "--internal-only", "-t", "fuse.hoard", "-o", "uhelper=fuse.hoard", "hoard", dir).CombinedOutput()
	if err != nil {
		slog.Debug("umount(8) will not wait for this mount: recording its helper failed", "err", err, "out", strings.TrimSpace(string(out)))
		return false
	}
	return true
}

// unregisterUmountHelper drops what registerUmountHelper recorded, once
// the mount is gone by other means than umount(8) (hoard umount, a
// signal): a stale entry would outlive it.
func unregisterUmountHelper(dir string) {
	exec.Command("umount", "--no-canonicalize", "--fake", "--internal-only", dir).Run()
}
