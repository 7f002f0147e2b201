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
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/proxystore"
)

var (
	pxFiles = flag.Int("px-files", 200, "proxy bench: files in the tree")
	pxSize  = flag.Int("px-size", 100<<10, "proxy bench: bytes per file")
	pxPar   = flag.Int("px-par", 8, "proxy bench: files each client reads at once")
	pxData  = flag.Bool("px-data", false, "proxy benches: the proxies serve their clients a data channel (hoard proxy --data-listen)")
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
	o, err := startOrigin(bin, dir, rtt, nil)
	if err != nil {
		return err
	}
	defer o.close()
	names, want, err := proxyTree(o)
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
		before := o.sent()
		d, err := readTrees(addr, clients, names, want)
		if err != nil {
			return fmt.Errorf("%s, %d clients: %w", setup, clients, err)
		}
		row(setup, clients, d, o.sent()-before)
		return nil
	}
	if err := measure("direct", o.shaped(), 1); err != nil {
		return err
	}
	if err := measure("direct", o.shaped(), 4); err != nil {
		return err
	}
	tree := int64(len(names)) * int64(len(want))
	for _, n := range []int{1, 4} {
		px, _, stopPx, err := startProxy(bin, o, filepath.Join(dir, fmt.Sprintf("proxy%d", n)), tree, proxystore.Pooled)
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

// origin is a file server that its clients reach through shapers: its
// control and data channels are each relayed with a delay, and optionally
// a bandwidth limit, as if it were far away.
type origin struct {
	addr      string // the unshaped control address
	ctl, data *shaper
	stop      func()
}

// startOrigin starts a server with its data in dir/origin, rtt away from
// its clients, its bytes towards them limited by lim (nil: no limit).
func startOrigin(bin, dir string, rtt time.Duration, lim *link) (*origin, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The data channel advertises its shaper's address.
	dataAddr, err := freePort()
	if err != nil {
		return nil, err
	}
	o := &origin{}
	if o.data, err = newShaper(dataAddr, rtt, lim); err != nil {
		return nil, err
	}
	if o.addr, _, o.stop, err = startServer(bin, filepath.Join(dir, "origin"), "--data-listen", dataAddr, "--data-advertise", o.data.addr()); err != nil {
		o.data.close()
		return nil, err
	}
	if o.ctl, err = newShaper(o.addr, rtt, lim); err != nil {
		o.stop()
		o.data.close()
		return nil, err
	}
	return o, nil
}

// shaped is the address clients far from the origin use.
func (o *origin) shaped() string { return o.ctl.addr() }

// sent is the bytes the origin sent through its shapers so far.
func (o *origin) sent() int64 { return o.ctl.down.Load() + o.data.down.Load() }

// received is the bytes sent to the origin through its shapers so far.
func (o *origin) received() int64 { return o.ctl.up.Load() + o.data.up.Load() }

func (o *origin) setRTT(rtt time.Duration) {
	o.ctl.setRTT(rtt)
	o.data.setRTT(rtt)
}

func (o *origin) close() {
	o.ctl.close()
	o.data.close()
	o.stop()
}

// write runs fn with a client of the origin that writes at full speed
// (file data goes over the unshaped control connection, as the data
// channel is shaped), and closes it: writes the client still held are
// stored then, and their failure is fn's.
func (o *origin) write(fn func(w *pathfs.FS) error) error {
	w, err := pathfs.Dial(client.Options{Server: o.addr, CacheSize: 64 << 20, BypassThreshold: 1, NoDataChannel: true})
	if err != nil {
		return err
	}
	err = fn(w)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// startProxy runs a proxy of o in dir with the given store layout, its
// store sized for data bytes (the pooled layout allocates all of it).
func startProxy(bin string, o *origin, dir string, data int64, layout string) (string, int, func(), error) {
	size := data + data/4 + 64<<20
	args := []string{"proxy", "--insecure", "--origin", o.shaped(), "--cache", dir, "--cache-size", fmt.Sprint(size), "--layout", layout}
	if *pxData {
		args = append(args, "--data-listen=")
	}
	return startHoard(bin, args...)
}

// proxyTree writes the tree at the origin, unshaped.
func proxyTree(o *origin) ([]string, []byte, error) {
	data := make([]byte, *pxSize)
	for i := range data {
		data[i] = byte(i*13 + i>>8)
	}
	names := make([]string, *pxFiles)
	err := o.write(func(w *pathfs.FS) error {
		if err := w.Mkdir("/tree", 0o755); err != nil {
			return err
		}
		for i := range names {
			names[i] = fmt.Sprintf("/tree/f%04d", i)
			f, err := w.Create(names[i])
			if err != nil {
				return err
			}
			if err := fillAndClose(f, data, int64(len(data))); err != nil {
				return err
			}
		}
		return nil
	})
	return names, data, err
}

// readTrees has n new clients of addr (memory caches) read every file
// at once, *pxPar files at a time each, and checks the bytes.
func readTrees(addr string, n int, names []string, want []byte) (time.Duration, error) {
	cs, err := dialAll(n, func(int) client.Options {
		return client.Options{Server: addr, CacheSize: 256 << 20, DialTimeout: 30 * time.Second}
	})
	if err != nil {
		return 0, err
	}
	defer closeAll(cs)
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

// dialAll dials n clients, client i with opts(i); on an error the ones
// dialed are closed.
func dialAll(n int, opts func(i int) client.Options) ([]*pathfs.FS, error) {
	cs := make([]*pathfs.FS, 0, n)
	for i := range n {
		c, err := pathfs.Dial(opts(i))
		if err != nil {
			closeAll(cs)
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func closeAll(cs []*pathfs.FS) {
	for _, c := range cs {
		c.Close()
	}
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// shaper relays TCP connections to a target, delaying every byte by half
// the round trip each way, and counts the bytes sent back (down) and on
// (up); with a link, those sent back go through its bandwidth limit first.
type shaper struct {
	l     net.Listener
	to    string
	delay atomic.Int64 // one way, in nanoseconds
	link  *link
	down  atomic.Int64
	up    atomic.Int64
}

func newShaper(to string, rtt time.Duration, lim *link) (*shaper, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &shaper{l: l, to: to, link: lim}
	s.setRTT(rtt)
	go s.serve()
	return s, nil
}

func (s *shaper) addr() string { return s.l.Addr().String() }
func (s *shaper) close()       { s.l.Close() }

// setRTT changes the delay of the bytes read from now on.
func (s *shaper) setRTT(rtt time.Duration) { s.delay.Store(int64(rtt / 2)) }

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
			go func() { s.pipe(o, c, false); done <- struct{}{} }()
			go func() { s.pipe(c, o, true); done <- struct{}{} }()
			<-done
		}()
	}
}

// pipe copies src to dst, each piece delivered delay after it was read
// (down: after it went through the link, too).
func (s *shaper) pipe(dst, src net.Conn, down bool) {
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
				at := time.Now()
				if down && s.link != nil {
					at = s.link.through(at, n)
				}
				q <- piece{at.Add(time.Duration(s.delay.Load())), b[:n]}
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
		if down {
			s.down.Add(int64(len(p.b)))
		} else {
			s.up.Add(int64(len(p.b)))
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, src)
}

// link is a bandwidth limit shared by the shapers of one origin: the
// bytes it sends leave one after the other at its rate, whichever
// connection they are on.
type link struct {
	rate float64 // bytes per second
	mu   sync.Mutex
	idle time.Time // when the bytes queued so far are through
}

// through queues n bytes that arrived at t and says when they are out.
func (l *link) through(t time.Time, n int) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.idle.Before(t) {
		l.idle = t
	}
	l.idle = l.idle.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	return l.idle
}
