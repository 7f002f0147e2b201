package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hoardfs/hoard/client"
)

var (
	pxFiles = flag.Int("px-files", 200, "proxy bench: files in the tree")
	pxSize  = flag.Int("px-size", 100<<10, "proxy bench: bytes per file")
	pxPar   = flag.Int("px-par", 8, "proxy bench: files each client reads at once")
)

// proxyBench puts a latency shaper between an origin and its clients and
// compares clients reading a tree straight from the origin with clients
// reading it through a proxy on their side of the shaper: time, and bytes
// the origin sent through the shaper (in trees: 1.00 is the tree's bytes
// once). Each row's clients are new, with memory caches: "warm" is the
// proxy's cache, filled by the row before.
func proxyBench(bin, scratch string) error {
	fmt.Printf("\n## Proxy (%d files of %s, %d read at once per client)\n\n", *pxFiles, human(int64(*pxSize)), *pxPar)
	fmt.Println("| RTT to origin | setup | clients | time | vs 1 client direct | origin sent | in trees |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, rtt := range []time.Duration{0, 50 * time.Millisecond} {
		if err := proxyRound(bin, filepath.Join(scratch, fmt.Sprintf("px-%d", rtt.Milliseconds())), rtt); err != nil {
			return err
		}
	}
	return nil
}

func proxyRound(bin, dir string, rtt time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The origin's control and data channels each behind a shaper; the
	// data channel advertises its shaper's address.
	dataAddr, err := freePort()
	if err != nil {
		return err
	}
	dataShaper, err := newShaper(dataAddr, rtt)
	if err != nil {
		return err
	}
	defer dataShaper.close()
	origin, _, stop, err := startServer(bin, filepath.Join(dir, "origin"), "--data-listen", dataAddr, "--data-advertise", dataShaper.addr())
	if err != nil {
		return err
	}
	defer stop()
	ctlShaper, err := newShaper(origin, rtt)
	if err != nil {
		return err
	}
	defer ctlShaper.close()
	sent := func() int64 { return ctlShaper.down.Load() + dataShaper.down.Load() }

	names, want, err := proxyTree(origin)
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
		before := sent()
		d, err := readTrees(addr, clients, names, want)
		if err != nil {
			return fmt.Errorf("%s, %d clients: %w", setup, clients, err)
		}
		row(setup, clients, d, sent()-before)
		return nil
	}
	if err := measure("direct", ctlShaper.addr(), 1); err != nil {
		return err
	}
	if err := measure("direct", ctlShaper.addr(), 4); err != nil {
		return err
	}
	for _, n := range []int{1, 4} {
		px, _, stopPx, err := startHoard(bin, "proxy", "--origin", ctlShaper.addr(), "--cache", filepath.Join(dir, fmt.Sprintf("proxy%d", n)))
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

// proxyTree writes the tree at the origin, unshaped.
func proxyTree(origin string) ([]string, []byte, error) {
	// Data over the control connection: the data channel is shaped.
	w, err := client.Dial(client.Options{Server: origin, CacheSize: 64 << 20, BypassThreshold: 1, NoDataChannel: true})
	if err != nil {
		return nil, nil, err
	}
	defer w.Close()
	if err := w.Mkdir("/tree", 0o755); err != nil {
		return nil, nil, err
	}
	data := make([]byte, *pxSize)
	for i := range data {
		data[i] = byte(i*13 + i>>8)
	}
	names := make([]string, *pxFiles)
	for i := range names {
		names[i] = fmt.Sprintf("/tree/f%04d", i)
		f, err := w.Create(names[i])
		if err != nil {
			return nil, nil, err
		}
		if err := fillAndClose(f, data, int64(len(data))); err != nil {
			return nil, nil, err
		}
	}
	return names, data, nil
}

// readTrees has n new clients of addr (memory caches) read every file
// at once, *pxPar files at a time each, and checks the bytes.
func readTrees(addr string, n int, names []string, want []byte) (time.Duration, error) {
	cs := make([]*client.Client, n)
	for i := range cs {
		c, err := client.Dial(client.Options{Server: addr, CacheSize: 256 << 20, DialTimeout: 30 * time.Second})
		if err != nil {
			return 0, err
		}
		defer c.Close()
		cs[i] = c
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n*(*pxPar))
	for _, c := range cs {
		next := make(chan string)
		go func() {
			for _, name := range names {
				next <- name
			}
			close(next)
		}()
		for range *pxPar {
			wg.Go(func() {
				buf := make([]byte, len(want)+1)
				for name := range next {
					f, err := c.Open(name, os.O_RDONLY, 0)
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
	return time.Since(start), errors.Join(collect(errs)...)
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// shaper relays TCP connections to a target, delaying every byte by half
// the round trip each way, and counts the bytes sent back (down).
type shaper struct {
	l     net.Listener
	to    string
	delay time.Duration
	down  atomic.Int64
}

func newShaper(to string, rtt time.Duration) (*shaper, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &shaper{l: l, to: to, delay: rtt / 2}
	go s.serve()
	return s, nil
}

func (s *shaper) addr() string { return s.l.Addr().String() }
func (s *shaper) close()       { s.l.Close() }

func (s *shaper) serve() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			o, err := net.Dial("tcp", s.to)
			if err != nil {
				return
			}
			defer o.Close()
			done := make(chan struct{}, 2)
			go func() { s.pipe(o, c, nil); done <- struct{}{} }()
			go func() { s.pipe(c, o, &s.down); done <- struct{}{} }()
			<-done
		}()
	}
}

// pipe copies src to dst, each piece delivered delay after it was read.
func (s *shaper) pipe(dst, src net.Conn, count *atomic.Int64) {
	type piece struct {
		at time.Time
		b  []byte
	}
	q := make(chan piece, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 64<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- piece{time.Now().Add(s.delay), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for p := range q {
		time.Sleep(time.Until(p.at))
		if _, err := dst.Write(p.b); err != nil {
			break
		}
		if count != nil {
			count.Add(int64(len(p.b)))
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, src)
}
