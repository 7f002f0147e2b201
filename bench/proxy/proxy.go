// Package proxy is bench's proxy part, clients of a proxy against clients
// of a distant origin, and what every part that runs a proxy uses (hades,
// build, nache): an origin made distant by shapers, proxies of it, and
// their counters.
package proxy

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/proxystore"
)

// Config is the proxy part's flags.
type Config struct {
	Files, Size, Par int  // -px-files, -px-size, -px-par
	Data             bool // -px-data, which hades and build heed too
}

// Flags defines the -px-* flags on fs and returns what they set.
func Flags(fs *flag.FlagSet) *Config {
	c := &Config{}
	fs.IntVar(&c.Files, "px-files", 200, "proxy bench: files in the tree")
	fs.IntVar(&c.Size, "px-size", 100<<10, "proxy bench: bytes per file")
	fs.IntVar(&c.Par, "px-par", 8, "proxy bench: files each client reads at once")
	fs.BoolVar(&c.Data, "px-data", false, "proxy benches: the proxies serve their clients a data channel (hoard proxy --data-listen)")
	return c
}

// Run puts a latency shaper between an origin and its clients and
// compares clients reading a tree straight from the origin with clients
// reading it through a proxy on their side of the shaper: time, and bytes
// the origin sent through the shaper (in trees: 1.00 is the tree's bytes
// once). Each row's clients are new, with memory caches: "warm" is the
// proxy's cache, filled by the row before.
func Run(e *harness.Env, c *Config) error {
	fmt.Printf("\n## Proxy (%d files of %s, %d read at once per client)\n\n", c.Files, harness.Human(int64(c.Size)), c.Par)
	fmt.Println("| RTT to origin | setup | clients | time | vs 1 client direct | origin sent | in trees |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, rtt := range []time.Duration{0, 50 * time.Millisecond} {
		if err := c.round(e.Bin, filepath.Join(e.Scratch, fmt.Sprintf("px-%d", rtt.Milliseconds())), rtt); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) round(bin, dir string, rtt time.Duration) error {
	o, err := StartOrigin(bin, dir, rtt, nil)
	if err != nil {
		return err
	}
	defer o.Close()
	names, want, err := c.tree(o)
	if err != nil {
		return err
	}
	var base time.Duration
	row := func(setup string, clients int, d time.Duration, bytes int64) {
		if base == 0 {
			base = d
		}
		tree := float64(len(want) * len(names))
		fmt.Printf("| %v | %s | %d | %.2f s | %.2f× | %.1f MB | %.2f |\n", rtt, setup, clients, d.Seconds(), float64(d)/float64(base), float64(bytes)/1e6, float64(bytes)/tree)
	}
	measure := func(setup, addr string, clients int) error {
		before := o.Sent()
		d, err := c.readTrees(addr, clients, names, want)
		if err != nil {
			return fmt.Errorf("%s, %d clients: %w", setup, clients, err)
		}
		row(setup, clients, d, o.Sent()-before)
		return nil
	}
	if err := measure("direct", o.Shaped(), 1); err != nil {
		return err
	}
	if err := measure("direct", o.Shaped(), 4); err != nil {
		return err
	}
	tree := int64(len(names)) * int64(len(want))
	for _, n := range []int{1, 4} {
		px, _, stopPx, err := Start(bin, o, filepath.Join(dir, fmt.Sprintf("proxy%d", n)), tree, proxystore.Pooled, c.Data)
		if err != nil {
			return err
		}
		err = measure("proxy, cold", px, n)
		if err == nil {
			err = measure("proxy, warm", px, n)
		}
		stopPx()
		if err != nil {
			return err
		}
	}
	return nil
}

// tree writes the tree at the origin, unshaped.
func (c *Config) tree(o *Origin) ([]string, []byte, error) {
	data := make([]byte, c.Size)
	for i := range data {
		data[i] = byte(i*13 + i>>8)
	}
	names := make([]string, c.Files)
	err := o.Write(func(w *pathfs.FS) error {
		if err := w.Mkdir("/tree", 0o755); err != nil {
			return err
		}
		for i := range names {
			names[i] = fmt.Sprintf("/tree/f%04d", i)
			if err := harness.WriteRemote(w, names[i], data, int64(len(data))); err != nil {
				return err
			}
		}
		return nil
	})
	return names, data, err
}

// readTrees has n new clients of addr (memory caches) read every file
// at once, -px-par files at a time each, and checks the bytes.
func (c *Config) readTrees(addr string, n int, names []string, want []byte) (time.Duration, error) {
	cs, err := harness.DialAll(n, func(int) client.Options {
		return client.Options{Server: addr, CacheSize: 256 << 20, DialTimeout: 30 * time.Second}
	})
	if err != nil {
		return 0, err
	}
	defer harness.CloseAll(cs)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n*c.Par)
	for _, cl := range cs {
		next := make(chan string)
		go func() {
			for _, name := range names {
				next <- name
			}
			close(next)
		}()
		for range c.Par {
			wg.Go(func() {
				buf := make([]byte, len(want)+1)
				for name := range next {
					f, err := cl.Open(name, os.O_RDONLY, 0)
					if err != nil {
						errs <- err
						return
					}
					k, _ := f.ReadAt(buf, 0)
					f.Close()
					if k != len(want) || string(buf[:k]) != string(want) {
						errs <- fmt.Errorf("%s: read %d bytes, not the ones written", name, k)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	return time.Since(start), errors.Join(harness.Collect(errs)...)
}
