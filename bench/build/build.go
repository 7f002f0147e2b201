// Package build is bench's build part: a generated C tree compiled from
// hoard mounts, straight from a distant origin and through a proxy.
package build

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/bench/proxy"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/proxystore"
)

// Config is the build part's flags.
type Config struct {
	Files, Jobs int    // -build-files, -build-jobs
	Include     string // -build-include
}

// Flags defines the -build-* flags on fs and returns what they set.
func Flags(fs *flag.FlagSet) *Config {
	c := &Config{}
	fs.IntVar(&c.Files, "build-files", 300, "build: C files in the generated source tree")
	fs.IntVar(&c.Jobs, "build-jobs", 2, "build: gcc processes at a time per client")
	fs.StringVar(&c.Include, "build-include", "-iquote", "build: how gcc is told of include/: -iquote (searched for \"...\" includes) or -I (for <...> too: every system header is then first a failed lookup on the mount)")
	return c
}

// buildRTT is how far the origin is from the build's clients.
const buildRTT = 50 * time.Millisecond

// Run compiles a generated C tree from FUSE mounts, 1 and 4 clients each
// with a mount of its own, the origin buildRTT away: straight from the
// origin, and through a proxy on the clients' side (serving a data
// channel if pxData, -px-data). Every object is checked against the same
// tree compiled from the local disk.
func Run(e *harness.Env, c *Config, pxData bool) error {
	if c.Include != "-iquote" && c.Include != "-I" {
		return fmt.Errorf("-build-include %q: want -iquote or -I", c.Include)
	}
	bin := e.Bin
	began := time.Now()
	dir := filepath.Join(e.Scratch, "build")
	tree := cTree(c.Files)
	var srcs []string
	var size int64
	for name, b := range tree {
		if strings.HasSuffix(name, ".c") {
			srcs = append(srcs, name)
		}
		size += int64(len(b))
	}
	slices.Sort(srcs)
	local := filepath.Join(dir, "local")
	for name, b := range tree {
		if err := os.MkdirAll(filepath.Join(local, filepath.Dir(name)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(local, name), b, 0o644); err != nil {
			return err
		}
	}
	o, err := proxy.StartOrigin(bin, dir, buildRTT, nil)
	if err != nil {
		return err
	}
	defer o.Close()
	if err := writeTree(o, tree); err != nil {
		return err
	}

	fmt.Printf("\n## Build: gcc -c -O0 %s include of %d C files (and %d headers, %.1f MB) from hoard mounts, the origin %v away\n\n", c.Include, len(srcs), len(tree)-len(srcs), float64(size)/1e6, buildRTT)
	fmt.Printf("Each client is a mount of its own with an empty cache, running %d gcc at a time (-build-jobs; the machine has 2 cores), objects to the local disk. The proxy is on the clients' side of the RTT; its 4-client runs start warm (the store the 1-client run filled) and cold (a new proxy).\n\n", c.Jobs)
	fmt.Println("| setup | clients | wall time | vs direct | origin sent |")
	fmt.Println("|---|---|---|---|---|")
	ref, err := c.compileAll([]string{local}, srcs, filepath.Join(dir, "obj"), nil)
	if err != nil {
		return fmt.Errorf("local build: %w", err)
	}
	direct := map[int]time.Duration{}
	row := func(setup string, clients int, d time.Duration, sent int64) {
		ratio := "1.00×"
		if base, ok := direct[clients]; ok {
			ratio = fmt.Sprintf("%.2f×", d.Seconds()/base.Seconds())
		} else {
			direct[clients] = d
		}
		fmt.Printf("| %s | %d | %.1f s | %s | %.1f MB |\n", setup, clients, d.Seconds(), ratio, float64(sent)/1e6)
	}
	mounted := func(setup, addr string, clients int) error {
		before := o.Sent()
		d, err := c.onMounts(bin, addr, filepath.Join(dir, "run"), clients, srcs, ref.objs)
		if err != nil {
			return fmt.Errorf("%s, %d clients: %w", setup, clients, err)
		}
		row(setup, clients, d, o.Sent()-before)
		return nil
	}
	for _, n := range []int{1, 4} {
		if err := mounted("direct", o.Shaped(), n); err != nil {
			return err
		}
	}
	for _, runs := range [][]struct {
		setup   string
		clients int
	}{{{"proxy, cold", 1}, {"proxy, warm", 4}}, {{"proxy, cold", 4}}} {
		pdir := filepath.Join(dir, "proxy")
		px, _, stop, err := proxy.Start(bin, o, pdir, size, proxystore.Pooled, pxData)
		if err != nil {
			return err
		}
		for _, r := range runs {
			if err = mounted(r.setup, px, r.clients); err != nil {
				break
			}
		}
		stop()
		os.RemoveAll(pdir)
		if err != nil {
			return err
		}
	}
	local4, err := c.compileAll([]string{local, local, local, local}, srcs, filepath.Join(dir, "obj"), ref.objs)
	if err != nil {
		return fmt.Errorf("local build: %w", err)
	}
	row("local disk", 1, ref.took, 0)
	row("local disk", 4, local4.took, 0)
	fmt.Println("\n(vs direct: wall time over that of the direct mounts with as many clients; local disk: the same builds from a local copy of the tree, the page cache warm. Every object was compared with the local build's.)")
	fmt.Printf("\n(this part took %s)\n", time.Since(began).Round(time.Second))
	return nil
}

// writeTree writes tree's files under /build at the origin.
func writeTree(o *proxy.Origin, tree map[string][]byte) error {
	return o.Write(func(w *pathfs.FS) error {
		made := map[string]bool{}
		var mkdir func(string) error
		mkdir = func(d string) error {
			if made[d] || d == "/" {
				return nil
			}
			if err := mkdir(filepath.Dir(d)); err != nil {
				return err
			}
			made[d] = true
			return w.Mkdir(d, 0o755)
		}
		for name, b := range tree {
			path := filepath.Join("/build", name)
			if err := mkdir(filepath.Dir(path)); err != nil {
				return err
			}
			if err := harness.WriteRemote(w, path, b, int64(len(b))); err != nil {
				return err
			}
		}
		return nil
	})
}

// onMounts mounts addr once per client, each with an empty cache,
// compiles the tree under /build on every mount at once, checks the
// objects against ref, and unmounts.
func (c *Config) onMounts(bin, addr, dir string, clients int, srcs []string, ref map[string][]byte) (time.Duration, error) {
	defer os.Remove(dir)
	var roots []string
	for k := range clients {
		mnt, cache := filepath.Join(dir, fmt.Sprintf("mnt%d", k)), filepath.Join(dir, fmt.Sprintf("cache%d", k))
		unmount, err := harness.MountCell(bin, addr, mnt, cache)
		if err != nil {
			return 0, err
		}
		defer func() {
			unmount()
			// Not RemoveAll: should the unmount have failed, that would
			// empty the tree at the origin.
			os.Remove(mnt)
			os.RemoveAll(cache)
		}()
		roots = append(roots, filepath.Join(mnt, "build"))
	}
	b, err := c.compileAll(roots, srcs, filepath.Join(dir, "obj"), ref)
	return b.took, err
}

// build is a timed compile of the tree and the objects it made (of the
// first root's).
type build struct {
	took time.Duration
	objs map[string][]byte
}

// compileAll compiles srcs under every root at once, -build-jobs gcc at
// a time per root, with objects to out/<root's index>/, and compares
// every object with want unless it is nil.
func (c *Config) compileAll(roots, srcs []string, out string, want map[string][]byte) (build, error) {
	defer os.RemoveAll(out)
	var wg sync.WaitGroup
	errs := make(chan error, len(roots)*c.Jobs)
	start := time.Now()
	for k, root := range roots {
		objDir := filepath.Join(out, fmt.Sprint(k))
		if err := os.MkdirAll(objDir, 0o755); err != nil {
			return build{}, err
		}
		var next atomic.Int64
		for range c.Jobs {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= len(srcs) {
						return
					}
					obj := filepath.Join(objDir, objName(srcs[i]))
					cmd := exec.Command("gcc", "-c", "-O0", c.Include, "include", "-o", obj, srcs[i])
					cmd.Dir = root
					if msg, err := cmd.CombinedOutput(); err != nil {
						errs <- fmt.Errorf("gcc %s in %s: %v: %s", srcs[i], root, err, msg)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	b := build{took: time.Since(start), objs: map[string][]byte{}}
	close(errs)
	if err := errors.Join(harness.Collect(errs)...); err != nil {
		return b, err
	}
	for k := range roots {
		for _, src := range srcs {
			obj, err := os.ReadFile(filepath.Join(out, fmt.Sprint(k), objName(src)))
			if err != nil {
				return b, err
			}
			if want != nil && !bytes.Equal(obj, want[objName(src)]) {
				return b, fmt.Errorf("%s from %s: not the object the local build made", objName(src), roots[k])
			}
			if k == 0 {
				b.objs[objName(src)] = obj
			}
		}
	}
	return b, nil
}

func objName(src string) string { return strings.TrimSuffix(filepath.Base(src), ".c") + ".o" }

// cTree generates a C project, the same every time: headers in include/
// (each including common.h), and n .c files in ten directories, each
// including a few system headers and four of the project's, some hundred
// lines each.
func cTree(n int) map[string][]byte {
	rng := rand.New(rand.NewSource(4))
	tree := map[string][]byte{}
	nh := max(4, n/8)
	tree["include/common.h"] = []byte("#ifndef COMMON_H\n#define COMMON_H\n#include <stddef.h>\n#include <stdint.h>\n" +
		"#define ROUNDS 16\n#define CLAMP(x, lo, hi) ((x) < (lo) ? (lo) : (x) > (hi) ? (hi) : (x))\n" +
		"typedef struct vec { double x, y, z; } vec;\n" +
		"static inline double vdot(vec a, vec b) { return a.x * b.x + a.y * b.y + a.z * b.z; }\n#endif\n")
	for h := range nh {
		var b strings.Builder
		p := fmt.Sprintf("h%03d", h)
		P := strings.ToUpper(p)
		fmt.Fprintf(&b, "#ifndef %s_H\n#define %s_H\n#include \"common.h\"\n\n", P, P)
		fmt.Fprintf(&b, "#define %s_SCALE %d\n#define %s_MASK 0x%x\n\n", P, 3+rng.Intn(50), P, rng.Intn(1<<12))
		fmt.Fprintf(&b, "typedef struct %s_rec {\n\tint id;\n\tlong acc;\n\tdouble w[%d];\n\tchar name[%d];\n\tvec at;\n} %s_rec;\n\n", p, 2+rng.Intn(8), 8+rng.Intn(24), p)
		fmt.Fprintf(&b, "static inline long %s_mix(long a, long b)\n{\n\treturn (a * %s_SCALE) ^ (b + %s_MASK);\n}\n\n", p, P, P)
		fmt.Fprintf(&b, "static inline void %s_init(%s_rec *r, int id)\n{\n\tr->id = id;\n\tr->acc = %s_mix(id, %d);\n\tfor (size_t i = 0; i < sizeof r->w / sizeof r->w[0]; i++)\n\t\tr->w[i] = (double)i / (id + 1);\n\tr->name[0] = 0;\n\tr->at = (vec){id, -id, 0.5};\n}\n\n", p, p, p, rng.Intn(1000))
		fmt.Fprintf(&b, "long %s_sum(const %s_rec *r, size_t n);\n\n#endif\n", p, p)
		tree[fmt.Sprintf("include/%s.h", p)] = []byte(b.String())
	}
	for i := range n {
		var b strings.Builder
		p := fmt.Sprintf("f%04d", i)
		b.WriteString("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n")
		hs := rng.Perm(nh)[:4]
		for _, h := range hs {
			fmt.Fprintf(&b, "#include \"h%03d.h\"\n", h)
		}
		fmt.Fprintf(&b, "\nstatic long %s_tab[%d];\n", p, 16+rng.Intn(64))
		nf := 6 + rng.Intn(5)
		for f := range nf {
			h := fmt.Sprintf("h%03d", hs[f%len(hs)])
			fmt.Fprintf(&b, "\nstatic long %s_fn%d(long x, const char *s)\n{\n", p, f)
			fmt.Fprintf(&b, "\t%s_rec r;\n\tlong acc = x;\n\tsize_t len = strlen(s);\n\n\t%s_init(&r, (int)x);\n", h, h)
			fmt.Fprintf(&b, "\tfor (int i = 0; i < ROUNDS + %d; i++) {\n", rng.Intn(32))
			fmt.Fprintf(&b, "\t\tacc = %s_mix(acc, i) %% %d;\n", h, 97+rng.Intn(1000))
			fmt.Fprintf(&b, "\t\tif (acc > %d)\n\t\t\tacc -= (long)len;\n\t\telse\n\t\t\tacc += r.acc & 0x%x;\n", rng.Intn(500), rng.Intn(255))
			fmt.Fprintf(&b, "\t\t%s_tab[i %% (sizeof %s_tab / sizeof %s_tab[0])] ^= acc;\n\t}\n", p, p, p)
			fmt.Fprintf(&b, "\tswitch (acc %% 4) {\n\tcase 0:\n\t\tacc += %d;\n\t\tbreak;\n\tcase 1:\n\t\tacc = CLAMP(acc, %d, %d);\n\t\tbreak;\n\tcase 2:\n\t\tacc *= 2;\n\t\tbreak;\n\tdefault:\n\t\tacc = -acc;\n\t}\n", rng.Intn(100), -rng.Intn(100), rng.Intn(10000))
			fmt.Fprintf(&b, "\tacc += (long)vdot(r.at, (vec){%d, %d, %d});\n", rng.Intn(9), rng.Intn(9), rng.Intn(9))
			if f > 0 {
				fmt.Fprintf(&b, "\tacc ^= %s_fn%d(acc / 3, s + (len > 1));\n", p, rng.Intn(f))
			}
			fmt.Fprintf(&b, "\treturn acc;\n}\n")
		}
		fmt.Fprintf(&b, "\nint %s_main(int argc, char **argv)\n{\n\tlong total = 0;\n\n\tfor (int i = 1; i < argc; i++) {\n", p)
		for f := range nf {
			fmt.Fprintf(&b, "\t\ttotal += %s_fn%d(atol(argv[i]), argv[i]);\n", p, f)
		}
		fmt.Fprintf(&b, "\t}\n\tprintf(\"%s: %%ld\\n\", total);\n\treturn total != 0;\n}\n", p)
		tree[fmt.Sprintf("d%02d/%s.c", i%10, p)] = []byte(b.String())
	}
	return tree
}
