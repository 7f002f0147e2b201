package testkit

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Fault is how a faulty relay misbehaves (StartFaultyRelay).
type Fault string

const (
	// FaultCut closes the first connection that carries faultAt bytes
	// towards the client, there, as a network that drops a link would.
	FaultCut Fault = "cut"
	// FaultFlipDown corrupts one byte, the one at faultAt, of the first
	// connection that carries that many towards the client (a fetch).
	FaultFlipDown Fault = "flip-down"
	// FaultFlipUp corrupts one byte, the one at faultAt, of the first
	// connection that carries that many towards the server (a store).
	FaultFlipUp Fault = "flip-up"
	// FaultRefuse closes every connection as soon as it is accepted.
	FaultRefuse Fault = "refuse"

	noFault Fault = ""
)

// faultAt is where in a connection's stream a fault strikes: well inside
// the data of a chunk, past any header.
const faultAt = 100_000

// Relay forwards TCP connections to a server. Paused, it holds every byte
// in both directions, as a link that is down but not broken would; cut,
// it closes every connection it carries. A faulty relay also misbehaves
// as its Fault says.
type Relay struct {
	l      net.Listener
	to     string
	fault  Fault
	conns  atomic.Int32
	faults atomic.Int32
	struck atomic.Bool

	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	open   map[net.Conn]struct{} // both ends of every connection carried
}

// StartRelay starts a relay on a free loopback port that forwards every
// connection to the address to, faithfully until paused or cut. It stops
// when the test ends.
func StartRelay(t testing.TB, to string) *Relay {
	t.Helper()
	return StartFaultyRelay(t, to, noFault)
}

// StartFaultyRelay starts a relay, as StartRelay does, that misbehaves
// as fault says: once, in the first connection that carries enough, or,
// with FaultRefuse, on every connection.
func StartFaultyRelay(t testing.TB, to string, fault Fault) *Relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{l: l, to: to, fault: fault, open: map[net.Conn]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	t.Cleanup(func() { r.Pause(false); l.Close(); r.Cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.conns.Add(1)
			go r.serve(c)
		}
	}()
	return r
}

// Addr is the address to dial for the relay.
func (r *Relay) Addr() string { return r.l.Addr().String() }

// Conns is how many connections the relay has accepted.
func (r *Relay) Conns() int { return int(r.conns.Load()) }

// Faults is how many times the relay has misbehaved.
func (r *Relay) Faults() int { return int(r.faults.Load()) }

// Pause holds (on) or releases (off) every byte the relay carries.
func (r *Relay) Pause(on bool) {
	r.mu.Lock()
	r.paused = on
	r.cond.Broadcast()
	r.mu.Unlock()
}

// Cut closes every connection the relay carries and returns how many.
func (r *Relay) Cut() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.open {
		c.Close()
	}
	n := len(r.open) / 2
	clear(r.open)
	return n
}

// carry adds (or with done, removes and closes) a connection's two ends.
func (r *Relay) carry(done bool, cs ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		if done {
			delete(r.open, c)
			c.Close()
		} else {
			r.open[c] = struct{}{}
		}
	}
}

// serve carries the accepted connection c to a new connection to the
// server, both ways, until either end closes.
func (r *Relay) serve(c net.Conn) {
	defer c.Close()
	if r.fault == FaultRefuse {
		r.faults.Add(1)
		return
	}
	s, err := net.DialTimeout("tcp", r.to, 5*time.Second)
	if err != nil {
		return
	}
	r.carry(false, c, s)
	defer r.carry(true, c, s)
	go r.pipe(c, s, r.fault == FaultCut || r.fault == FaultFlipDown)
	r.pipe(s, c, r.fault == FaultFlipUp)
}

// pipe copies src to dst, holding what it read while the relay is
// paused, and strikes the relay's fault if fault says this direction
// carries it. It closes both when either fails.
func (r *Relay) pipe(dst, src net.Conn, fault bool) {
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	var at int
	for {
		n, err := src.Read(buf)
		r.mu.Lock()
		for r.paused {
			r.cond.Wait()
		}
		r.mu.Unlock()
		if n > 0 && fault && at <= faultAt && faultAt < at+n && r.struck.CompareAndSwap(false, true) {
			r.faults.Add(1)
			if r.fault == FaultCut {
				dst.Write(buf[:faultAt-at])
				return
			}
			buf[faultAt-at] ^= 0x20
		}
		at += n
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
