package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	pb "github.com/hoardfs/hoard/hoardpb"
)

// Origin is a file server that its clients reach through shapers: its
// control and data channels are each relayed with a delay, and optionally
// a bandwidth limit, as if it were far away.
type Origin struct {
	addr      string // the unshaped control address
	ctl, data *shaper
	stop      func()
}

// StartOrigin starts a server with its data in dir/origin, rtt away from
// its clients, its bytes towards them limited by lim (nil: no limit).
func StartOrigin(bin, dir string, rtt time.Duration, lim *Link) (*Origin, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The data channel advertises its shaper's address.
	dataAddr, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	o := &Origin{}
	if o.data, err = newShaper(dataAddr, rtt, lim); err != nil {
		return nil, err
	}
	if o.addr, _, o.stop, err = harness.StartServer(bin, filepath.Join(dir, "origin"), "--data-listen", dataAddr, "--data-advertise", o.data.addr()); err != nil {
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

// Shaped is the address clients far from the origin use.
func (o *Origin) Shaped() string { return o.ctl.addr() }

// Sent is the bytes the origin sent through its shapers so far.
func (o *Origin) Sent() int64 { return o.ctl.down.Load() + o.data.down.Load() }

// Received is the bytes sent to the origin through its shapers so far.
func (o *Origin) Received() int64 { return o.ctl.up.Load() + o.data.up.Load() }

// SetRTT sets how far the origin is from its clients.
func (o *Origin) SetRTT(rtt time.Duration) {
	o.ctl.setRTT(rtt)
	o.data.setRTT(rtt)
}

// Close stops the origin and its shapers.
func (o *Origin) Close() {
	o.ctl.close()
	o.data.close()
	o.stop()
}

// Write runs fn with a client of the origin that writes at full speed
// (file data goes over the unshaped control connection, as the data
// channel is shaped), and closes it: writes the client still held are
// stored then, and their failure is fn's.
func (o *Origin) Write(fn func(w *pathfs.FS) error) error {
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

// Start runs a proxy of o in dir with the given store layout, its store
// sized for data bytes (the pooled layout allocates all of it), serving
// its clients a data channel if dataChannel (-px-data). It returns the
// proxy's address, its pid and how to stop it.
func Start(bin string, o *Origin, dir string, data int64, layout string, dataChannel bool) (string, int, func(), error) {
	size := data + data/4 + 64<<20
	args := []string{"proxy", "--insecure", "--origin", o.Shaped(), "--cache", dir, "--cache-size", fmt.Sprint(size), "--layout", layout}
	if dataChannel {
		args = append(args, "--data-listen=")
	}
	return harness.StartHoard(bin, args...)
}

// Stats is `hoard proxy stats --json` of the proxy at addr.
func Stats(bin, addr string) (*pb.ProxyStatsReply, error) {
	out, err := exec.Command(bin, "proxy", "stats", "--insecure", "--proxy", addr, "--json").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("hoard proxy stats: %v: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, err
	}
	var r pb.ProxyStatsReply
	if err := protojson.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("hoard proxy stats: %w: %s", err, out)
	}
	return &r, nil
}

// shaper relays TCP connections to a target, delaying every byte by half
// the round trip each way, and counts the bytes sent back (down) and on
// (up); with a link, those sent back go through its bandwidth limit first.
type shaper struct {
	l     net.Listener
	to    string
	delay atomic.Int64 // one way, in nanoseconds
	link  *Link
	down  atomic.Int64
	up    atomic.Int64
}

func newShaper(to string, rtt time.Duration, lim *Link) (*shaper, error) {
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

// Link is a bandwidth limit shared by the shapers of one origin: the
// bytes it sends leave one after the other at its Rate, whichever
// connection they are on.
type Link struct {
	Rate float64 // bytes per second
	mu   sync.Mutex
	idle time.Time // when the bytes queued so far are through
}

// through queues n bytes that arrived at t and says when they are out.
func (l *Link) through(t time.Time, n int) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.idle.Before(t) {
		l.idle = t
	}
	l.idle = l.idle.Add(time.Duration(float64(n) / l.Rate * float64(time.Second)))
	return l.idle
}
