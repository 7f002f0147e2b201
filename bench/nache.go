package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/proxystore"
)

var (
	nacheClients = flag.Int("nache-clients", 4, "nache bench: clients of the proxy")
	nacheFiles   = flag.Int("nache-files", 40, "nache bench: scratch files each client makes, writes, reads and removes")
	nacheSize    = flag.Int("nache-size", 64<<10, "nache bench: bytes per scratch file")
)

// nacheBench runs clients of one proxy, the origin 50 ms away, each making,
// writing, reading back and removing scratch files of its own (a build's
// temporary files, Postmark's churn), once with the proxy's delegations
// (the default) and once with --no-delegations:
// time, requests the proxy sent the origin, and bytes sent to the origin.
// With delegations a scratch file's bytes stay in its client's cache and
// die with it; the creates and removes still go through to the origin.
func nacheBench(bin, scratch string) error {
	const rtt = 50 * time.Millisecond
	fmt.Printf("\n## Delegations through the proxy (%d clients × %d scratch files of %s, origin %v away)\n\n", *nacheClients, *nacheFiles, human(int64(*nacheSize)), rtt)
	fmt.Println("| proxy | time | origin requests | bytes to the origin | opens served by the clients | vs no delegations (time) |")
	fmt.Println("|---|---|---|---|---|---|")
	var base time.Duration
	for _, deleg := range []bool{false, true} {
		dir := filepath.Join(scratch, fmt.Sprintf("nache-%v", deleg))
		o, err := startOrigin(bin, dir, rtt, nil)
		if err != nil {
			return err
		}
		args := []string{"proxy", "--insecure", "--origin", o.shaped(), "--cache", filepath.Join(dir, "proxy"), "--cache-size", "256M", "--layout", proxystore.Pooled}
		name := "delegations"
		if !deleg {
			args = append(args, "--no-delegations")
			name = "--no-delegations"
		}
		px, _, stopPx, err := startHoard(bin, args...)
		if err != nil {
			o.close()
			return err
		}
		up := o.received()
		d, local, err := scratchChurn(px)
		var st *pb.ProxyStatsReply
		if err == nil {
			st, err = proxyStats(bin, px)
		}
		stopPx()
		sent := o.received() - up
		o.close()
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

// scratchChurn has *nacheClients new clients of addr each make, write,
// close, read back and remove *nacheFiles files in a directory of its own,
// all at once; it checks the bytes read and returns the time and the
// opens the clients served themselves.
func scratchChurn(addr string) (time.Duration, int64, error) {
	data := make([]byte, *nacheSize)
	for i := range data {
		data[i] = byte(i*31 + i>>7)
	}
	cs, err := dialAll(*nacheClients, func(i int) client.Options {
		return client.Options{Server: addr, CacheSize: 256 << 20, Name: fmt.Sprintf("nache-%d", i)}
	})
	if err != nil {
		return 0, 0, err
	}
	defer closeAll(cs)
	start := time.Now()
	errs := make(chan error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			dir := fmt.Sprintf("/c%d", i)
			if err := c.Mkdir(dir, 0o755); err != nil {
				errs <- err
				return
			}
			for j := range *nacheFiles {
				name := fmt.Sprintf("%s/s%d", dir, j)
				if err := writeRemote(c, name, data, int64(len(data))); err != nil {
					errs <- err
					return
				}
				got, err := readBack(c, name, len(data))
				if err == nil && string(got) != string(data) {
					err = fmt.Errorf("%s: read back other bytes", name)
				}
				if err == nil {
					err = c.Remove(name)
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
	if err := errors.Join(collect(errs)...); err != nil {
		return 0, 0, err
	}
	var local int64
	for _, c := range cs {
		local += c.Client().Stats().LocalOpens
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
