package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/chunkindex"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/dirs"
	"github.com/hoardfs/hoard/node"
)

// clientFlags are the flags of every command that talks to a server.
type clientFlags struct {
	server     string
	cache      string
	cacheSize  string
	bypassAt   string
	streams    int
	timeout    time.Duration
	noDeleg    bool
	noDirDeleg bool
	// cacheGiven: --cache was on the command line (not the default).
	cacheGiven bool
	// lazyRoot: the root volume is resolved at its first use (withAdmin).
	lazyRoot bool
	sec      securityFlags
}

func defaultCacheDir() string {
	if d := os.Getenv("HOARD_CACHE"); d != "" {
		return d
	}
	if d, err := dirs.UserCacheDir(); err == nil {
		return filepath.Join(d, "hoard")
	}
	return ""
}

func defaultServer() string {
	if s := os.Getenv("HOARD_SERVER"); s != "" {
		return s
	}
	return "127.0.0.1:7100"
}

func (cf *clientFlags) add(f *pflag.FlagSet) {
	f.StringVar(&cf.server, "server", defaultServer(), "file server address (env HOARD_SERVER)")
	f.StringVar(&cf.cache, "cache", defaultCacheDir(), "cache directory, kept between runs (env HOARD_CACHE); empty for a memory cache")
	sizeVar(f, &cf.cacheSize, "cache-size", "1G", "cache size limit, e.g. 512M, 10G")
	f.DurationVar(&cf.timeout, "timeout", 5*time.Second, "how long to wait for the server")
	sizeVar(f, &cf.bypassAt, "bypass-threshold", "", "files at least this large bypass the cache, e.g. 1G (default: off, auto decides)", "")
	f.IntVar(&cf.streams, "data-streams", 4, "connections to the server's bulk-data channel, or as many as the server asks for if more (a proxy with a data channel asks for 16); 0: file data over the control connection")
	f.BoolVar(&cf.noDeleg, "no-delegations", false, "take no delegations: every open and close goes to the server, writes are stored at close")
	f.BoolVar(&cf.noDirDeleg, "no-dir-delegations", false, "take no delegations on directories: every create goes to the server at once")
	cf.sec.add(f)
}

// options turns the flags into client options.
func (cf *clientFlags) options() (client.Options, error) {
	if _, port, err := net.SplitHostPort(cf.server); err != nil || port == "" {
		return client.Options{}, usagef("--server %q: want the host:port of a hoard server, such as 127.0.0.1:7100", cf.server)
	}
	size, err := parseSize(cf.cacheSize)
	if err != nil {
		return client.Options{}, usagef("--cache-size %q: %v", cf.cacheSize, err)
	}
	var threshold int64
	if cf.bypassAt != "" {
		if threshold, err = parseSize(cf.bypassAt); err != nil {
			return client.Options{}, usagef("--bypass-threshold %q: %v", cf.bypassAt, err)
		}
	}
	if cf.cache != "" {
		if err := dirs.Ensure("cache directory", cf.cache, true); err != nil {
			return client.Options{}, usageError{err}
		}
	}
	if cf.streams < 0 || cf.streams > 64 {
		return client.Options{}, usagef("--data-streams %d: want 0 to 64", cf.streams)
	}
	tlsc, token, err := cf.sec.resolve()
	if err != nil {
		return client.Options{}, err
	}
	return client.Options{Server: cf.server, TLS: tlsc, Token: token, LazyRoot: cf.lazyRoot, CacheDir: cf.cache, CacheSize: size, BypassThreshold: threshold,
		DataStreams: cf.streams, NoDataChannel: cf.streams == 0, NoDelegations: cf.noDeleg, NoDirDelegations: cf.noDirDeleg, DialTimeout: cf.timeout, RPCTimeout: max(cf.timeout, 30*time.Second)}, nil
}

func (cf *clientFlags) dial() (*pathfs.FS, error) {
	o, err := cf.options()
	if err != nil {
		return nil, err
	}
	c, err := pathfs.Dial(o)
	if err != nil && !cf.cacheGiven && o.CacheDir != "" && errors.Is(err, chunkindex.ErrInUse) {
		// The default cache belongs to a running mount: a short command
		// does fine with a memory cache.
		fmt.Fprintf(os.Stderr, "hoard: %s is in use (a mount?); using a memory cache\n", o.CacheDir)
		o.CacheDir = ""
		return pathfs.Dial(o)
	}
	return c, err
}

// sizeVar defines a flag holding a size as parseSize reads it, or one of
// the literals also (a quota's "0", an unset threshold's ""). The value is
// checked when it is set, so a bad one in a configuration file or the
// environment is refused where it is read, by config show too.
func sizeVar(f *pflag.FlagSet, p *string, name, def, usage string, also ...string) {
	*p = def
	f.Var(sizeValue{p, also}, name, usage)
}

// sizeValue is a size flag's pflag.Value.
type sizeValue struct {
	p    *string
	also []string
}

func (v sizeValue) String() string { return *v.p }
func (v sizeValue) Type() string   { return "size" }

func (v sizeValue) Set(s string) error {
	if !slices.Contains(v.also, strings.TrimSpace(s)) {
		if _, err := parseSize(s); err != nil {
			return err
		}
	}
	*v.p = s
	return nil
}

// parseSize reads sizes like 4096, 512K, 10M, 2G, 1T (powers of 1024).
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(strings.ToUpper(s))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "B"), "I")
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			s = s[:n-1]
		}
	}
	var v int64
	if _, err := fmt.Sscanf(s, "%d", &v); err != nil || v <= 0 || fmt.Sprint(v) != s {
		return 0, errors.New("want a positive size such as 4096, 512M or 10G")
	}
	return v * mult, nil
}

// nonEmpty refuses an empty argument: as a path "" would name the root,
// which nobody means by it.
func nonEmpty(cmd *cobra.Command, args []string) error {
	for i, a := range args {
		if a == "" {
			return usagef("%s: argument %d is empty", strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" "), i+1)
		}
	}
	return nil
}

// withClient builds a command that dials, runs fn, and closes.
func withClient(use, short string, args cobra.PositionalArgs, setup func(*pflag.FlagSet), fn func(c *pathfs.FS, args []string) error) *cobra.Command {
	return clientCmd(use, short, args, setup, fn, false)
}

// clientCmd is withClient, or withAdmin when admin is set: its client
// resolves the root volume only if fn uses a path, so that the cell's
// administration works with the root volume's server down.
func clientCmd(use, short string, args cobra.PositionalArgs, setup func(*pflag.FlagSet), fn func(c *pathfs.FS, args []string) error, admin bool) *cobra.Command {
	var cf clientFlags
	cf.lazyRoot = admin
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.MatchAll(args, nonEmpty),
		RunE: func(cmd *cobra.Command, args []string) error {
			cf.cacheGiven = cmd.Flags().Changed("cache")
			// A short-lived command has nothing to gain from write-back
			// and must know its writes arrived before it exits.
			cf.noDeleg = true
			c, err := cf.dial()
			if err != nil {
				return err
			}
			err = fn(c, args)
			return errors.Join(err, c.Close())
		}}
	cf.add(cmd.Flags())
	cmd.Flags().MarkHidden("no-delegations") // never taken, as said above
	if setup != nil {
		setup(cmd.Flags())
	}
	return cmd
}

// withAdmin is withClient for a command that moves no file data (volumes,
// servers, ACLs, groups): it uses a memory cache, so it never contends
// with a mount for the default one, and its help leaves out the cache's
// flags, which would change nothing.
func withAdmin(use, short string, args cobra.PositionalArgs, setup func(*pflag.FlagSet), fn func(c *pathfs.FS, args []string) error) *cobra.Command {
	cmd := clientCmd(use, short, args, setup, fn, true)
	f := cmd.Flags()
	f.Lookup("cache").Value.Set("")
	f.Lookup("cache").DefValue = ""
	for _, name := range []string{"cache", "cache-size", "bypass-threshold", "data-streams", "no-dir-delegations"} {
		f.MarkHidden(name)
	}
	return cmd
}

func fileCmds() []*cobra.Command {
	var long, recursive, parents bool
	return []*cobra.Command{
		withClient("put LOCAL REMOTE", "copy a local file into hoard", cobra.ExactArgs(2), nil, put),
		withClient("get REMOTE LOCAL", "copy a file out of hoard", cobra.ExactArgs(2), nil, get),
		withClient("cat REMOTE...", "print files", cobra.MinimumNArgs(1), nil, func(c *pathfs.FS, args []string) error {
			for _, a := range args {
				if err := copyOut(c, a, os.Stdout); err != nil {
					return err
				}
			}
			return nil
		}),
		withClient("ls [-l] [REMOTE]", "list a directory", cobra.MaximumNArgs(1),
			func(f *pflag.FlagSet) { f.BoolVarP(&long, "long", "l", false, "long listing") },
			func(c *pathfs.FS, args []string) error { return ls(c, args, long) }),
		withClient("stat REMOTE...", "show status, FID and DataVersion", cobra.MinimumNArgs(1), nil, func(c *pathfs.FS, args []string) error {
			for _, a := range args {
				st, err := c.Lstat(a)
				if err != nil {
					return err
				}
				printStatus(a, st)
			}
			return nil
		}),
		withClient("rm [-r] REMOTE...", "remove files (and with -r, trees)", cobra.MinimumNArgs(1),
			func(f *pflag.FlagSet) {
				f.BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
			},
			func(c *pathfs.FS, args []string) error {
				// First only check, so that a refusal anywhere leaves
				// everything in place.
				for _, dry := range []bool{true, false} {
					for _, a := range args {
						if err := rm(c, a, recursive, dry); err != nil {
							return err
						}
					}
				}
				return nil
			}),
		withClient("mkdir [-p] REMOTE...", "make directories", cobra.MinimumNArgs(1),
			func(f *pflag.FlagSet) {
				f.BoolVarP(&parents, "parents", "p", false, "make parents as needed, no error if existing")
			},
			func(c *pathfs.FS, args []string) error {
				for _, a := range args {
					if err := mkdir(c, a, parents); err != nil {
						return err
					}
				}
				return nil
			}),
		withClient("mv SRC DST", "rename (DST may be an existing directory)", cobra.ExactArgs(2), nil, mv),
	}
}

// put copies a local file in under a hidden name in the same directory,
// stores it synced, and renames it over the target: an interrupted put
// (Ctrl-C, an error) leaves the old file or nothing, and what it had
// written is dropped, not kept as lost writes.
func put(c *pathfs.FS, args []string) error {
	local, remote := args[0], args[1]
	in, err := os.Open(local)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s is a directory; put copies files", local)
	}
	if st, err := c.Stat(remote); err == nil && st.Type == node.TypeDir {
		remote = path.Join(remote, filepath.Base(local))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, base := path.Split(remote)
	tmp := path.Join(dir, fmt.Sprintf(".%s.hoard-put-%08x", base, rand.Uint32()))
	out, err := c.Open(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	abandon := func(err error) error {
		// Removed while open: its unstored writes are nobody's to read,
		// and the close drops them.
		c.Remove(tmp)
		out.Close()
		return err
	}
	bar := putBar(fi.Size())
	if err := copyIn(ctx, out, in, fi, bar.add); err != nil {
		bar.done()
		if ctx.Err() != nil {
			err = fmt.Errorf("put %s: interrupted; %s is as it was", local, remote)
		}
		return abandon(err)
	}
	bar.storing()
	err = out.Sync()
	bar.done()
	if err != nil {
		return abandon(err)
	}
	if err := out.Close(); err != nil {
		c.Remove(tmp)
		return err
	}
	if err := c.Rename(tmp, remote); err != nil {
		c.Remove(tmp)
		return err
	}
	return nil
}

// copyIn copies in to out until ctx ends. A regular file's holes are
// skipped (SEEK_DATA, SEEK_HOLE) and its size set at the end, so that a
// sparse file stays sparse at the server and its zeros cross no network;
// anything else (a pipe) is streamed.
// putProgress is put's progress bar on a terminal (nil: none): bytes
// copied into hoard, then the store that makes them the server's.
type putProgress struct{ pb *progressbar.ProgressBar }

// putBar is the bar for a put of size bytes: none unless stderr is a
// terminal and the file big enough to wait for.
func putBar(size int64) *putProgress {
	if size < 16<<20 || !term.IsTerminal(int(os.Stderr.Fd())) {
		return nil
	}
	return &putProgress{progressbar.NewOptions64(size, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowBytes(true),
		progressbar.OptionSetDescription("copying"), progressbar.OptionSetPredictTime(true), progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())}
}

func (p *putProgress) add(n int64) {
	if p != nil {
		p.pb.Add64(n)
	}
}

// storing says the copy is done and the server is taking what the
// cache still holds (Sync).
func (p *putProgress) storing() {
	if p != nil {
		p.pb.Describe("storing on the server")
	}
}

func (p *putProgress) done() {
	if p != nil {
		p.pb.Finish()
	}
}

// copyIn copies in to out, holes as holes, telling progress of each
// stretch of the file done.
func copyIn(ctx context.Context, out *client.File, in *os.File, fi os.FileInfo, progress func(int64)) error {
	buf := make([]byte, 1<<20)
	copyRange := func(from, to int64) error {
		for off := from; off < to; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := in.ReadAt(buf[:min(int64(len(buf)), to-off)], off)
			if n > 0 {
				if _, err := out.WriteAt(buf[:n], off); err != nil {
					return err
				}
				off += int64(n)
				progress(int64(n))
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	fd, size := int(in.Fd()), fi.Size()
	if _, err := unix.Seek(fd, 0, unix.SEEK_DATA); !fi.Mode().IsRegular() || err != nil && err != unix.ENXIO {
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, rerr := in.Read(buf)
			if n > 0 {
				if _, err := out.Write(buf[:n]); err != nil {
					return err
				}
				progress(int64(n))
			}
			if rerr == io.EOF {
				return nil
			}
			if rerr != nil {
				return rerr
			}
		}
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			progress(size - off) // holes to the end
			break
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		progress(data - off) // a hole, nothing to copy
		if err := copyRange(data, min(hole, size)); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// writerOnly hides ReaderFrom-style fast paths so io.CopyBuffer uses buf.
type writerOnly struct{ io.Writer }

func get(c *pathfs.FS, args []string) error {
	remote, local := args[0], args[1]
	// The remote file is opened first: a get that cannot read it (missing,
	// a directory) must not have made or truncated the local one.
	f, err := c.Open(remote, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(remote))
	}
	out, err := os.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, os.FileMode(st.Mode&0o777))
	if err != nil {
		return err
	}
	if err := copyFile(out, f); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func copyOut(c *pathfs.FS, remote string, w io.Writer) error {
	f, err := c.Open(remote, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return copyFile(w, f)
}

func copyFile(w io.Writer, f *client.File) error {
	_, err := io.CopyBuffer(writerOnly{w}, readerOnly{f}, make([]byte, 1<<20))
	return err
}

type readerOnly struct{ io.Reader }

func ls(c *pathfs.FS, args []string, long bool) error {
	dir := "/"
	if len(args) == 1 {
		dir = args[0]
	}
	st, err := c.Stat(dir)
	if err != nil {
		return err
	}
	if st.Type != node.TypeDir {
		printLong(os.Stdout, path.Base(dir), st, long)
		return nil
	}
	ents, err := c.ReadDir(dir)
	if err != nil {
		return err
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 1, ' ', tabwriter.AlignRight)
	for _, e := range ents {
		if !long {
			fmt.Println(e.Name)
			continue
		}
		st, err := c.Lstat(path.Join(dir, e.Name))
		if err != nil {
			return err
		}
		printLong(tw, e.Name, st, true)
	}
	return tw.Flush()
}

func modeString(st node.Status) string {
	kind := map[node.Type]byte{node.TypeFile: '-', node.TypeDir: 'd', node.TypeSymlink: 'l', node.TypeMountPoint: 'm',
		node.TypeFifo: 'p', node.TypeSocket: 's', node.TypeCharDev: 'c', node.TypeBlockDev: 'b'}[st.Type]
	b := []byte{kind}
	for i := 8; i >= 0; i-- {
		if st.Mode&(1<<i) != 0 {
			b = append(b, "rwxrwxrwx"[8-i])
		} else {
			b = append(b, '-')
		}
	}
	return string(b)
}

func printLong(w io.Writer, name string, st node.Status, long bool) {
	if !long {
		fmt.Fprintln(w, name)
		return
	}
	suffix := ""
	switch st.Type {
	case node.TypeSymlink:
		suffix = " -> " + st.Target
	case node.TypeMountPoint:
		suffix = " => volume " + st.Target
	}
	fmt.Fprintf(w, "%s\t %d\t %d\t %d\t %d\t %s\t %s%s\n", modeString(st), st.Nlink, st.UID, st.GID, st.Size,
		st.Mtime.Format("2006-01-02 15:04"), name, suffix)
}

func printStatus(name string, st node.Status) {
	fmt.Printf("  path: %s\n  type: %s\n   fid: %s\n  mode: %s (%04o)\n owner: %d:%d\n  size: %d\n links: %d\nDataVersion: %d\n mtime: %s\n ctime: %s\n atime: %s\n",
		name, st.Type, st.FID, modeString(st), st.Mode, st.UID, st.GID, st.Size, st.Nlink, st.DataVersion,
		st.Mtime.Format(time.RFC3339Nano), st.Ctime.Format(time.RFC3339Nano), st.Atime.Format(time.RFC3339Nano))
	if st.Target != "" {
		fmt.Printf("target: %s\n", st.Target)
	}
}

// rm removes name, and with recursive all under it, children first; dry
// only checks that it may, walking the same way.
func rm(c *pathfs.FS, name string, recursive, dry bool) error {
	st, err := c.Lstat(name)
	if err != nil {
		return err
	}
	if err := volumeTop("rm", name, st); err != nil {
		return err
	}
	if st.Type == node.TypeDir && recursive {
		ents, err := c.ReadDir(name)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := rm(c, path.Join(name, e.Name), true, dry); err != nil {
				return err
			}
		}
	}
	if dry {
		return nil
	}
	return c.Remove(name)
}

func mv(c *pathfs.FS, args []string) error {
	src, dst := args[0], args[1]
	st, err := c.Lstat(src)
	if err != nil {
		return err
	}
	if err := volumeTop("mv", src, st); err != nil {
		return err
	}
	if st, err := c.Stat(dst); err == nil && st.Type == node.TypeDir {
		dst = path.Join(dst, path.Base(src))
	}
	if st, err := c.Lstat(dst); err == nil {
		// Renaming onto a mount point would replace it.
		if err := volumeTop("mv", dst, st); err != nil {
			return err
		}
	}
	return c.Rename(src, dst)
}

// volumeTop refuses to remove or move what holds a volume in the tree:
// the root, and a mount point (it takes its whole volume out of sight).
// Only a name that cleans to "/" is a volume's root: other volumes' roots
// are reached through their mount points, which Lstat does not follow.
func volumeTop(op, name string, st node.Status) error {
	switch {
	case path.Clean("/"+name) == "/":
		return fmt.Errorf("%s %s: refused: it is the root", op, name)
	case st.Type == node.TypeMountPoint:
		return fmt.Errorf("%s %s: refused: it is the mount point of volume %s", op, name, st.Target)
	}
	return nil
}

func mkdir(c *pathfs.FS, name string, parents bool) error {
	if !parents {
		return c.Mkdir(name, 0o755)
	}
	clean := path.Clean("/" + name)
	if clean == "/" {
		return nil // the root is always there
	}
	comps := strings.Split(clean[1:], "/")
	for i := range comps {
		p := "/" + strings.Join(comps[:i+1], "/")
		err := c.Mkdir(p, 0o755)
		if err == nil || errors.Is(err, syscall.EEXIST) {
			if st, serr := c.Stat(p); serr == nil && st.Type == node.TypeDir {
				continue
			}
		}
		return err
	}
	return nil
}
