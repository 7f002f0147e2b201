// Package tree is bench's tree part: the workloads people run first
// (cp -r, postmark, find | xargs cat, tar, rm -r, dd, fio) on the local
// disk, through bindfs and on a hoard mount, at doubling file counts.
package tree

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/bench/postmark"
	"github.com/hoardfs/hoard/fuseuring"
)

// Config is the tree part's flags.
type Config struct {
	Files, Big, FS    string        // -tree-files, -tree-big, -tree-fs
	NoDeleg, Postmark bool          // -tree-nodeleg, -tree-postmark
	Timeout           time.Duration // -tree-timeout
	flags             *flag.FlagSet // where they were defined, to tell whether -tree-fs was given
}

// Flags defines the -tree-* flags on fs and returns what they set.
func Flags(fs *flag.FlagSet) *Config {
	c := &Config{flags: fs}
	fs.StringVar(&c.Files, "tree-files", "1000,2000,4000,8000", "tree: file counts of the file-count rounds, comma-separated (e.g. 12500,25000,50000,100000)")
	fs.StringVar(&c.Big, "tree-big", "1G", "tree: size of the large file, whole MiB (64M, 1G); 0 skips the large-file rows")
	fs.StringVar(&c.FS, "tree-fs", "local,bindfs,hoard,hoard-uring", "tree: file systems to run, comma-separated: local, bindfs, hoard (requests over /dev/fuse), hoard-uring (over io_uring, a mount's default where the kernel offers it)")
	fs.BoolVar(&c.NoDeleg, "tree-nodeleg", true, "tree: also run postmark on a hoard mount with --no-delegations")
	fs.BoolVar(&c.Postmark, "tree-postmark", true, "tree: run postmark (false: the other rows only, for runs at large N)")
	fs.DurationVar(&c.Timeout, "tree-timeout", 10*time.Minute, "tree: longest a round (one file system at one file count, or with the large file) may take")
	return c
}

// fsGiven reports whether -tree-fs was given, not left at its default.
func (c *Config) fsGiven() (given bool) {
	c.flags.Visit(func(f *flag.Flag) { given = given || f.Name == "tree-fs" })
	return given
}

// treeTimes is one file system's times at one file count.
type treeTimes struct {
	cp, flat, pm, pmNoDeleg, stored, cold, warm, stat, tar, rm time.Duration
}

// String is t's times in seconds, as a round ends: a long run that
// stops later keeps them.
func (t *treeTimes) String() string {
	return fmt.Sprintf("cp %s, stored %s, flat %s, postmark %s, cold %s, warm %s, stat %s, tar %s, rm %s",
		secs(t.cp), secs(t.stored), secs(t.flat), secs(t.pm), secs(t.cold), secs(t.warm), secs(t.stat), secs(t.tar), secs(t.rm))
}

// bigTimes is one file system's figures for the large file.
type bigTimes struct {
	write, cold time.Duration
	warm        [3]time.Duration
	iops        float64
}

// Run times the workloads people run first (cp -r, postmark, find |
// xargs cat, tar, rm -r, dd, fio) on the local file system, through bindfs
// (what any FUSE file system pays) and on a hoard mount, at doubling file
// counts so that the growth of each shows.
func Run(e *harness.Env, c *Config) error {
	bin, scratch := e.Bin, e.Scratch
	var ns []int
	for _, s := range strings.Split(c.Files, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return fmt.Errorf("-tree-files %q: want positive counts separated by commas", c.Files)
		}
		ns = append(ns, n)
	}
	big, err := int64(0), error(nil)
	if c.Big != "0" {
		big, err = parseSize(c.Big)
	}
	if err != nil || big%(1<<20) != 0 {
		return fmt.Errorf("-tree-big %q: want whole MiB, such as 64M or 1G", c.Big)
	}
	fss := strings.Split(c.FS, ",")
	for _, f := range fss {
		if !slices.Contains([]string{"local", "bindfs", "hoard", "hoard-uring"}, f) {
			return fmt.Errorf("-tree-fs %q: want local, bindfs, hoard and/or hoard-uring", c.FS)
		}
	}
	if slices.Contains(fss, "hoard-uring") {
		wasOn, err := fuseuring.Enable()
		if err == nil {
			err = fuseuring.Check()
		}
		switch {
		case err != nil && c.fsGiven():
			return fmt.Errorf("-tree-fs hoard-uring: %w", err)
		case err != nil:
			// The default's: run the rest, and say why not this.
			fmt.Printf("tree: hoard-uring left out: %v\n", err)
			fss = slices.DeleteFunc(fss, func(f string) bool { return f == "hoard-uring" })
		case !wasOn:
			defer fuseuring.Disable()
		}
	}
	fmt.Printf("\ncommand: HOARD_BIN=%s go run ./bench %s\n", bin, strings.Join(os.Args[1:], " "))

	dir := filepath.Join(scratch, "tree")
	trips, err := c.roundTrips(bin, dir, fss)
	if err != nil {
		return err
	}
	res := map[string]map[int]*treeTimes{}
	for _, n := range ns {
		src := filepath.Join(dir, fmt.Sprintf("src%d", n))
		size, err := makeTrees(src, n)
		if err != nil {
			return err
		}
		// Room for the tree, the flat directory and postmark's files, twice.
		cacheSize := 2*(size+int64(n)*(4<<10+16<<10)) + 2<<30
		for _, f := range fss {
			t := &treeTimes{}
			err := c.inRound(fmt.Sprintf("%s, %d files", f, n), func(ctx context.Context) error {
				return withTarget(ctx, bin, filepath.Join(dir, fmt.Sprintf("%s-%d", f, n)), f, cacheSize, func(tg *treeTarget) error { return t.run(ctx, tg, src, n, size, c.Postmark) })
			})
			if err == nil {
				fmt.Fprintf(os.Stderr, "tree: %s, %d files: %s\n", f, n, t)
			}
			if err == nil && f == "hoard" && c.NoDeleg && c.Postmark {
				err = c.inRound(fmt.Sprintf("hoard --no-delegations, postmark on %d files", n), func(ctx context.Context) error {
					return withTarget(ctx, bin, filepath.Join(dir, fmt.Sprintf("hoard-nodeleg-%d", n)), f, cacheSize, func(tg *treeTarget) (err error) {
						t.pmNoDeleg, err = timedPostmark(ctx, tg.root, n)
						return err
					}, "--no-delegations")
				})
			}
			if err != nil {
				return err
			}
			if res[f] == nil {
				res[f] = map[int]*treeTimes{}
			}
			res[f][n] = t
		}
	}
	bigs := map[string]*bigTimes{}
	for _, f := range fss {
		if big == 0 {
			break
		}
		if f == "hoard-uring" {
			continue // the large file's requests are few: the transport does not show
		}
		b := &bigTimes{}
		err := c.inRound(fmt.Sprintf("%s, %s file", f, harness.Human(big)), func(ctx context.Context) error {
			return withTarget(ctx, bin, filepath.Join(dir, "big-"+f), f, 2*big+2<<30, func(tg *treeTarget) error { return b.run(ctx, tg, big) })
		})
		if err != nil {
			return err
		}
		bigs[f] = b
	}
	printTree(ns, res, bigs, big)
	printTrips(trips)
	return c.figures(e, ns, res, bigs, big)
}

// inRound runs a round with a context that ends after -tree-timeout,
// which kills the round's commands.
func (c *Config) inRound(what string, round func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	start := time.Now()
	err := round(ctx)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("tree: %s: longer than -tree-timeout %v: %w", what, c.Timeout, err)
	}
	if err != nil {
		return fmt.Errorf("tree: %s: %w", what, err)
	}
	fmt.Fprintf(os.Stderr, "tree: %s: %v\n", what, time.Since(start).Round(time.Second))
	return nil
}

// makeTrees writes a round's sources: src/tree holds n files of 1-16 KiB
// (sizes and bytes from a fixed seed), 100 to a directory, and src/flat n
// files of 4 KiB in one directory. It returns the bytes in src/tree.
func makeTrees(src string, n int) (int64, error) {
	rng := rand.New(rand.NewSource(7))
	buf := make([]byte, 16<<10)
	var size int64
	for i := range n {
		d := filepath.Join(src, "tree", fmt.Sprintf("d%04d", i/100))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return 0, err
		}
		b := buf[:1<<10+rng.Intn(15<<10+1)]
		rng.Read(b)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%06d", i)), b, 0o644); err != nil {
			return 0, err
		}
		size += int64(len(b))
	}
	if err := os.MkdirAll(filepath.Join(src, "flat"), 0o755); err != nil {
		return 0, err
	}
	for i := range n {
		rng.Read(buf[:4<<10])
		if err := os.WriteFile(filepath.Join(src, "flat", fmt.Sprintf("f%06d", i)), buf[:4<<10], 0o644); err != nil {
			return 0, err
		}
	}
	return size, nil
}

// run runs workloads 1-9 with n files in tg (postmark if pm); src holds
// their sources, size bytes in src/tree.
func (t *treeTimes) run(ctx context.Context, tg *treeTarget, src string, n int, size int64, pm bool) error {
	tree := filepath.Join(tg.root, "tree")
	var err error
	if t.cp, err = timedCopy(ctx, filepath.Join(src, "tree"), tree, n); err != nil {
		return err
	}
	if t.stored, err = tg.store(); err != nil {
		return err
	}
	if t.flat, err = timedCopy(ctx, filepath.Join(src, "flat"), filepath.Join(tg.root, "flat"), n); err != nil {
		return err
	}
	if pm {
		if t.pm, err = timedPostmark(ctx, tg.root, n); err != nil {
			return err
		}
	}
	if err := tg.cold(); err != nil {
		return err
	}
	if t.cold, err = harness.Timed(func() error { return harness.FindCat(ctx, tree) }); err != nil {
		return err
	}
	if err := countFiles(tree, n); err != nil {
		return err
	}
	if t.warm, err = harness.BestOf(3, func() error { return harness.FindCat(ctx, tree) }); err != nil {
		return err
	}
	if t.stat, err = harness.BestOf(3, func() error {
		_, err := harness.RunCmd(ctx, "find", tree, "-printf", `%s %T@\n`)
		return err
	}); err != nil {
		return err
	}
	t.tar, err = harness.BestOf(3, func() error {
		out, err := harness.RunCmd(ctx, "bash", "-o", "pipefail", "-c", `cd "$1" && tar cf - . | wc -c`, "bash", tree)
		if got, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && got < size {
			err = fmt.Errorf("tar of %s: %d bytes, less than the %d in its files", tree, got, size)
		}
		return err
	})
	if err != nil {
		return err
	}
	t.rm, err = harness.Timed(func() error { _, err := harness.RunCmd(ctx, "rm", "-r", tree); return err })
	return err
}

// timedCopy times cp -r of src (in the page cache, no writeback under
// way) to dst and checks that dst then holds n files.
func timedCopy(ctx context.Context, src, dst string, n int) (time.Duration, error) {
	if err := harness.FindCat(ctx, src); err != nil {
		return 0, err
	}
	syscall.Sync()
	d, err := harness.Timed(func() error { _, err := harness.RunCmd(ctx, "cp", "-r", src, dst); return err })
	if err != nil {
		return 0, err
	}
	return d, countFiles(dst, n)
}

// timedPostmark times Debian's postmark on n files of 512 B-16 KiB and
// 4n transactions in a new directory under root.
func timedPostmark(ctx context.Context, root string, n int) (time.Duration, error) {
	dir := filepath.Join(root, "pm")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, err
	}
	syscall.Sync()
	return harness.Timed(func() error {
		if _, err := postmark.Debian(ctx, dir, postmark.Workload{Files: n, Tx: 4 * n, ReadBias: 5, CreateBias: 5}, 16<<10); err != nil {
			return fmt.Errorf("postmark in %s: %w", dir, err)
		}
		return nil
	})
}

// countFiles checks that dir holds n regular files.
func countFiles(dir string, n int) error {
	got := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			got++
		}
		return err
	})
	if err == nil && got != n {
		err = fmt.Errorf("%s holds %d files, want %d", dir, got, n)
	}
	return err
}

// run runs workloads 10-12 with a file of size bytes in tg.
func (b *bigTimes) run(ctx context.Context, tg *treeTarget, size int64) error {
	f := filepath.Join(tg.root, "big")
	dd := func(args ...string) error {
		_, err := harness.RunCmd(ctx, "dd", append([]string{"bs=1M", "status=none"}, args...)...)
		if err == nil {
			err = checkSize(f, size)
		}
		return err
	}
	syscall.Sync()
	var err error
	if b.write, err = harness.Timed(func() error { return dd("if=/dev/zero", "of="+f, fmt.Sprintf("count=%d", size>>20), "conv=fsync") }); err != nil {
		return err
	}
	if err := tg.cold(); err != nil {
		return err
	}
	if b.cold, err = harness.Timed(func() error { return dd("if="+f, "of=/dev/null") }); err != nil {
		return err
	}
	for i := range b.warm {
		if b.warm[i], err = harness.Timed(func() error { return dd("if="+f, "of=/dev/null") }); err != nil {
			return err
		}
	}
	// --invalidate=0: fio would otherwise drop the file's pages first.
	out, err := harness.RunCmd(ctx, "fio", "--name=r", "--filename="+f, "--rw=randread", "--bs=4k", "--ioengine=psync", "--iodepth=1",
		"--runtime=5", "--time_based", fmt.Sprintf("--size=%d", size), "--invalidate=0", "--output-format=json")
	if err != nil {
		return err
	}
	var rep struct {
		Jobs []struct{ Read struct{ IOPS float64 } }
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Jobs) != 1 || rep.Jobs[0].Read.IOPS <= 0 {
		return fmt.Errorf("fio: no IOPS in its report (%v): %s", err, out)
	}
	b.iops = rep.Jobs[0].Read.IOPS
	return nil
}

func checkSize(path string, size int64) error {
	fi, err := os.Stat(path)
	if err == nil && fi.Size() != size {
		err = fmt.Errorf("%s holds %d bytes, want %d", path, fi.Size(), size)
	}
	return err
}

// treeTarget is the directory a round runs in: local, through bindfs, or
// on a hoard mount.
type treeTarget struct {
	root string
	// store makes what was written durable and says how long that took:
	// sync, or a hoard mount's unmount, which stores what its write-back
	// still holds (and a new mount, not timed).
	store func() (time.Duration, error)
	cold  func() error // forgets cached data: the page cache, and a mount's own cache
}

// withTarget makes a fresh target of file system fsys under dir (hoard: a
// new server, and a mount with a cache of cacheSize and flags) and runs fn
// in it.
func withTarget(ctx context.Context, bin, dir, fsys string, cacheSize int64, fn func(*treeTarget) error, flags ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tg := &treeTarget{
		root:  filepath.Join(dir, "mnt"),
		store: func() (time.Duration, error) { return harness.Timed(func() error { syscall.Sync(); return nil }) },
		cold:  func() error { harness.DropCaches(); return nil },
	}
	// Unmounts get a minute of their own, from when they start: ctx may
	// have ended.
	cleanup := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Minute)
	}
	var err error
	switch fsys {
	case "local":
		tg.root = filepath.Join(dir, "local")
		if err = os.Mkdir(tg.root, 0o755); err == nil {
			err = fn(tg)
		}
	case "bindfs":
		back := filepath.Join(dir, "back")
		if err := errors.Join(os.Mkdir(back, 0o755), os.Mkdir(tg.root, 0o755)); err != nil {
			return err
		}
		if _, err := harness.RunCmd(ctx, "bindfs", "--no-allow-other", back, tg.root); err != nil {
			return err
		}
		err = fn(tg)
		cctx, cancel := cleanup()
		_, uerr := harness.RunCmd(cctx, "fusermount3", "-u", tg.root)
		cancel()
		err = cmp.Or(err, uerr)
	case "hoard", "hoard-uring":
		// The same mount, its requests over /dev/fuse or over io_uring.
		flags = append(flags, fmt.Sprint("--io-uring=", fsys == "hoard-uring"))
		addr, _, stop, serr := harness.StartServer(bin, filepath.Join(dir, "server"))
		if serr != nil {
			return serr
		}
		caches := 0
		cache := filepath.Join(dir, "cache0")
		flags = append([]string{"--cache-size", fmt.Sprint(cacheSize)}, flags...)
		// Unmounted by hoardUnmount, which waits for the daemon to exit.
		mounted := false
		mount := func() error {
			_, err := harness.MountCell(bin, addr, tg.root, cache, flags...)
			mounted = err == nil
			return err
		}
		unmount := func(ctx context.Context) error {
			mounted = false
			return hoardUnmount(ctx, bin, tg.root, cache)
		}
		tg.store = func() (time.Duration, error) {
			d, err := harness.Timed(func() error { return unmount(ctx) })
			if err != nil {
				return 0, err
			}
			return d, mount()
		}
		tg.cold = func() error {
			if mounted {
				if err := unmount(ctx); err != nil {
					return err
				}
			}
			caches++
			cache = filepath.Join(dir, fmt.Sprint("cache", caches))
			if err := mount(); err != nil {
				return err
			}
			harness.DropCaches()
			return nil
		}
		if err = mount(); err == nil {
			err = fn(tg)
			if mounted {
				cctx, cancel := cleanup()
				err = cmp.Or(err, unmount(cctx))
				cancel()
			}
		}
		stop()
	}
	// What a round made stays until the bench ends: on ext4, creating
	// files where many were just deleted is slow (it steps over inodes
	// deleted in the last minute), which would make the next round pay
	// for this one.
	return err
}

// hoardUnmount unmounts a mount daemon and waits for it to exit (it
// stores the writes it still holds first); what it logged as errors is an
// error.
func hoardUnmount(ctx context.Context, bin, mnt, cache string) error {
	pid, err := os.ReadFile(filepath.Join(cache, "mount.pid"))
	if err != nil {
		return err
	}
	stat := "/proc/" + strings.TrimSpace(string(pid)) + "/stat"
	if _, err := harness.RunCmd(ctx, bin, "umount", mnt); err != nil {
		return err
	}
	for {
		// Gone, or a zombie nobody reaps.
		b, err := os.ReadFile(stat)
		if err != nil || strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))[0] == "Z" {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the mount daemon of %s has not exited: %w", mnt, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	log, err := os.ReadFile(filepath.Join(cache, "mount.log"))
	if err != nil {
		return err
	}
	var errs []string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "level=ERROR") {
			errs = append(errs, l)
		}
	}
	if errs != nil {
		return fmt.Errorf("the mount of %s logged:\n%s", mnt, strings.Join(errs, "\n"))
	}
	return nil
}

// parseSize reads sizes like 4096, 64M or 1G (powers of 1024).
func parseSize(s string) (int64, error) {
	mult := int64(1)
	if i := strings.IndexAny(s, "KMGT"); i >= 0 && i == len(s)-1 {
		mult, s = 1<<(10*(strings.IndexByte("KMGT", s[i])+1)), s[:i]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err == nil && n <= 0 {
		err = errors.New("not positive")
	}
	return n * mult, err
}

// treeRows are the tree part's workloads: the table's title, the
// figure's, and the time of each in a round.
var treeRows = []struct {
	title, short string
	of           func(*treeTimes) time.Duration
	pm           bool // with hoard --no-delegations
}{
	{"1. cp -r of N files of 1-16 KiB, 100 to a directory", "cp -r, 1-16 KiB, 100 a directory", func(t *treeTimes) time.Duration { return t.cp }, false},
	{"2. storing what 1 wrote: sync (local, bindfs), unmount (hoard: its write-back stores what it holds)", "storing it: sync, or hoard's unmount", func(t *treeTimes) time.Duration { return t.stored }, false},
	{"3. cp -r of N files of 4 KiB in one directory", "cp -r, 4 KiB, one directory", func(t *treeTimes) time.Duration { return t.flat }, false},
	{"4. Debian's postmark, N files of 512 B-16 KiB, 4N transactions (read and create bias 5), whole run", "Debian's postmark, 4N transactions", func(t *treeTimes) time.Duration { return t.pm }, true},
	{"5. cold find -type f | xargs cat of 1's tree (hoard: a new mount, empty cache; page cache dropped)", "cold find | xargs cat", func(t *treeTimes) time.Duration { return t.cold }, false},
	{"6. warm find -type f | xargs cat, best of 3", "warm find | xargs cat", func(t *treeTimes) time.Duration { return t.warm }, false},
	{"7. warm find -printf '%s %T@' (a stat of every file), best of 3", "warm stat of every file", func(t *treeTimes) time.Duration { return t.stat }, false},
	{"8. warm tar cf - . | wc -c, best of 3", "warm tar cf - . | wc -c", func(t *treeTimes) time.Duration { return t.tar }, false},
	{"9. rm -r of 1's tree", "rm -r", func(t *treeTimes) time.Duration { return t.rm }, false},
}

func printTree(ns []int, res map[string]map[int]*treeTimes, bigs map[string]*bigTimes, big int64) {
	fmt.Printf("\n## First workloads: local disk, bindfs, hoard\n\n")
	fmt.Println("Wall-clock seconds, each file system and file count a fresh round (hoard: a new server, mount and cache).")
	fmt.Println("× local: hoard's time over local's (lower is better); growth: hoard's time at N over its time at N/2 (2: linear, 4: quadratic).")
	// at is of's time on fsys at n files, 0 if not run.
	at := func(fsys string, n int, of func(*treeTimes) time.Duration) time.Duration {
		if t := res[fsys][n]; t != nil {
			return of(t)
		}
		return 0
	}
	for _, r := range treeRows {
		fmt.Printf("\n### %s\n\n", r.title)
		head, line := "| N | local s | bindfs s | hoard s | hoard × local | growth |", "|---|---|---|---|---|---|"
		uring := res["hoard-uring"] != nil
		if uring {
			head, line = head+" hoard --io-uring s | io_uring × local | io_uring ÷ /dev/fuse |", line+"---|---|---|"
		}
		if r.pm {
			head, line = head+" hoard --no-delegations s | --no-delegations ÷ delegations |", line+"---|---|"
		}
		fmt.Println(head)
		fmt.Println(line)
		for j, n := range ns {
			h := at("hoard", n, r.of)
			growth := "–"
			if j > 0 && ns[j-1]*2 == n {
				growth = ratio(h, at("hoard", ns[j-1], r.of))
			}
			fmt.Printf("| %d | %s | %s | %s | %s | %s |", n, secs(at("local", n, r.of)), secs(at("bindfs", n, r.of)), secs(h),
				ratio(h, at("local", n, r.of)), growth)
			if uring {
				u := at("hoard-uring", n, r.of)
				fmt.Printf(" %s | %s | %s |", secs(u), ratio(u, at("local", n, r.of)), ratio(u, h))
			}
			if r.pm {
				nd := at("hoard", n, func(t *treeTimes) time.Duration { return t.pmNoDeleg })
				fmt.Printf(" %s | %s |", secs(nd), ratio(nd, h))
			}
			fmt.Println()
		}
	}

	if big == 0 {
		return
	}
	fmt.Printf("\n### 10-12. A file of %s\n\n", harness.Human(big))
	fmt.Println("Rates; × local: hoard's rate over local's (higher is better). Cold: page cache dropped (hoard: a new mount, empty cache).")
	fmt.Println()
	fmt.Println("| measurement | local | bindfs | hoard | hoard × local |")
	fmt.Println("|---|---|---|---|---|")
	mb := func(d time.Duration) float64 { return harness.MBps(big, d) }
	bigRow := func(name string, of func(*bigTimes) []float64) {
		cells := []string{"–", "–", "–", "–"}
		for k, f := range []string{"local", "bindfs", "hoard"} {
			if b := bigs[f]; b != nil {
				cells[k] = join(of(b), "%.0f")
			}
		}
		if bigs["local"] != nil && bigs["hoard"] != nil {
			h, l := of(bigs["hoard"]), of(bigs["local"])
			for k := range h {
				h[k] /= l[k]
			}
			cells[3] = join(h, "%.2f×")
		}
		fmt.Printf("| %s | %s |\n", name, strings.Join(cells, " | "))
	}
	bigRow("sequential write, dd bs=1M conv=fsync (MB/s)", func(b *bigTimes) []float64 { return []float64{mb(b.write)} })
	bigRow("cold sequential read, dd bs=1M (MB/s)", func(b *bigTimes) []float64 { return []float64{mb(b.cold)} })
	bigRow("the next three reads (MB/s)", func(b *bigTimes) []float64 { return []float64{mb(b.warm[0]), mb(b.warm[1]), mb(b.warm[2])} })
	bigRow("warm 4 KiB random reads, fio psync, queue depth 1, 5 s (IOPS)", func(b *bigTimes) []float64 { return []float64{b.iops} })
}

func secs(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f", d.Seconds())
}

// ratio is a/b, or a dash if either was not measured.
func ratio(a, b time.Duration) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a.Seconds()/b.Seconds())
}

func join(v []float64, format string) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(s, ", ")
}

// tripTimes is one FUSE file system's request round trip: the caller on
// the CPU its daemon runs on, and on another.
type tripTimes struct{ same, other time.Duration }

// roundTrips measures, on a fresh target of each FUSE file system of fss,
// what one request costs: the mean of getxattr calls the daemon answers
// (ENODATA), with the daemon's threads held to CPU 0 and the caller on
// CPU 0, then on CPU 1. A machine where waking a thread on another CPU is
// dear (a virtual machine's inter-processor interrupts) shows it here.
func (c *Config) roundTrips(bin, dir string, fss []string) (map[string]tripTimes, error) {
	out := map[string]tripTimes{}
	if runtime.NumCPU() < 2 {
		return out, nil
	}
	for _, f := range fss {
		if f == "local" {
			continue
		}
		err := c.inRound(f+", round trips", func(ctx context.Context) error {
			return withTarget(ctx, bin, filepath.Join(dir, "trip-"+f), f, 1<<30, func(tg *treeTarget) error {
				path := filepath.Join(tg.root, "f")
				if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
					return err
				}
				pid, err := daemonOf(tg.root)
				if err != nil {
					return err
				}
				// Over io_uring each CPU's requests are served on it: the
				// daemon's ring threads hold themselves to their CPUs.
				if f != "hoard-uring" {
					if _, err := harness.RunCmd(ctx, "taskset", "-a", "-p", "-c", "0", strconv.Itoa(pid)); err != nil {
						return err
					}
					defer harness.RunCmd(ctx, "taskset", "-a", "-p", "-c", fmt.Sprintf("0-%d", runtime.NumCPU()-1), strconv.Itoa(pid))
				}
				t := tripTimes{same: tripOn(0, path), other: tripOn(1, path)}
				out[f] = t
				return nil
			})
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// tripOn is the mean time of a getxattr of path from a thread held to cpu:
// of a trusted.* name, which hoard answers without asking its server (and
// bindfs with one getxattr of the file under it).
func tripOn(cpu int, path string) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was, one unix.CPUSet
	unix.SchedGetaffinity(0, &was)
	one.Set(cpu)
	unix.SchedSetaffinity(0, &one)
	defer unix.SchedSetaffinity(0, &was)
	const n = 20000
	buf := make([]byte, 64)
	start := time.Now()
	for range n {
		unix.Getxattr(path, "trusted.hoard-bench", buf)
	}
	return time.Since(start) / n
}

// daemonOf is the process serving the FUSE mount at mnt: the one that
// has it among its arguments (the mount's parent has exited).
func daemonOf(mnt string) (int, error) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if err == nil && slices.Contains(args[1:], mnt) {
			return strconv.Atoi(filepath.Base(filepath.Dir(p)))
		}
	}
	return 0, fmt.Errorf("no process serves %s", mnt)
}

func printTrips(trips map[string]tripTimes) {
	if len(trips) == 0 {
		return
	}
	fmt.Printf("\n### A FUSE request's round trip\n\n")
	fmt.Println("Mean of 20,000 getxattr calls the daemon answers, its threads held to CPU 0 (over io_uring: each CPU's to it); µs.")
	fmt.Println()
	fmt.Println("| file system | caller on CPU 0 | caller on CPU 1 |")
	fmt.Println("|---|---|---|")
	for _, f := range []string{"bindfs", "hoard", "hoard-uring"} {
		if t, ok := trips[f]; ok {
			fmt.Printf("| %s | %.1f | %.1f |\n", f, harness.Micros(t.same), harness.Micros(t.other))
		}
	}
}
