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
	"syscall"

	"github.com/spf13/pflag"

	"github.com/hoardfs/hoard/mount"
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

// helperCall is how mount(8) runs a helper:
//
//	mount.fuse.hoard SOURCE MOUNTPOINT [-sfnv] [-N NS] [-o OPTS]... [-t TYPE]
type helperCall struct {
	source, dir string
	opts        []string // each -o's options, in order
	fake        bool     // -f: check, do not mount
	sloppy      bool     // -s: skip options hoard does not know
	verbose     bool     // -v
}

// mountHelper mounts as mount(8) asked, through hoard mount --daemon,
// and returns the exit status. It returns once the mount is up (mount -a
// and systemd's mount units count on that) or failed, its reason on w.
func mountHelper(argv []string, w io.Writer) int {
	call, err := parseHelperCall(argv)
	if err != nil {
		fmt.Fprintf(w, "hoard: %s: %v\n", helperName, err)
		return 2
	}
	flags := mountCmd().Flags()
	flags.String("log-level", "warn", "") // the root command's
	args, vfs, err := helperArgs(call, flags, w)
	if err != nil {
		fmt.Fprintf(w, "hoard: %v\n", err)
		return 2
	}
	if call.verbose {
		fmt.Fprintf(w, "hoard: running hoard %s\n", strings.Join(args, " "))
		if vfs != 0 {
			fmt.Fprintf(w, "hoard: then setting %s on %s\n", vfs, call.dir)
		}
	}
	if call.fake {
		return 0
	}
	if status := runSelf(w, call.verbose, args...); status != 0 {
		return status
	}
	if err := vfs.apply(call.dir); err != nil {
		mount.Unmount(call.dir)
		fmt.Fprintf(w, "hoard: %v; unmounted\n", err)
		return 1
	}
	return 0
}

// parseHelperCall reads mount(8)'s arguments to a helper.
func parseHelperCall(argv []string) (helperCall, error) {
	var c helperCall
	var pos []string
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		for j := 1; j < len(a); j++ {
			switch a[j] {
			case 'f':
				c.fake = true
			case 's':
				c.sloppy = true
			case 'v':
				c.verbose = true
			case 'n': // no mtab: there is none to write
			case 'o', 't', 'N':
				v := a[j+1:]
				if v == "" {
					if i+1 == len(argv) {
						return c, fmt.Errorf("-%c needs a value", a[j])
					}
					i++
					v = argv[i]
				}
				switch a[j] {
				case 'o':
					c.opts = append(c.opts, v)
				case 'N':
					return c, fmt.Errorf("-N %s: mounting in another namespace is not supported", v)
				}
				j = len(a)
			default:
				return c, fmt.Errorf("unknown flag -%c (want SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS])", a[j])
			}
		}
	}
	if len(pos) != 2 {
		return c, errors.New("needs SOURCE (the server, HOST:PORT) and MOUNTPOINT")
	}
	c.source, c.dir = pos[0], pos[1]
	return c, nil
}

// splitOptions splits a mount option list at its commas, but not at
// those in double quotes (opt="a,b"), which it drops, as libmount does.
func splitOptions(s string) []string {
	var opts []string
	var b strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
		case r == ',' && !quoted:
			opts = append(opts, b.String())
			b.Reset()
		default:
			b.WriteRune(r)
		}
	}
	return append(opts, b.String())
}

// ignoredOptions are generic options that fstab and mount(8) use or pass
// on, none of hoard's concern: a hoard mount is always nosuid and nodev.
var ignoredOptions = map[string]bool{
	"defaults": true, "auto": true, "noauto": true, "user": true, "nouser": true, "users": true,
	"owner": true, "group": true, "nofail": true, "_netdev": true, "suid": true, "nosuid": true,
	"dev": true, "nodev": true, "async": true, "relatime": true, "atime": true, "diratime": true,
	"loud": true, "silent": true, "lazytime": true, "nolazytime": true,
}

// vfsFlags are the generic options hoard honours as flags of the mount
// point, set by a bind remount once the mount is up.
type vfsFlags uintptr

var vfsOptions = map[string]struct{ set, clear vfsFlags }{
	"ro":         {syscall.MS_RDONLY, 0},
	"rw":         {0, syscall.MS_RDONLY},
	"noexec":     {syscall.MS_NOEXEC, 0},
	"exec":       {0, syscall.MS_NOEXEC},
	"noatime":    {syscall.MS_NOATIME, 0},
	"nodiratime": {syscall.MS_NODIRATIME, 0},
}

// apply sets f on the mount at dir, keeping the flags it has.
func (f vfsFlags) apply(dir string) error {
	if f == 0 {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("mount options: %v", err)
	}
	// The ST_ flags of statfs have the MS_ flags' values.
	keep := uintptr(st.Flags) & (syscall.MS_NOSUID | syscall.MS_NODEV)
	if err := syscall.Mount("none", dir, "", syscall.MS_REMOUNT|syscall.MS_BIND|keep|uintptr(f), ""); err != nil {
		return fmt.Errorf("mount options %s: setting them on %s: %v", f, dir, err)
	}
	return nil
}

func (f vfsFlags) String() string {
	var names []string
	for _, n := range []string{"ro", "noexec", "noatime", "nodiratime"} {
		if f&vfsOptions[n].set != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

// helperArgs translates call into the arguments of hoard mount --daemon:
// each option key=value to --key=value of flags (hoard mount's), a bare
// key to --key. It returns the generic options to set on the mount
// point after. Options hoard does not know fail the call, unless it is
// sloppy (then they are skipped, said on w if verbose).
func helperArgs(call helperCall, flags *pflag.FlagSet, w io.Writer) ([]string, vfsFlags, error) {
	var vfs vfsFlags
	var keys []string // flags in the order given, each once: its last value wins
	vals := map[string]string{}
	for _, list := range call.opts {
		for _, o := range splitOptions(list) {
			key, val, hasVal := strings.Cut(o, "=")
			if m, ok := vfsOptions[o]; ok {
				vfs = vfs&^m.clear | m.set
				continue
			}
			if o == "" || ignoredOptions[o] || strings.HasPrefix(o, "x-") || key == "comment" || key == "user" {
				continue
			}
			f := flags.Lookup(key)
			switch {
			case key == "server":
				return nil, 0, fmt.Errorf("mount option %q: the server is the mount's source (fstab's first field)", o)
			case key == "daemon":
				return nil, 0, fmt.Errorf("mount option %q: a mount by mount(8) is always a daemon", o)
			case f == nil || f.Hidden:
				if call.sloppy {
					if call.verbose {
						fmt.Fprintf(w, "hoard: mount option %q: unknown, skipped (-s)\n", key)
					}
					continue
				}
				return nil, 0, fmt.Errorf("mount option %q: unknown (hoard mount --help lists them)", key)
			case !hasVal && f.Value.Type() != "bool":
				return nil, 0, fmt.Errorf("mount option %q: needs a value (%s=...)", key, key)
			}
			arg := "--" + key
			if hasVal {
				arg += "=" + val
			}
			if _, ok := vals[key]; ok {
				for i, k := range keys {
					if k == key {
						keys = append(keys[:i], keys[i+1:]...)
						break
					}
				}
			}
			keys = append(keys, key)
			vals[key] = arg
		}
	}
	args := []string{"mount", "--daemon", "--server=" + call.source}
	for _, k := range keys {
		args = append(args, vals[k])
	}
	return append(args, "--", call.dir), vfs, nil
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
