// Package connlimit bounds the connections a listener holds open, in all
// and from any one peer, so that a flood of connections costs a server a
// bounded number of descriptors, goroutines and buffers.
package connlimit

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Listener is a net.Listener whose Accept refuses connections past its
// bounds: a refused connection is handed to the refuse hook (if any) and
// closed at once, and Accept goes on to the next, never waiting for a slot.
type Listener struct {
	net.Listener
	max, perPeer int
	refuse       func(net.Conn, error)

	mu    sync.Mutex
	open  int
	peers map[string]int

	accepted, refused atomic.Int64
}

// Stats are a Listener's counters.
type Stats struct {
	Open              int   // connections accepted and not yet closed
	Accepted, Refused int64 // since New
}

// New bounds l at max connections open at once and perPeer from one peer
// (an IP address; an IPv6 /64, which one host usually holds whole); 0 is
// no bound. refuse, if not nil, is given each refused connection and why
// before it is closed, on Accept's goroutine: it must not block (a short
// write to a new socket does not).
func New(l net.Listener, max, perPeer int, refuse func(net.Conn, error)) *Listener {
	return &Listener{Listener: l, max: max, perPeer: perPeer, refuse: refuse, peers: map[string]int{}}
}

// Accept returns the next connection within the bounds. Closing it
// frees its place.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := Peer(c.RemoteAddr())
		if err := l.admit(peer); err != nil {
			l.refused.Add(1)
			if l.refuse != nil {
				l.refuse(c, err)
			}
			c.Close()
			continue
		}
		l.accepted.Add(1)
		lc := &conn{Conn: c, release: func() { l.release(peer) }}
		if _, ok := c.(syscall.Conn); ok {
			return sysConn{lc}, nil
		}
		return lc, nil
	}
}

// Stats returns the listener's counters.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	open := l.open
	l.mu.Unlock()
	return Stats{Open: open, Accepted: l.accepted.Load(), Refused: l.refused.Load()}
}

func (l *Listener) admit(peer string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.open >= l.max {
		return fmt.Errorf("%d connections open, the most this server takes", l.open)
	}
	if n := l.peers[peer]; l.perPeer > 0 && n >= l.perPeer {
		return fmt.Errorf("%d connections open from %s, the most this server takes from one address", n, peer)
	}
	l.open++
	l.peers[peer]++
	return nil
}

func (l *Listener) release(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.peers[peer]--; l.peers[peer] <= 0 {
		delete(l.peers, peer)
	}
}

// Peer is the key connections from addr are counted under: its IP
// address, or for IPv6 its /64.
func Peer(addr net.Addr) string {
	var ip net.IP
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip = a.IP
	default:
		host, _, err := net.SplitHostPort(addr.String())
		if err != nil {
			return addr.String()
		}
		if ip = net.ParseIP(host); ip == nil {
			return host
		}
	}
	if ip.To4() == nil && len(ip) == net.IPv6len {
		return (&net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
	}
	return ip.String()
}

// conn frees its place in the listener when first closed; the place is
// freed before the socket closes, so that a peer that sees the close can
// count on the place being free.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// sysConn keeps the socket reachable (sendfile, socket options) when the
// accepted connection offers it.
type sysConn struct{ *conn }

func (c sysConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}
