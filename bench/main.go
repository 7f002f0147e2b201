// Command bench measures hoard against baselines taken in the same run on
// the same machine (the local file system, bindfs, raw loopback TCP,
// hoard with a feature off), one part per workload, and prints tables
// with the ratios. With -charts, the parts with headline comparisons
// also save them as figures (package chart).
//
// The parts all runs, which share the one server started here, are in
// this package; the others are in packages under bench/ (tree,
// postmark, proxy...), so that each stays small enough to read, and what
// they all use is package harness.
//
// Usage: go run ./bench [-only PART,...] [-charts DIR] [-size 1G] [-files 10000] [-dir DIR]
// (make bench builds the hoard binary first, passes it in HOARD_BIN and
// saves the figures of docs/benchmarks.md in docs/charts).
package main

import (
	"cmp"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hoardfs/hoard/bench/build"
	"github.com/hoardfs/hoard/bench/cell"
	"github.com/hoardfs/hoard/bench/chart"
	"github.com/hoardfs/hoard/bench/hades"
	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/bench/nache"
	"github.com/hoardfs/hoard/bench/postmark"
	"github.com/hoardfs/hoard/bench/proxy"
	"github.com/hoardfs/hoard/bench/secure"
	"github.com/hoardfs/hoard/bench/tree"
)

var (
	sizeFlag  = flag.Int64("size", 1<<30, "bytes in the large file")
	filesFlag = flag.Int("files", 10000, "number of small files")
	smallFlag = flag.Int("small", 4096, "bytes in each small file")
	dirFlag   = flag.String("dir", "", "scratch directory on the disk to measure (default: a temp dir under the current directory)")
	readSize  = flag.Int("read", 1<<20, "read size for the large file")
	profile   = flag.String("cpuprofile", "", "write a CPU profile of the disk-cache cold fetches here")
	only      = flag.String("only", "all", "which parts to run, separated by commas: lib (the library), fuse (the mount), split (Selective Caching's Tables 3 and 4), stat (stat latency during a bulk fetch), mixed (admission policies on a mixed workload), postmark (the cacheDAFS thesis's Postmark, delegations on and off; not in all), proxy (clients of a proxy vs of a distant origin; not in all), hades (the Hades thesis's figures 6.1-6.3, the proxy's store layouts; not in all), build (compiling a C tree from mounts, direct and through a proxy; not in all), nache (clients' scratch files through a proxy, its delegations on and off; not in all), tree (cp -r, postmark, find | xargs cat, tar, rm -r, dd and fio on local disk, bindfs and hoard at doubling file counts; not in all), secure (TLS, tokens and ACLs vs --insecure; not in all), cell (the location database up to 100,000 volumes; not in all), move (moving a volume between servers; not in all), release (releasing a volume to read-only sites; not in all), all (lib, fuse, split, stat and mixed); or charts alone, which runs nothing and draws the figures saved in -charts again")
	statSize  = flag.Int64("stat-size", 4<<30, "bytes fetched while stat latency is measured")
	streams   = flag.Int("streams", 0, "data-channel connections per client (0: the client's default)")
	chartsDir = flag.String("charts", "", "save each part's headline figures in this directory, as JSON and SVG (make bench: docs/charts); with -only charts, draw the saved figures again from their JSON")
)

// The flags of the parts in packages of their own.
var (
	pmCfg    = postmark.Flags(flag.CommandLine)
	treeCfg  = tree.Flags(flag.CommandLine)
	pxCfg    = proxy.Flags(flag.CommandLine)
	hadesCfg = hades.Flags(flag.CommandLine)
	buildCfg = build.Flags(flag.CommandLine)
	nacheCfg = nache.Flags(flag.CommandLine)
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// parts are the parts -only can name, and what each runs.
var parts = map[string]func(*harness.Env) error{
	"lib":      libBench,
	"fuse":     fuseBench,
	"split":    splitBench,
	"stat":     statBench,
	"mixed":    mixedBench,
	"postmark": func(e *harness.Env) error { return postmark.Run(e, pmCfg) },
	"proxy":    func(e *harness.Env) error { return proxy.Run(e, pxCfg) },
	"hades":    func(e *harness.Env) error { return hades.Run(e, hadesCfg, pxCfg.Data) },
	"build":    func(e *harness.Env) error { return build.Run(e, buildCfg, pxCfg.Data) },
	"nache":    func(e *harness.Env) error { return nache.Run(e, nacheCfg) },
	"tree":     func(e *harness.Env) error { return tree.Run(e, treeCfg) },
	"secure": func(e *harness.Env) error {
		return secure.Run(e, postmark.Workload{Files: pmCfg.Files, Tx: pmCfg.Tx, ReadBias: 5, CreateBias: 5})
	},
	"cell":    cell.Run,
	"move":    cell.Move,
	"release": cell.Release,
}

// toolsOf are the programs part runs that a machine may lack.
func toolsOf(part string) []string {
	switch part {
	case "tree":
		t := []string{"postmark", "fio", "taskset"}
		if strings.Contains(treeCfg.FS, "bindfs") {
			t = append(t, "bindfs", "fusermount3")
		}
		return t
	case "postmark":
		return []string{"postmark"}
	case "build":
		return []string{"gcc"}
	}
	return nil
}

// haveTools checks, before any part starts, that the programs the parts
// run are installed, and names the Debian packages that have the
// missing ones.
func haveTools(todo []string) error {
	debian := map[string]string{"fusermount3": "fuse3", "taskset": "util-linux"}
	var missing, pkgs []string
	for _, p := range todo {
		for _, t := range toolsOf(p) {
			if _, err := exec.LookPath(t); err != nil && !slices.Contains(missing, t) {
				missing = append(missing, t)
				pkgs = append(pkgs, cmp.Or(debian[t], t))
			}
		}
	}
	if missing != nil {
		return fmt.Errorf("%s not installed (Debian: apt-get install %s)", strings.Join(missing, ", "), strings.Join(pkgs, " "))
	}
	return nil
}

// allParts are the parts "all" runs.
var allParts = []string{"lib", "fuse", "split", "stat", "mixed"}

func run() error {
	var todo []string
	for _, p := range strings.Split(*only, ",") {
		switch {
		case p == "all":
			todo = append(todo, allParts...)
		case p == "charts" && *only == "charts":
		case parts[p] == nil:
			names := slices.Sorted(maps.Keys(parts))
			return fmt.Errorf("-only %q: want parts separated by commas, each one of %s or all; or charts alone", *only, strings.Join(names, ", "))
		default:
			todo = append(todo, p)
		}
	}
	if *only == "charts" {
		if *chartsDir == "" {
			return fmt.Errorf("-only charts: name the figures' directory with -charts")
		}
		drawn, err := chart.RenderDir(*chartsDir)
		for _, d := range drawn {
			fmt.Println("drew", d)
		}
		return err
	}
	if err := haveTools(todo); err != nil {
		return err
	}
	bin := os.Getenv("HOARD_BIN")
	if bin == "" {
		return fmt.Errorf("set HOARD_BIN to a built hoard binary (make bench does)")
	}
	scratch := *dirFlag
	if scratch == "" {
		wd, _ := os.Getwd()
		d, err := os.MkdirTemp(wd, ".bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		scratch = d
	}
	addr, serverPID, stop, err := harness.StartServer(bin, filepath.Join(scratch, "server"))
	if err != nil {
		return err
	}
	defer stop()
	e := &harness.Env{Bin: bin, Scratch: scratch, Addr: addr, ServerPID: serverPID,
		Size: *sizeFlag, Files: *filesFlag, Small: *smallFlag, ReadSize: *readSize, Charts: *chartsDir}
	flag.Visit(func(f *flag.Flag) {
		if f.Name != "charts" {
			e.Args = append(e.Args, "-"+f.Name+" "+f.Value.String())
		}
	})
	fmt.Printf("# hoard benchmark, %s\n\nmachine: %s\n", time.Now().Format("2006-01-02"), harness.MachineInfo())
	for _, p := range todo {
		if err := parts[p](e); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}
