package main

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/dirs"
	"github.com/hoardfs/hoard/mount"
)

// readyFD is the descriptor a daemonized mount reports success on.
const readyFD = 3

func mountCmd() *cobra.Command {
	var cf clientFlags
	var daemon, passthrough, debug bool
	var pidfile, logfile, profile string
	cmd := &cobra.Command{
		Use:   "mount [flags] MOUNTPOINT",
		Short: "mount the cell's root volume with FUSE (foreground; --daemon to detach)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := mount.CheckMountpoint(dir); err != nil {
				return usageError{err}
			}
			if err := mount.CheckFuse(); err != nil {
				return usageError{err}
			}
			if daemon && os.Getenv("HOARD_DAEMONIZED") == "" {
				return daemonize(pidfile, logfile)
			}
			o, err := cf.options()
			if err != nil {
				return err
			}
			stop, err := startProfile(profile)
			if err != nil {
				return err
			}
			defer stop()
			m := mount.New(mount.Options{Passthrough: passthrough, Logger: slog.Default()})
			o.RPCTimeout, o.OnInvalidate = cf.timeout, m.Invalidate
			c, err := client.Dial(o)
			if err != nil {
				return err
			}
			defer func() {
				if err := c.Close(); err != nil {
					slog.Error("unmounted with writes not stored; see hoard cache lost", "err", err)
				}
			}()
			if err := m.Serve(c, dir, debug); err != nil {
				return err
			}
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			done := make(chan struct{})
			go func() { m.Wait(); close(done) }()
			msg := fmt.Sprintf("hoard: %s mounted at %s (cache %s, %s)", cf.server, dir, cacheLabel(cf.cache), readPath(m))
			if os.Getenv("HOARD_DAEMONIZED") != "" {
				ready := os.NewFile(readyFD, "ready")
				fmt.Fprintln(ready, msg)
				ready.Close()
			} else {
				fmt.Fprintln(os.Stderr, msg)
			}
			select {
			case <-sig:
				if err := m.Unmount(); err != nil {
					// Busy: detach lazily so the daemon can still exit.
					slog.Warn("unmount failed; detaching", "err", err)
					mount.Unmount(dir)
				}
				<-done
			case <-done:
			}
			return nil
		},
	}
	cf.add(cmd.Flags())
	cmd.Flags().Lookup("timeout").Usage = "how long operations wait for an unreachable server before failing with EIO/ETIMEDOUT"
	cmd.Flags().Lookup("timeout").DefValue = "10s"
	cf.timeout = 10 * time.Second
	cmd.Flags().BoolVar(&daemon, "daemon", false, "detach and run in the background")
	cmd.Flags().StringVar(&pidfile, "pidfile", "", "with --daemon: write the daemon's pid here (default: <cache>/mount.pid)")
	cmd.Flags().StringVar(&logfile, "logfile", "", "with --daemon: log here (default: <cache>/mount.log)")
	cmd.Flags().BoolVar(&passthrough, "passthrough", true, "let the kernel read wholly cached files straight from the cache (Linux ≥ 6.9, root)")
	cmd.Flags().BoolVar(&debug, "debug", false, "log every FUSE request")
	profileFlag(cmd.Flags(), &profile)
	return cmd
}

func cacheLabel(dir string) string {
	if dir == "" {
		return "in memory"
	}
	return dir
}

func readPath(m *mount.Mount) string {
	if m.Passthrough() {
		return "cached reads by FUSE passthrough"
	}
	return "cached reads through the kernel page cache"
}

// daemonize starts this command again in a new session without --daemon
// and returns once it reports the mount up (or its failure).
func daemonize(pidfile, logfile string) error {
	cache := defaultCacheDir()
	for i, a := range os.Args {
		if a == "--cache" && i+1 < len(os.Args) {
			cache = os.Args[i+1]
		} else if strings.HasPrefix(a, "--cache=") {
			cache = strings.TrimPrefix(a, "--cache=")
		}
	}
	base := cache
	if base == "" {
		base = os.TempDir()
	} else if err := dirs.Ensure("cache directory", base, true); err != nil {
		return usageError{err}
	}
	if pidfile == "" {
		pidfile = filepath.Join(base, "mount.pid")
	}
	if logfile == "" {
		logfile = filepath.Join(base, "mount.log")
	}
	log, err := os.OpenFile(logfile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return usagef("--logfile %s: %v", logfile, err)
	}
	defer log.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), "HOARD_DAEMONIZED=1")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{w} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if line == "" {
		cmd.Wait()
		return fmt.Errorf("the mount daemon failed; see %s", logfile)
	}
	if err := os.WriteFile(pidfile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("pidfile %s: %w", pidfile, err)
	}
	fmt.Fprintf(os.Stderr, "%s; daemon pid %d (%s), log %s\n", strings.TrimSpace(line), cmd.Process.Pid, pidfile, logfile)
	cmd.Process.Release()
	return nil
}

func umountCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "unmount a hoard mount, also one whose daemon died",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := mount.Unmount(args[0]); err != nil {
				return usageError{err}
			}
			return nil
		},
	}
}
