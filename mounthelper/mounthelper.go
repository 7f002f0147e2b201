// Package mounthelper reads what mount(8) hands a file system's helper
// (mount.fuse.hoard SOURCE MOUNTPOINT -o OPTIONS, from an fstab entry or
// mount -t fuse.hoard) and turns it into the flags of hoard mount, and
// the generic options to set on the mount point after.
package mounthelper

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
)

// A Call is how mount(8) runs a helper:
//
//	mount.fuse.hoard SOURCE MOUNTPOINT [-sfnv] [-N NS] [-o OPTS]... [-t TYPE]
type Call struct {
	Source, Dir string
	Opts        []string // each -o's options, in order
	Fake        bool     // -f: check, do not mount
	Sloppy      bool     // -s: skip options hoard does not know
	Verbose     bool     // -v
}

// Parse reads mount(8)'s arguments to a helper.
func Parse(argv []string) (Call, error) {
	var c Call
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
				c.Fake = true
			case 's':
				c.Sloppy = true
			case 'v':
				c.Verbose = true
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
					c.Opts = append(c.Opts, v)
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
	c.Source, c.Dir = pos[0], pos[1]
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

// VFSFlags are the generic options hoard honours as flags of the mount
// point, set by a bind remount once the mount is up.
type VFSFlags uintptr

var vfsOptions = map[string]struct{ set, clear VFSFlags }{
	"ro":         {syscall.MS_RDONLY, 0},
	"rw":         {0, syscall.MS_RDONLY},
	"noexec":     {syscall.MS_NOEXEC, 0},
	"exec":       {0, syscall.MS_NOEXEC},
	"noatime":    {syscall.MS_NOATIME, 0},
	"nodiratime": {syscall.MS_NODIRATIME, 0},
}

// Apply sets f on the mount at dir, keeping the flags it has.
func (f VFSFlags) Apply(dir string) error {
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

func (f VFSFlags) String() string {
	var names []string
	for _, n := range []string{"ro", "noexec", "noatime", "nodiratime"} {
		if f&vfsOptions[n].set != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

// Args translates call into the arguments of hoard mount --daemon:
// each option key=value to --key=value of flags (hoard mount's), a bare
// key to --key. It returns the generic options to set on the mount
// point after. Options hoard does not know fail the call, unless it is
// sloppy (then they are skipped, said on w if verbose).
func Args(call Call, flags *pflag.FlagSet, w io.Writer) ([]string, VFSFlags, error) {
	var vfs VFSFlags
	var keys []string // flags in the order given, each once: its last value wins
	vals := map[string]string{}
	for _, list := range call.Opts {
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
				if call.Sloppy {
					if call.Verbose {
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
	args := []string{"mount", "--daemon", "--server=" + call.Source}
	for _, k := range keys {
		args = append(args, vals[k])
	}
	return append(args, "--", call.Dir), vfs, nil
}
