package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/spf13/pflag"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/mount"
)

// The cache commands that act on files (ls, warmup, evict, flush) talk to
// the mount holding them, through the extended attributes of package
// mount's ctl.go, or (ls, warmup, evict) with --server to the cell, on a
// cache directory no mount holds (cacheat.go); stats and lost read the
// cache directory.

func cacheCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cache", Short: "inspect, warm and empty the client cache"}
	cmd.AddCommand(cacheStatsCmd(), cacheLostCmd(), policyCmd(), cacheLsCmd(), warmupCmd(), evictCmd(), flushCmd())
	return cmd
}

func cacheStatsCmd() *cobra.Command {
	var dir string
	var asJSON bool
	var watch time.Duration
	cmd := &cobra.Command{Use: "stats [--cache DIR] [--json] [--watch 1s]", Short: "hits, misses, bytes fetched and cached, chunks, callbacks", Args: cobra.NoArgs,
		Example: "  hoard cache stats --cache /var/cache/hoard\n  hoard cache stats --watch 1s    # live rates, as top shows, until Ctrl-C\n  hoard cache stats --json | jq .hits",
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usagef("--cache DIR is required")
			}
			if _, err := os.Stat(dir); err != nil {
				return usagef("cache directory %s: %v", dir, err)
			}
			read := func() (cache.Stats, error) {
				s, err := cache.ReadStats(dir)
				if err != nil {
					return s, fmt.Errorf("cache directory %s: %w", dir, err)
				}
				return s, nil
			}
			s, err := read()
			if err != nil {
				return err
			}
			switch {
			case watch > 0:
				return watchStats(cmd.Context(), s, read, watch, asJSON)
			case asJSON:
				return json.NewEncoder(os.Stdout).Encode(s)
			}
			printCacheStats(s)
			return nil
		}}
	cmd.Flags().StringVar(&dir, "cache", defaultCacheDir(), "cache directory")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the counters as JSON (with --watch: one object a line)")
	cmd.Flags().DurationVar(&watch, "watch", 0, "show rates every interval until interrupted (e.g. 1s)")
	return cmd
}

// watchStats shows, every interval until interrupted, what changed in it:
// a live view of the cache as juicefs stats gives of its own.
func watchStats(ctx context.Context, prev cache.Stats, read func() (cache.Stats, error), every time.Duration, asJSON bool) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	tty := term.IsTerminal(int(os.Stdout.Fd()))
	rows := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s, err := read()
		if err != nil {
			return err
		}
		secs := every.Seconds()
		rate := func(now, then int64) float64 { return float64(now-then) / secs }
		if asJSON {
			json.NewEncoder(os.Stdout).Encode(map[string]any{
				"time": time.Now().Format(time.RFC3339), "stats": s,
				"hits_per_s": rate(s.Hits, prev.Hits), "misses_per_s": rate(s.Misses, prev.Misses),
				"fetched_bytes_per_s": rate(s.BytesFetched, prev.BytesFetched), "written_bytes_per_s": rate(s.BytesWritten, prev.BytesWritten),
			})
			prev = s
			continue
		}
		if rows%20 == 0 {
			fmt.Println("time      hits/s  miss/s  hit%   fetched/s  written/s  cached    dirty     deleg r/w  callbacks")
		}
		rows++
		hits, misses := s.Hits-prev.Hits, s.Misses-prev.Misses
		ratio := "-"
		if hits+misses > 0 {
			ratio = fmt.Sprintf("%.0f", 100*float64(hits)/float64(hits+misses))
		}
		fmt.Printf("%s  %6.0f  %6.0f  %4s  %9s  %9s  %-8s  %-8s  %4d/%-4d  %d\n", time.Now().Format("15:04:05"),
			rate(s.Hits, prev.Hits), rate(s.Misses, prev.Misses), ratio,
			humanSize(uint64(max(0, rate(s.BytesFetched, prev.BytesFetched))))+"/s", humanSize(uint64(max(0, rate(s.BytesWritten, prev.BytesWritten))))+"/s",
			humanSize(uint64(s.BytesCached)), humanSize(uint64(s.Gauges["dirty_bytes"])),
			s.Gauges["delegations_read"], s.Gauges["delegations_write"], s.Gauges["callbacks"])
		if !tty {
			os.Stdout.Sync()
		}
		prev = s
	}
}

func cacheLostCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{Use: "lost [--cache DIR]", Short: "list writes that could not be delivered to the server", Args: cobra.NoArgs,
		Example: "  hoard cache lost\n  hoard cache lost rm 1795867840107229661-1.3.3\n  hoard cache lost restore 1795867840107229661-1.3.3 --server files:7100",
		RunE: func(cmd *cobra.Command, args []string) error {
			ls, err := lost.List(dir)
			if err != nil {
				return err
			}
			if len(ls) == 0 {
				fmt.Println("no lost writes")
				return nil
			}
			for _, l := range ls {
				data := "data " + l.Data
				if l.Sealed {
					data = "encrypted with the key of the mount that kept it (--cache-encrypt): readable by that process alone"
				}
				fmt.Printf("%s  %s  %s  fid %s  %d range(s)  %s\n    error: %s\n", l.ID, l.Time.Format(time.RFC3339), l.Path, l.FID, len(l.Ranges), data, l.Error)
			}
			fmt.Println("(hoard cache lost restore ID stores one again; hoard cache lost rm ID discards it)")
			return nil
		}}
	cmd.PersistentFlags().StringVar(&dir, "cache", defaultCacheDir(), "cache directory")
	rm := &cobra.Command{Use: "rm ID... | --all", Short: "discard lost writes", Example: "  hoard cache lost rm --all",
		RunE: func(cmd *cobra.Command, args []string) error {
			all, _ := cmd.Flags().GetBool("all")
			if all == (len(args) > 0) {
				return usagef("needs the IDs hoard cache lost lists, or --all")
			}
			if all {
				ls, err := lost.List(dir)
				if err != nil {
					return err
				}
				for _, l := range ls {
					args = append(args, l.ID)
				}
			}
			var errs []error
			for _, id := range args {
				if err := lost.Remove(dir, id); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Printf("discarded %s\n", id)
			}
			return failures(errs, "records")
		}}
	rm.Flags().Bool("all", false, "discard every record")
	cmd.AddCommand(rm, lostRestoreCmd(&dir))
	return cmd
}

// lostRestoreCmd stores lost writes again: onto the file they belonged to,
// or another, as the store that failed would have (its truncation, its
// ranges, its size), synced; the record goes once they are stored.
func lostRestoreCmd(dir *string) *cobra.Command {
	var to string
	cmd := withAdmin("restore ID", "store lost writes again, onto their file or --to another", cobra.ExactArgs(1),
		func(f *pflag.FlagSet) {
			f.StringVar(&to, "to", "", "the file to store them onto (default: the path they belonged to)")
		},
		func(c *pathfs.FS, args []string) error {
			r, err := lost.Get(*dir, args[0])
			if err != nil {
				return err
			}
			if r.Sealed {
				return fmt.Errorf("lost writes %s are encrypted with the key of the mount that kept them (--cache-encrypt), which only that process held: they cannot be read (hoard cache lost rm %s discards them)", r.ID, r.ID)
			}
			dest := cmp.Or(to, r.Path)
			if !strings.HasPrefix(dest, "/") {
				return fmt.Errorf("lost writes %s belonged to %q, not a path in the cell: say where with --to", r.ID, dest)
			}
			n, err := restoreLost(c, r, dest)
			if err != nil {
				return fmt.Errorf("restore %s onto %s: %w", r.ID, dest, err)
			}
			fmt.Printf("stored %s of lost writes onto %s\n", humanSize(uint64(n)), dest)
			return lost.Remove(*dir, r.ID)
		})
	cmd.Example = "  hoard cache lost restore 1795867840107229661-1.3.3 --to /home/me/recovered.txt"
	// --cache names the cache whose lost writes these are, as for hoard
	// cache lost; the client itself keeps a memory cache (withAdmin), so
	// that a mount holding that cache is no obstacle.
	cache := cmd.Flags().Lookup("cache")
	cache.Hidden, cache.Usage, cache.DefValue = false, "cache directory whose lost writes to restore", defaultCacheDir()
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if cache.Changed {
			*dir = cache.Value.String()
		}
		cache.Value.Set("")
		return run(cmd, args)
	}
	return cmd
}

// restoreLost applies r to the file dest, synced, and returns the bytes
// written.
func restoreLost(c *pathfs.FS, r lost.Record, dest string) (int64, error) {
	data, err := os.Open(r.Data)
	if err != nil {
		return 0, err
	}
	defer data.Close()
	f, err := c.Open(dest, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if r.Truncate != nil {
		if err := f.Truncate(int64(*r.Truncate)); err != nil {
			return 0, err
		}
	}
	n, err := lost.CopyRanges(r.Ranges, func(p []byte, off int64) error {
		if _, err := data.ReadAt(p, off); err != nil && err != io.EOF {
			return err
		}
		return nil
	}, func(p []byte, off int64) error {
		_, err := f.WriteAt(p, off)
		return err
	})
	if err != nil {
		return n, err
	}
	if err := f.Truncate(r.Size); err != nil {
		return n, err
	}
	if err := f.Sync(); err != nil {
		return n, err
	}
	return n, f.Close()
}

// ctlBuf is large enough for any control attribute's value (the kernel
// bounds one at 64 KiB): one getxattr call, no size probe that a
// changing value could outgrow.
const ctlBuf = 64 << 10

// The system calls of getCtl and setCtl (tests interrupt them).
var (
	getxattr = unix.Getxattr
	setxattr = unix.Setxattr
)

// getCtl reads a control attribute of path into buf. A signal to this
// process (the Go runtime's preemption, most often) interrupts the call
// (EINTR, the mount is told to stop): it is asked again.
func getCtl(path, attr string, buf []byte) (int, error) {
	for {
		n, err := getxattr(path, attr, buf)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// setCtl sets a control attribute of path, asking again when a signal
// interrupted it (as getCtl) unless ctx is done: Ctrl-C.
func setCtl(ctx context.Context, path, attr string, value []byte) error {
	for {
		err := setxattr(path, attr, value, 0)
		if err != unix.EINTR || ctx.Err() != nil {
			return err
		}
	}
}

// fileCache asks the mount holding path what its cache holds of it.
func fileCache(path string) (client.FileCache, error) {
	var fc client.FileCache
	buf := make([]byte, ctlBuf)
	n, err := getCtl(path, mount.CacheXattr, buf)
	if err != nil {
		return fc, ctlErr(path, err)
	}
	if err := json.Unmarshal(buf[:n], &fc); err != nil {
		return fc, fmt.Errorf("%s: the mount's answer: %v", path, err)
	}
	return fc, nil
}

// ctlErr says what a failed control call on path means to a person.
func ctlErr(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP):
		return fmt.Errorf("%s: not on a hoard mount", path)
	case errors.Is(err, unix.ENOSPC):
		return fmt.Errorf("%s: the cache is full (what is left is dirty or in use); not all of it was cached", path)
	case errors.Is(err, unix.EINTR):
		return fmt.Errorf("%s: interrupted", path)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("%s: %v", path, err)
}

// filesUnder is the regular files the paths name: each path's own, or
// with recursive those in the trees of directories. A path that cannot be
// listed is a failure of its own, reported with the others.
func filesUnder(paths []string, recursive bool) (files []string, failed []error) {
	for _, p := range paths {
		st, err := os.Stat(p)
		switch {
		case err != nil:
			failed = append(failed, ctlErr(p, err))
		case st.Mode().IsRegular():
			files = append(files, p)
		case !st.IsDir():
		case !recursive:
			ents, err := os.ReadDir(p)
			if err != nil {
				failed = append(failed, ctlErr(p, err))
			}
			for _, e := range ents {
				if e.Type().IsRegular() {
					files = append(files, filepath.Join(p, e.Name()))
				}
			}
		default:
			err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
				if err != nil {
					failed = append(failed, ctlErr(path, err))
					return nil
				}
				if d.Type().IsRegular() {
					files = append(files, path)
				}
				return nil
			})
			if err != nil {
				failed = append(failed, ctlErr(p, err))
			}
		}
	}
	return files, failed
}

// failures prints errs, one a line, and is the command's error, a count
// of them, when there were any.
func failures(errs []error, what string) error {
	for _, err := range errs {
		fmt.Fprintln(os.Stderr, "hoard: "+err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d %s failed", len(errs), what)
	}
	return nil
}

func cacheLsCmd() *cobra.Command {
	var recursive, asJSON bool
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "ls PATH... [-r] [--json]",
		Short: "per file: bytes and chunks cached, dirty bytes, policy and the rule that chose it, callback time left",
		Example: "  hoard cache ls /mnt/hoard/data\n" +
			"  hoard cache ls -r /mnt/hoard/src --json | jq 'select(.policy == \"bypass\")'\n" +
			"  hoard cache ls --server fs1:7100 --cache /var/cache/hoard /data    # a cache no mount holds",
		Args: cobra.MatchAll(cobra.MinimumNArgs(1), nonEmpty),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCacheAt(cmd, &cf, func(at cacheAt) error { return cacheLs(at, args, recursive, asJSON) })
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "list the files of directories' whole trees")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object a file")
	offMountFlags(cmd, &cf)
	return cmd
}

// offMountFlags adds the flags of a cache command that acts on a cache
// directory through the cell when --server is given.
func offMountFlags(cmd *cobra.Command, cf *clientFlags) {
	cf.add(cmd.Flags())
	cmd.Flags().Lookup("server").Usage = "act on the cache directory --cache, which no mount holds, with PATHs in the cell at this server (default: PATHs on a mount, and its cache)"
	for _, name := range []string{"no-delegations", "no-dir-delegations"} {
		cmd.Flags().MarkHidden(name)
	}
}

func cacheLs(at cacheAt, args []string, recursive, asJSON bool) error {
	files, failed := at.files(args, recursive)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	enc := json.NewEncoder(os.Stdout)
	if !asJSON {
		fmt.Fprintln(tw, "CACHED\tSIZE\tCHUNKS\tDIRTY\tPOLICY\tPROMISE\tDELEG\tPATH\tWHY")
	}
	for _, f := range files {
		fc, err := at.info(f)
		if err != nil {
			failed = append(failed, err)
			continue
		}
		if asJSON {
			enc.Encode(struct {
				Path string `json:"path"`
				client.FileCache
			}{f, fc})
			continue
		}
		promise := "-"
		if fc.PromiseMs > 0 {
			promise = (time.Duration(fc.PromiseMs) * time.Millisecond).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\n", humanSize(uint64(fc.Cached)), humanSize(uint64(fc.Size)),
			fc.Chunks, fc.ChunksTotal, humanSize(uint64(fc.Dirty)), fc.Policy, promise, orDash(fc.Delegation), f, fc.Why)
	}
	tw.Flush()
	return failures(failed, "files")
}

// warmReport is what a warmup did.
type warmReport struct {
	Files    int      `json:"files"`
	Bytes    int64    `json:"bytes"`
	Already  int      `json:"already_cached"`
	Bypassed []string `json:"bypassed,omitempty"`
	Failed   []string `json:"failed,omitempty"`
	Seconds  float64  `json:"seconds"`
	// Interrupted: Ctrl-C stopped it; running it again goes on where it
	// stopped (what came stays cached).
	Interrupted bool `json:"interrupted,omitempty"`
}

func warmupCmd() *cobra.Command {
	var recursive, force, asJSON bool
	var parallel int
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "warmup PATH... [-r] [--parallel N] [--force] [--json]",
		Short: "fetch whole files into a mount's cache (or, with --server, a cache directory), with progress; run again to resume",
		Long: "Fetches the files into the mount's cache, so that reading them later costs no trip to the server.\n" +
			"Files already cached are skipped, so an interrupted warmup resumes where it stopped.\n" +
			"A file whose policy bypasses the cache is reported, not cached; --force caches it\n" +
			"(setting the file's policy to cache where a rule, not auto, chose bypass: hoard cache policy PATH auto undoes it).\n" +
			"With --server, PATHs are in the cell and the files go into the cache directory --cache, which no mount may hold:\n" +
			"a mount started on it later reads them from there.",
		Example: "  hoard cache warmup -r /mnt/hoard/toolchain\n" +
			"  hoard cache warmup --parallel 8 /mnt/hoard/data/*.parquet\n" +
			"  hoard cache warmup -r --json /mnt/hoard/models > warm.json\n" +
			"  hoard cache warmup -r --server fs1:7100 --cache /var/cache/hoard /toolchain    # before the mount starts",
		Args: cobra.MatchAll(cobra.MinimumNArgs(1), nonEmpty),
		RunE: func(cmd *cobra.Command, args []string) error {
			if parallel < 1 {
				return usagef("--parallel %d: want 1 or more", parallel)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var rep warmReport
			var errs []error
			err := withCacheAt(cmd, &cf, func(at cacheAt) error {
				rep, errs = warmup(ctx, at, args, recursive, force, parallel, !asJSON && term.IsTerminal(int(os.Stderr.Fd())))
				return nil
			})
			if err != nil {
				return err
			}
			if asJSON {
				json.NewEncoder(os.Stdout).Encode(rep)
			} else {
				for _, p := range rep.Bypassed {
					fmt.Printf("bypassed, not cached: %s (--force caches it)\n", p)
				}
				fmt.Printf("warmed %d files, %s in %.1fs; %d were cached already", rep.Files, humanSize(uint64(rep.Bytes)), rep.Seconds, rep.Already)
				if n := len(rep.Bypassed); n > 0 {
					fmt.Printf("; %d bypassed", n)
				}
				if n := len(rep.Failed); n > 0 {
					fmt.Printf("; %d failed", n)
				}
				fmt.Println()
				if rep.Interrupted {
					fmt.Println("interrupted: run it again to go on (what was fetched stays cached)")
				}
			}
			if rep.Interrupted && len(errs) == 0 {
				return errors.New("interrupted")
			}
			return failures(errs, "files")
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "warm directories' whole trees")
	cmd.Flags().BoolVar(&force, "force", false, "cache files whose policy bypasses the cache too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON, and no progress bar")
	cmd.Flags().IntVar(&parallel, "parallel", 4, "files fetched at once")
	offMountFlags(cmd, &cf)
	return cmd
}

// warmup warms the files under paths, parallel at a time, with a
// progress bar on stderr when bar is set.
func warmup(ctx context.Context, at cacheAt, paths []string, recursive, force bool, parallel int, bar bool) (warmReport, []error) {
	start := time.Now()
	var rep warmReport
	files, errs := at.files(paths, recursive)
	type job struct {
		path string
		had  int64 // bytes cached before
		size int64
	}
	var jobs []job
	var total, room int64
	for _, f := range files {
		fc, err := at.info(f)
		switch {
		case err != nil:
			errs = append(errs, err)
			continue
		case fc.Cached >= fc.Size:
			rep.Already++
			continue
		case fc.Policy == "bypass" && !force:
			rep.Bypassed = append(rep.Bypassed, f)
			continue
		case fc.Policy == "bypass" && !fc.Probation:
			// A rule, not auto, bypasses it: reads would go past what a
			// warmup caches, unless the file's own policy says cache.
			if err := at.cacheIt(ctx, f); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if room == 0 {
			room = fc.CacheSize
		}
		if need := fc.Size - fc.Cached; total+need > room {
			// Warming it would evict the files warmed before it.
			errs = append(errs, fmt.Errorf("%s: not warmed: the files to warm outgrow the cache (%s)", f, humanSize(uint64(room))))
			continue
		}
		total += fc.Size - fc.Cached
		jobs = append(jobs, job{f, fc.Cached, fc.Size})
	}
	var pb *progressbar.ProgressBar
	if bar && len(jobs) > 0 {
		pb = progressbar.NewOptions64(total, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowBytes(true),
			progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(true), progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
	}
	var (
		mu       sync.Mutex
		done     int64                // bytes of files finished
		inFlight = map[string]int64{} // path → bytes cached when it began
		finished atomic.Int64
	)
	progress := func() {
		if pb == nil {
			return
		}
		mu.Lock()
		sum := done
		flying := make(map[string]int64, len(inFlight))
		for p, had := range inFlight {
			flying[p] = had
		}
		mu.Unlock()
		for p, had := range flying {
			if fc, err := at.info(p); err == nil {
				sum += max(0, fc.Cached-had)
			}
		}
		pb.Describe(fmt.Sprintf("%d/%d files", finished.Load(), len(jobs)))
		pb.Set64(min(sum, total))
	}
	work := make(chan job)
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				mu.Lock()
				inFlight[j.path] = j.had
				mu.Unlock()
				err := at.warm(ctx, j.path)
				mu.Lock()
				delete(inFlight, j.path)
				if err != nil {
					errs = append(errs, err)
					rep.Failed = append(rep.Failed, j.path)
				} else {
					done += j.size - j.had
					rep.Files++
					rep.Bytes += j.size - j.had
				}
				mu.Unlock()
				finished.Add(1)
			}
		}()
	}
	ticker := time.NewTicker(250 * time.Millisecond)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-ticker.C:
				progress()
			case <-ctx.Done():
				return
			}
		}
	}()
feed:
	for _, j := range jobs {
		select {
		case work <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		// The files being fetched stop where they are (a mount's as the
		// process ends: the kernel interrupts their requests); what came
		// stays.
		rep.Interrupted = true
		if at.waits() {
			<-waited
		}
	}
	ticker.Stop()
	if !rep.Interrupted {
		progress()
		if pb != nil {
			pb.Finish()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	rep.Seconds = time.Since(start).Seconds()
	return rep, append([]error(nil), errs...)
}

func evictCmd() *cobra.Command {
	var recursive bool
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "evict PATH... [-r]",
		Short: "drop files from a mount's cache, or with --server a cache directory's (writes not yet stored stay)",
		Example: "  hoard cache evict /mnt/hoard/data/big.iso\n  hoard cache evict -r /mnt/hoard/scratch\n" +
			"  hoard cache evict -r --server fs1:7100 --cache /var/cache/hoard /scratch    # a cache no mount holds",
		Args: cobra.MatchAll(cobra.MinimumNArgs(1), nonEmpty),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withCacheAt(cmd, &cf, func(at cacheAt) error { return evict(cmd.Context(), at, args, recursive) })
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "evict directories' whole trees")
	offMountFlags(cmd, &cf)
	return cmd
}

func evict(ctx context.Context, at cacheAt, args []string, recursive bool) error {
	files, errs := at.files(args, recursive)
	var n int
	var bytes, kept int64
	for _, f := range files {
		fc, err := at.info(f)
		if err == nil {
			err = at.evict(ctx, f)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n++
		bytes += max(0, fc.Cached-fc.Dirty)
		kept += fc.Dirty
	}
	fmt.Printf("evicted %s from %d files", humanSize(uint64(bytes)), n)
	if kept > 0 {
		fmt.Printf("; kept %s of writes not yet stored (hoard cache flush stores them)", humanSize(uint64(kept)))
	}
	fmt.Println()
	return failures(errs, "files")
}

func flushCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "flush MOUNTPOINT",
		Short:   "store every write a mount holds now, and report what was stored",
		Example: "  hoard cache flush /mnt/hoard",
		Args:    cobra.MatchAll(cobra.ExactArgs(1), nonEmpty),
		RunE: func(cmd *cobra.Command, args []string) error {
			mp := args[0]
			dirty := func() (mount.DirtyReport, map[string]int64, error) {
				var r mount.DirtyReport
				buf := make([]byte, ctlBuf)
				n, err := getCtl(mp, mount.DirtyXattr, buf)
				if err != nil {
					return r, nil, ctlErr(mp, err)
				}
				if err := json.Unmarshal(buf[:n], &r); err != nil {
					return r, nil, fmt.Errorf("%s: the mount's answer: %v", mp, err)
				}
				m := map[string]int64{}
				for _, f := range r.Largest {
					m[f.Path] = f.Dirty
				}
				return r, m, nil
			}
			before, was, err := dirty()
			if err != nil {
				return err
			}
			if err := setCtl(cmd.Context(), mp, mount.FlushXattr, nil); err != nil {
				return ctlErr(mp, err)
			}
			after, left, err := dirty()
			if err != nil {
				return err
			}
			refused := map[string]bool{}
			var refusedBytes int64
			var errs []error
			for _, r := range after.Refused {
				refused[r.Path] = true
				refusedBytes += r.Dirty
				errs = append(errs, fmt.Errorf("%s: %s refused by the server and kept in lost/ (hoard cache lost): %s", r.Path, humanSize(uint64(r.Dirty)), r.Err))
			}
			for _, f := range before.Largest {
				if b := f.Dirty - left[f.Path]; b > 0 && !refused[f.Path] {
					fmt.Printf("stored %s  %s\n", humanSize(uint64(b)), f.Path)
				}
			}
			if more := before.Files - len(before.Largest); more > 0 {
				fmt.Printf("(and %d smaller files)\n", more)
			}
			fmt.Printf("stored %s of %d files\n", humanSize(uint64(max(0, before.Bytes-after.Bytes-refusedBytes))),
				max(0, before.Files-after.Files-len(after.Refused)))
			for _, f := range after.Largest {
				if _, ok := was[f.Path]; ok {
					errs = append(errs, fmt.Errorf("%s: %s not stored yet (the server may be unreachable; hoard cache lost lists writes given up on)", f.Path, humanSize(uint64(f.Dirty))))
				}
			}
			return failures(errs, "stores")
		},
	}
}
