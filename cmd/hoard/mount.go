package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/metrics"

	"github.com/spf13/cobra"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/user"
	"github.com/hoardfs/hoard/dirs"
	"github.com/hoardfs/hoard/mount"
	"github.com/hoardfs/hoard/mount/loginsock"
)

// readyFD is the descriptor a daemonized mount reports success on.
const readyFD = 3

func mountCmd() *cobra.Command {
	var cf clientFlags
	var daemon, passthrough, debug, singleUser, encrypt, nonEmpty, ioURing bool
	var pidfile, profile, metricsAddr, httpAddr string
	cmd := &cobra.Command{
		Use:   "mount [flags] MOUNTPOINT",
		Short: "mount the cell's root volume with FUSE (foreground; --daemon to detach)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := mount.CheckMountpoint(dir, nonEmpty); err != nil {
				return usageError{err}
			}
			if err := mount.CheckFuse(); err != nil {
				return usageError{err}
			}
			if cf.cache == "" && defaultCacheDir() == "" && !cmd.Flags().Changed("cache") {
				// Not a memory cache by accident: it would start empty
				// every time, and keep no writes across a crash.
				return usagef("no cache directory: no home directory is known for this user; give --cache DIR (--cache \"\" for a memory cache)")
			}
			me, err := openMetrics(metricsAddr, httpAddr)
			if err != nil {
				return err
			}
			defer me.close()
			if daemon && os.Getenv("HOARD_DAEMONIZED") == "" {
				me.close() // the daemon opens it again
				logfile, _ := cmd.Flags().GetString("logfile")
				return daemonize(cf.cache, pidfile, logfile)
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
			if encrypt {
				if o.CacheDir == "" {
					return usagef("--cache-encrypt: the cache is in memory (--cache \"\"): there is no disk to encrypt")
				}
				// The key is this process's alone; writes are stored at
				// close, as a crash would leave them unreadable.
				o.CacheKey = make([]byte, cache.KeySize)
				if _, err := rand.Read(o.CacheKey); err != nil {
					return err
				}
				o.NoDelegations, o.NoDirDelegations, passthrough = true, true, false
			}
			m := mount.New(mount.Options{Passthrough: passthrough, SingleUser: singleUser, IOUring: ioURing, Logger: slog.Default()})
			o.RPCTimeout, o.OnInvalidate = cf.timeout, me.invalidations(m, dir)
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
			transport, whyNot := m.Transport()
			if whyNot != "" && ioURing && cmd.Flags().Changed("io-uring") {
				slog.Warn("--io-uring: the kernel's requests come over /dev/fuse", "why", whyNot)
			}
			if me != nil {
				metrics.Client(me.reg, c.Stats)
				me.showMount(c, m, dir)
			}
			defer me.start("mount")()
			if logins, err := listenLogins(m, dir, cf.sec.caCert); err != nil {
				slog.Warn("hoard login cannot reach this mount", "err", err)
			} else if logins != nil {
				defer logins.Close()
			}
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			done := make(chan struct{})
			go func() { m.Wait(); close(done) }()
			if registerUmountHelper(dir) {
				defer unregisterUmountHelper(dir)
			}
			msg := fmt.Sprintf("hoard: %s mounted at %s (cache %s, %s, requests over %s)", cf.server, dir, cacheLabel(cf.cache), readPath(m), transport)
			if os.Getenv("HOARD_DAEMONIZED") != "" {
				ready := os.NewFile(readyFD, "ready")
				fmt.Fprintln(ready, msg)
				ready.Close()
			} else {
				fmt.Fprintln(os.Stderr, msg)
			}
			notifyReady()
			select {
			case <-sig:
				notifyStopping()
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
	cmd.Flags().StringVar(&pidfile, "pidfile", "", "with --daemon: write the daemon's pid here (default: mount.pid in the cache directory)")
	logFlags(cmd.Flags(), "log here, rotated by size (default: stderr; with --daemon: mount.log in the cache directory)")
	cmd.Flags().BoolVar(&passthrough, "passthrough", true, "let the kernel read wholly cached files straight from the cache (Linux ≥ 6.9, root)")
	cmd.Flags().BoolVar(&debug, "debug", false, "log every FUSE request")
	cmd.Flags().BoolVar(&ioURing, "io-uring", true, "serve the kernel's requests over io_uring, each CPU's on that CPU, where the kernel offers it (Linux ≥ 6.14, root, fuse module parameter enable_uring=Y); otherwise, or false, over /dev/fuse")
	cmd.Flags().BoolVar(&nonEmpty, "nonempty", false, "mount over a directory that holds files (they are hidden until unmounted)")
	cmd.Flags().BoolVar(&encrypt, "cache-encrypt", false, "keep the cache files encrypted with a key held only in this process's memory (a stolen disk shows nothing of them); the cache starts empty, passthrough and delegations are off (docs/security.md)")
	cmd.Flags().BoolVar(&singleUser, "single-user", false, "act for every local user with this mount's token, leaving them apart to the files' mode bits (default for root: each user acts with the token they handed it with hoard login, others anonymously)")
	profileFlag(cmd.Flags(), &profile)
	metricsFlag(cmd.Flags(), &metricsAddr, &httpAddr)
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

// daemonize starts this command again in a new session, to log to
// logfile, and returns once it reports the mount up (or its failure).
func daemonize(cache, pidfile, logfile string) error {
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
	// The cache and log named, wherever they came from (a configuration
	// file): hoard umount finds the cache in the daemon's arguments.
	args := slices.Clone(os.Args[1:])
	at := slices.Index(args, "--")
	if at < 0 {
		at = len(args)
	}
	args = slices.Insert(args, at, "--cache="+cache, "--logfile="+logfile)
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), "HOARD_DAEMONIZED=1")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{w} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	logged, _ := log.Seek(0, io.SeekEnd)
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if line == "" {
		return daemonFailed(cmd.Wait(), logfile, logged)
	}
	if err := os.WriteFile(pidfile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("pidfile %s: %w", pidfile, err)
	}
	fmt.Fprintf(os.Stderr, "%s; daemon pid %d (%s), log %s\n", strings.TrimSpace(line), cmd.Process.Pid, pidfile, logfile)
	cmd.Process.Release()
	return nil
}

// daemonFailed is the error of a mount daemon that exited before it was
// mounted (exited, as Wait says): the reason it gave, the last "hoard: "
// line it logged after offset from, and its exit status (2: a usage
// error).
func daemonFailed(exited error, logfile string, from int64) error {
	reason := "no reason logged"
	if f, err := os.Open(logfile); err == nil {
		if fi, err := f.Stat(); err == nil && fi.Size() < from {
			from = 0 // a new file: the daemon rotated it
		}
		f.Seek(from, io.SeekStart)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if r, ok := strings.CutPrefix(sc.Text(), "hoard: "); ok {
				reason = r
			}
		}
		f.Close()
	}
	err := fmt.Errorf("the mount daemon failed: %s (log %s)", reason, logfile)
	var ee *exec.ExitError
	if errors.As(exited, &ee) && ee.ExitCode() == 2 {
		return usageError{err}
	}
	return err
}

func umountCmd() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "unmount a hoard mount, once its daemon stored what it held; also one whose daemon died",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, found := findDaemon(args[0])
			lost := d.lost()
			if err := mount.Unmount(args[0]); err != nil {
				return usageError{err}
			}
			if !found || wait == 0 {
				return nil
			}
			if !d.waitExit(wait) {
				return fmt.Errorf("unmounted; the mount daemon (pid %d) is still storing what it held after %v, and goes on in the background", d.pid, wait)
			}
			if n := d.lost() - lost; n > 0 {
				return fmt.Errorf("unmounted; %d writes could not be stored at the server and were kept: hoard cache lost --cache %s", n, d.cache)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Minute, "how long to wait for the mount's daemon to store the writes it holds and exit (0: do not wait)")
	return cmd
}

// daemon is the process serving a mount, and its cache directory.
type daemon struct {
	pid   int
	cache string
}

// findDaemon finds the hoard mount process serving dir: one whose
// arguments are "mount" and, among the rest, dir (as it named it, from
// its working directory).
func findDaemon(dir string) (daemon, bool) {
	want, err := filepath.Abs(dir)
	if err != nil {
		return daemon{}, false
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if err != nil || len(args) < 3 || args[1] != "mount" {
			continue
		}
		proc := filepath.Dir(p)
		cwd, err := os.Readlink(filepath.Join(proc, "cwd"))
		if err != nil {
			continue
		}
		for _, a := range args[2:] {
			if !filepath.IsAbs(a) {
				a = filepath.Join(cwd, a)
			}
			if filepath.Clean(a) == want {
				pid, _ := strconv.Atoi(filepath.Base(proc))
				return daemon{pid: pid, cache: cacheArg(args, cwd)}, true
			}
		}
	}
	return daemon{}, false
}

// cacheArg is the cache directory a mount's arguments name ("" for the
// default or a memory cache: not looked at).
func cacheArg(args []string, cwd string) string {
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--cache=")
		if a == "--cache" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok && v != "" {
			if !filepath.IsAbs(v) {
				v = filepath.Join(cwd, v)
			}
			return v
		}
	}
	return ""
}

// lost counts the writes kept in the daemon's cache's lost/.
func (d daemon) lost() int {
	if d.cache == "" {
		return 0
	}
	l, _ := lost.List(d.cache)
	return len(l)
}

// waitExit waits up to max for the daemon to exit, saying once that it
// is at work if that takes more than a second.
func (d daemon) waitExit(max time.Duration) bool {
	start := time.Now()
	said := false
	for time.Since(start) < max {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.pid))
		if err != nil || procState(b) == "Z" {
			return true
		}
		if !said && time.Since(start) > time.Second {
			fmt.Fprintf(os.Stderr, "hoard: waiting for the mount daemon (pid %d) to store what it holds\n", d.pid)
			said = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// procState is the state field of a /proc/PID/stat line (after the
// command name, which may hold spaces and parentheses).
func procState(stat []byte) string {
	i := bytes.LastIndexByte(stat, ')')
	if f := strings.Fields(string(stat[i+1:])); i >= 0 && len(f) > 0 {
		return f[0]
	}
	return ""
}

// listenLogins opens m's login socket (package loginsock): hoard login
// hands it the token of the local user who runs it, checked with the
// cell's CA (ca; nil, an insecure mount, takes none). nil, nil: there is
// nowhere to listen.
func listenLogins(m *mount.Mount, dir string, ca *x509.Certificate) (*loginsock.Server, error) {
	if ca == nil {
		return nil, nil
	}
	v, err := cell.NewVerifier(ca, nil)
	if err != nil {
		return nil, err
	}
	where := loginsock.Dir()
	if where == "" {
		slog.Info("no login socket: $XDG_RUNTIME_DIR is not set; restart the mount to change its token")
		return nil, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	s, err := loginsock.Listen(where, abs, logins{m, v}, slog.Default())
	if err != nil {
		return nil, err
	}
	who := "each local user with the token they log in with (hoard login), anonymous until then"
	if m.SingleUser() {
		who = "every local user with this mount's token"
	}
	slog.Info("acting for "+who, "login socket", s.Path())
	return s, nil
}

// logins is what the login socket does to a mount.
type logins struct {
	m *mount.Mount
	v *cell.Verifier
}

// Login checks token with the cell's CA (a forged, altered, expired or
// foreign one is refused) and makes it uid's. The server still checks it
// on every request (a revoked one).
func (l logins) Login(uid uint32, token string) (string, error) {
	c, err := l.v.Verify(token)
	if err != nil {
		return "", err
	}
	if err := l.m.Login(uid, user.New(token)); err != nil {
		return "", err
	}
	slog.Info("logged in", "uid", uid, "user", c.User, "until", c.Expires.Format(time.RFC3339))
	return c.User, nil
}

// Logout makes uid anonymous, if the mount is of cellName ("": any).
func (l logins) Logout(uid uint32, cellName string) error {
	if cellName != "" && cellName != l.v.Cell() {
		return fmt.Errorf("this mount is of cell %s", l.v.Cell())
	}
	if err := l.m.Logout(uid); err != nil {
		return err
	}
	slog.Info("logged out", "uid", uid)
	return nil
}
