package main

import (
	"fmt"
	"github.com/hoardfs/hoard/client/admin"
	"math"
	"os"
	"path"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/mount"
)

func volCmd() *cobra.Command {
	var on string
	cmd := &cobra.Command{Use: "vol", Short: "manage the cell's volumes"}
	cmd.AddCommand(
		withAdmin("create NAME [--on SERVER]", "create a volume, on the server of the cell with the most free space unless told", cobra.ExactArgs(1),
			func(f *pflag.FlagSet) {
				f.StringVar(&on, "on", "", "the server to place it on (hoard server list names them)")
			},
			func(c *pathfs.FS, args []string) error {
				v, err := c.Admin().CreateVolumeOn(args[0], on)
				if err != nil {
					return err
				}
				fmt.Printf("volume %s created, id %d; attach it with: hoard vol mount %s PATH\n", v.Name, v.ID, v.Name)
				return nil
			}),
		withAdmin("list", "list the cell's volumes: where each lives, its quota and use", cobra.NoArgs, nil, func(c *pathfs.FS, args []string) error {
			vs, err := c.Admin().VolumeInfos()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSERVER\tQUOTA\tUSED\tFILES\tREAD-ONLY\tCREATED")
			var unknown []string // why sizes are missing, each once
			for _, v := range vs {
				quota, used, files := quotaString(v.Quota), humanSize(v.Used), fmt.Sprint(v.Files)
				if v.Unknown != nil {
					quota, used, files = "?", "?", "?"
					if !slices.Contains(unknown, v.Unknown.Error()) {
						unknown = append(unknown, v.Unknown.Error())
					}
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Volume.ID, v.Volume.Name, orDash(v.RW.Name), quota, used, files,
					siteNames(v.RO), v.Volume.Created.Format(time.RFC3339))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, why := range unknown {
				fmt.Fprintf(os.Stderr, "hoard: sizes shown as ?: %s\n", why)
			}
			return nil
		}),
		withAdmin("examine NAME", "show where a volume lives, its sites, quota, use and files", cobra.ExactArgs(1), nil, func(c *pathfs.FS, args []string) error {
			v, err := c.Admin().Examine(args[0])
			if err != nil {
				return err
			}
			fmt.Printf("volume %s, id %d, created %s\n", v.Volume.Name, v.Volume.ID, v.Volume.Created.Format(time.RFC3339))
			fmt.Printf("  read-write at %s (%s)\n", orDash(v.RW.Name), orDash(v.RW.Addr))
			fmt.Printf("  read-only at  %s", siteNames(v.RO))
			if v.Released > 0 {
				fmt.Printf(" (copy id %d, release %d)", v.ROID, v.Released)
			}
			fmt.Println()
			if len(v.Pending) > 0 {
				fmt.Printf("  added since   %s (the next release reaches them)\n", siteNames(v.Pending))
			}
			fmt.Printf("  quota %s, used %s, %d files\n", quotaString(v.Quota), humanSize(v.Used), v.Files)
			return nil
		}),
		withAdmin("remove NAME", "delete a volume and everything in it (admins)", cobra.ExactArgs(1), nil, func(c *pathfs.FS, args []string) error {
			if err := c.Admin().RemoveVolume(args[0]); err != nil {
				return err
			}
			fmt.Printf("volume %s removed\n", args[0])
			return nil
		}),
		volSetCmd(),
		volMoveCmd(),
		withAdmin("addsite NAME SERVER", "make SERVER a read-only site of a volume; the next release reaches it (admins)", cobra.ExactArgs(2), nil, func(c *pathfs.FS, args []string) error {
			if err := c.Admin().AddSite(args[0], args[1]); err != nil {
				return err
			}
			fmt.Printf("%s is a read-only site of volume %s; publish to it with: hoard vol release %s\n", args[1], args[0], args[0])
			return nil
		}),
		withAdmin("remsite NAME SERVER", "make SERVER no longer a read-only site of a volume, and drop its copy (admins)", cobra.ExactArgs(2), nil, func(c *pathfs.FS, args []string) error {
			if err := c.Admin().RemoveSite(args[0], args[1]); err != nil {
				return err
			}
			fmt.Printf("%s is no longer a read-only site of volume %s\n", args[1], args[0])
			return nil
		}),
		withAdmin("release NAME", "publish a volume as it is now to its read-only sites (admins)", cobra.ExactArgs(1), nil, func(c *pathfs.FS, args []string) error {
			r, err := c.Admin().Release(args[0])
			if err != nil {
				return err
			}
			fmt.Printf("volume %s released to %s: %s sent, changes held back %v, %v in all\n", args[0], strings.Join(r.Sites, ", "),
				humanSize(uint64(r.Bytes)), r.Freeze.Round(time.Millisecond), r.Took.Round(time.Millisecond))
			return nil
		}),
		withAdmin("mount VOLUME PATH", "attach a volume at PATH (an AFS-style mount point)", cobra.ExactArgs(2), nil, func(c *pathfs.FS, args []string) error {
			if err := c.Admin().MountVolume(args[1], args[0]); err != nil {
				return err
			}
			sayUnreleased(c, path.Dir(args[1]))
			return nil
		}),
	)
	return cmd
}

// sayUnreleased tells of a change made at name in a read-only copy's
// read-write volume (a replicated root): readers see it only after the
// next release.
func sayUnreleased(c *pathfs.FS, name string) {
	if rw, err := c.Admin().CopyOf(name); err == nil && rw != "" {
		fmt.Printf("%s is in volume %s's read-only copy: changed in %s, which readers see after: hoard vol release %s\n", name, rw, rw, rw)
	}
}

func volSetCmd() *cobra.Command {
	var size string
	var quota uint64
	// Checked before dialling: a usage error, whether a server answers
	// or not.
	checkQuota := func(cmd *cobra.Command, args []string) error {
		if !cmd.Flags().Changed("quota") {
			return usagef("hoard vol set: --quota SIZE is required")
		}
		var err error
		if quota, err = parseQuota(size); err != nil {
			return usagef("--quota %q: %v, or 0 for none", size, err)
		}
		return nil
	}
	cmd := withAdmin("set NAME --quota SIZE", "set a volume's quota (admins): the most its files may hold", cobra.MatchAll(cobra.ExactArgs(1), checkQuota),
		func(f *pflag.FlagSet) {
			sizeVar(f, &size, "quota", "", "quota, e.g. 500M, 10G; 0 removes it", "", "0")
		},
		func(c *pathfs.FS, args []string) error {
			v, err := c.Admin().SetQuota(args[0], quota)
			if err != nil {
				return err
			}
			fmt.Printf("volume %s: quota %s, %s used\n", v.Name, quotaString(v.Quota), humanSize(v.Used))
			return nil
		})
	cmd.Example = "  hoard vol set proj --quota 10G\n  hoard vol set proj --quota 0"
	return cmd
}

// parseQuota reads a quota: a size as parseSize reads it, or 0 for none.
func parseQuota(s string) (uint64, error) {
	if strings.TrimSpace(s) == "0" {
		return 0, nil
	}
	n, err := parseSize(s)
	return uint64(n), err
}

func quotaString(q uint64) string {
	if q == 0 {
		return "none"
	}
	return humanSize(q)
}

// humanSize renders n bytes as df -h does, in units parseSize reads:
// 512, 1.5K, 500M, 10G.
func humanSize(n uint64) string {
	if n < 1<<10 {
		return fmt.Sprint(n)
	}
	f, unit := float64(n), 0
	for f >= 1<<10 && unit < len("KMGTPE") {
		f /= 1 << 10
		unit++
	}
	if f < 10 && f != math.Trunc(f) {
		return fmt.Sprintf("%.1f%c", f, "KMGTPE"[unit-1])
	}
	return fmt.Sprintf("%.0f%c", f, "KMGTPE"[unit-1])
}

func printCacheStats(s cache.Stats) {
	fmt.Printf("hits:          %d\n", s.Hits)
	fmt.Printf("misses:        %d\n", s.Misses)
	fmt.Printf("bytes fetched: %d\n", s.BytesFetched)
	fmt.Printf("bytes cached:  %d\n", s.BytesCached)
	fmt.Printf("bytes written: %d\n", s.BytesWritten)
	fmt.Printf("chunks:        %d\n", s.Chunks)
	fmt.Printf("files:         %d\n", s.Files)
	fmt.Printf("evictions:     %d\n", s.Evictions)
	fmt.Printf("bypassed:      %d\n", s.Bypassed)
	fmt.Printf("recovered:     %d\n", s.Recovered)
	fmt.Printf("corrupt:       %d chunks failed their checksum when first read, and were fetched again\n", s.Corrupt)
	fmt.Printf("callbacks:     %d\n", s.Gauges["callbacks"])
	fmt.Printf("passthrough opens: %d\n", s.Gauges["passthrough_opens"])
	fmt.Printf("delegations:   %d read, %d write\n", s.Gauges["delegations_read"], s.Gauges["delegations_write"])
	fmt.Printf("recalls:       %d\n", s.Gauges["recalls"])
	fmt.Printf("dirty bytes:   %d\n", s.Gauges["dirty_bytes"])
	fmt.Printf("flushed:       %d bytes, %d bytes/s now\n", s.Gauges["flushed_bytes"], s.Gauges["flush_rate"])
	fmt.Printf("files made:    %d here (directory delegations), %d removed before the server knew them, %d created there since\n",
		s.Gauges["made_here"], s.Gauges["made_dropped"], s.Gauges["made_settled"])
	fmt.Printf("files removed: %d here (directory delegations), at the server later\n", s.Gauges["removed_here"])
}

func policyCmd() *cobra.Command {
	var cf clientFlags
	var recursive bool
	cmd := &cobra.Command{
		Use:   "policy PATH [cache|bypass|auto] [--recursive]",
		Short: "show or set a file's or directory's caching policy (PATH on a mount, or remote with --server)",
		Args:  cobra.MatchAll(cobra.RangeArgs(1, 2), nonEmpty),
		RunE: func(cmd *cobra.Command, args []string) error {
			target := args[0]
			if len(args) == 2 {
				switch args[1] {
				case policy.Cache, policy.Bypass, policy.Auto:
				default:
					return usagef("policy %q: want cache, bypass or auto", args[1])
				}
			}
			// A path on a mount: ask the mount, through its xattr.
			if _, err := os.Lstat(target); err == nil {
				buf := make([]byte, 512)
				if n, err := unix.Getxattr(target, mount.PolicyXattr, buf); err == nil {
					if len(args) == 1 {
						fmt.Printf("%s: %s\n", target, buf[:n])
						return nil
					}
					v := args[1]
					if recursive {
						v += ",recursive"
					}
					if err := unix.Setxattr(target, mount.PolicyXattr, []byte(v), 0); err != nil {
						return fmt.Errorf("%s: setting the policy: %v", target, err)
					}
					return nil
				} else if !cmd.Flags().Changed("server") {
					return fmt.Errorf("%s is not on a hoard mount (give --server for a remote path)", target)
				}
			}
			cf.cacheGiven = cmd.Flags().Changed("cache")
			c, err := cf.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			if len(args) == 2 {
				return c.SetPolicy(target, args[1], recursive)
			}
			d, err := c.Policy(target)
			if err != nil {
				return err
			}
			fmt.Printf("%s: %s\n", target, d)
			return nil
		},
	}
	cf.add(cmd.Flags())
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "set it on everything under a directory too")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func siteNames(ss []admin.Site) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.Name
	}
	return orDash(strings.Join(names, ","))
}

func volMoveCmd() *cobra.Command {
	var to string
	cmd := withAdmin("move NAME --to SERVER", "move a volume to another server while it is in use (admins)", cobra.ExactArgs(1),
		func(f *pflag.FlagSet) {
			f.StringVar(&to, "to", "", "the server to move it to (hoard server list names them)")
		},
		func(c *pathfs.FS, args []string) error {
			if to == "" {
				return usagef("hoard vol move: needs --to SERVER")
			}
			r, err := c.Admin().MoveVolume(args[0], to)
			switch {
			case err != nil:
				return err
			case r.Undone:
				fmt.Printf("volume %s is on %s; the unfinished move of it elsewhere is undone\n", args[0], to)
			case r.Already:
				fmt.Printf("volume %s is on %s already\n", args[0], to)
			default:
				fmt.Printf("volume %s moved to %s: %s copied in %d passes, changes held back %v, %v in all\n",
					args[0], to, humanSize(uint64(r.Bytes)), r.Passes, r.Freeze.Round(time.Millisecond), r.Took.Round(time.Millisecond))
			}
			return nil
		})
	cmd.Example = "  hoard vol move proj --to files2\n  hoard vol move proj --to files1   # back, or undo a move a dead mover left"
	return cmd
}
