package integration

import (
	"net"
	"sync"
	"testing"
	"time"
)

// cutRelay forwards connections to a server and, on demand, holds every
// byte (a link down but not broken) or cuts every connection it carries.
// The faults_test.go relay strikes once, at a fixed offset of one
// connection; a campaign cuts whole links again and again, at any time.
type cutRelay struct {
	l  net.Listener
	to string

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	conns  map[net.Conn]struct{}
}

func startCutRelay(t *testing.T, to string) *cutRelay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cutRelay{l: l, to: to, conns: map[net.Conn]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	t.Cleanup(func() {
		r.pause(false)
		l.Close()
		r.cut()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	return r
}

func (r *cutRelay) addr() string { return r.l.Addr().String() }

func (r *cutRelay) pause(on bool) {
	r.mu.Lock()
	r.paused = on
	r.cond.Broadcast()
	r.mu.Unlock()
}

// cut closes every connection the relay carries and returns how many.
func (r *cutRelay) cut() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for c := range r.conns {
		c.Close()
		delete(r.conns, c)
		n++
	}
	return n / 2
}

func (r *cutRelay) track(cs ...net.Conn) {
	r.mu.Lock()
	for _, c := range cs {
		r.conns[c] = struct{}{}
	}
	r.mu.Unlock()
}

func (r *cutRelay) untrack(cs ...net.Conn) {
	r.mu.Lock()
	for _, c := range cs {
		delete(r.conns, c)
		c.Close()
	}
	r.mu.Unlock()
}

func (r *cutRelay) serve(c net.Conn) {
	s, err := net.DialTimeout("tcp", r.to, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	r.track(c, s)
	defer r.untrack(c, s)
	done := make(chan struct{})
	go func() { r.pipe(c, s); close(done) }()
	r.pipe(s, c)
	<-done
}

func (r *cutRelay) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		r.mu.Lock()
		for r.paused {
			r.cond.Wait()
		}
		r.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}
