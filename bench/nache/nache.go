// Package nache is bench's nache part: clients' scratch files through a
// proxy, its delegations on and off.
package nache

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/bench/proxy"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/proxystore"
)

// Config is the nache part's flags.
type Config struct {
	Clients, Files, Size int // -nache-clients, -nache-files, -nache-size
}

// Flags defines the -nache-* flags on fs and returns what they set.
func Flags(fs *flag.FlagSet) *Config {
	c := &Config{}
	fs.IntVar(&c.Clients, "nache-clients", 4, "nache bench: clients of the proxy")
	fs.IntVar(&c.Files, "nache-files", 40, "nache bench: scratch files each client makes, writes, reads and removes")
	fs.IntVar(&c.Size, "nache-size", 64<<10, "nache bench: bytes per scratch file")
	return c
}

// Run runs clients of one proxy, the origin 50 ms away, each making,
// writing, reading back and removing scratch files of its own (a build's
// temporary files, Postmark's churn), once with the proxy's delegations
// (the default) and once with --no-delegations:
// time, requests the proxy sent the origin, and bytes sent to the origin.
// With delegations a scratch file's bytes stay in its client's cache and
// die with it; the creates and removes still go through to the origin.
func Run(e *harness.Env, c *Config) error {
	bin := e.Bin
	const rtt = 50 * time.Millisecond
	fmt.Printf("\n## Delegations through the proxy (%d clients × %d scratch files of %s, origin %v away)\n\n", c.Clients, c.Files, harness.Human(int64(c.Size)), rtt)
	fmt.Println("| proxy | time | origin requests | bytes to the origin | opens served by the clients | vs no delegations (time) |")
	fmt.Println("|---|---|---|---|---|---|")
	var base time.Duration
	for _, deleg := range []bool{false, true} {
		dir := filepath.Join(e.Scratch, fmt.Sprintf("nache-%v", deleg))
		o, err := proxy.StartOrigin(bin, dir, rtt, nil)
		if err != nil {
			return err
		}
		args := []string{"proxy", "--insecure", "--origin", o.Shaped(), "--cache", filepath.Join(dir, "proxy"), "--cache-size", "256M", "--layout", proxystore.Pooled}
		name := "delegations"
		if !deleg {
			args = append(args, "--no-delegations")
			name = "--no-delegations"
		}
		px, _, stopPx, err := harness.StartHoard(bin, args...)
		if err != nil {
			o.Close()
			return err
		}
		up := o.Received()
		d, local, err := c.churn(px)
		var st *pb.ProxyStatsReply
		if err == nil {
			st, err = proxy.Stats(bin, px)
		}
		stopPx()
		sent := o.Received() - up
		o.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if base == 0 {
			base = d
		}
		fmt.Printf("| %s | %.2f s | %d | %.2f MB | %d | %.2f× |\n", name, d.Seconds(), st.OriginRequests, float64(sent)/1e6, local, float64(d)/float64(base))
	}
	return nil
}

// churn has -nache-clients new clients of addr each make, write, close,
// read back and remove -nache-files files in a directory of its own, all
// at once; it checks the bytes read and returns the time and the opens
// the clients served themselves.
func (c *Config) churn(addr string) (time.Duration, int64, error) {
	data := make([]byte, c.Size)
	for i := range data {
		data[i] = byte(i*31 + i>>7)
	}
	cs, err := harness.DialAll(c.Clients, func(i int) client.Options {
		return client.Options{Server: addr, CacheSize: 256 << 20, Name: fmt.Sprintf("nache-%d", i)}
	})
	if err != nil {
		return 0, 0, err
	}
	defer harness.CloseAll(cs)
	start := time.Now()
	errs := make(chan error, len(cs))
	var wg sync.WaitGroup
	for i, cl := range cs {
		wg.Go(func() {
			dir := fmt.Sprintf("/c%d", i)
			if err := cl.Mkdir(dir, 0o755); err != nil {
				errs <- err
				return
			}
			for j := range c.Files {
				name := fmt.Sprintf("%s/s%d", dir, j)
				if err := harness.WriteRemote(cl, name, data, int64(len(data))); err != nil {
					errs <- err
					return
				}
				got, err := readBack(cl, name, len(data))
				if err == nil && string(got) != string(data) {
					err = fmt.Errorf("%s: read back other bytes", name)
				}
				if err == nil {
					err = cl.Remove(name)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	close(errs)
	if err := errors.Join(harness.Collect(errs)...); err != nil {
		return 0, 0, err
	}
	var local int64
	for _, cl := range cs {
		local += cl.Client().Stats().LocalOpens
	}
	return d, local, nil
}

func readBack(c *pathfs.FS, name string, n int) ([]byte, error) {
	f, err := c.Open(name, 0, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	_, err = f.ReadAt(b, 0)
	return b, err
}
