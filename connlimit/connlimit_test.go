package connlimit

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// limited serves New(l, max, perPeer) on loopback: accepted connections
// come out of acc; the refuse hook writes why to the peer.
func limited(t *testing.T, max, perPeer int) (*Listener, chan net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := New(l, max, perPeer, func(c net.Conn, why error) { io.WriteString(c, why.Error()) })
	t.Cleanup(func() { ll.Close() })
	acc := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ll.Accept()
			if err != nil {
				return
			}
			acc <- c
		}
	}()
	return ll, acc
}

// dialFrom connects to l from the loopback address ip and says whether it
// was admitted: the server either hands it to acc or writes why it was
// refused and closes it.
func dialFrom(t *testing.T, l net.Listener, acc chan net.Conn, ip string) (net.Conn, string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	why := make(chan string, 1)
	go func() {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		why <- string(b)
	}()
	select {
	case s := <-acc:
		t.Cleanup(func() { s.Close() })
		return s, ""
	case w := <-why:
		return nil, w
	case <-time.After(5 * time.Second):
		t.Fatal("connection neither accepted nor refused")
		return nil, ""
	}
}

func TestBounds(t *testing.T) {
	l, acc := limited(t, 3, 2)
	a, _ := dialFrom(t, l, acc, "127.0.0.1")
	if b, _ := dialFrom(t, l, acc, "127.0.0.1"); a == nil || b == nil {
		t.Fatal("connections within the bounds refused")
	}
	if c, why := dialFrom(t, l, acc, "127.0.0.1"); c != nil || !strings.Contains(why, "2 connections open from 127.0.0.1") {
		t.Fatalf("a third connection from one peer, bound 2: admitted %v, %q", c != nil, why)
	}
	if c, _ := dialFrom(t, l, acc, "127.0.0.2"); c == nil {
		t.Fatal("another peer refused below the total bound")
	}
	if c, why := dialFrom(t, l, acc, "127.0.0.3"); c != nil || !strings.Contains(why, "3 connections open,") {
		t.Fatalf("a connection past the total bound 3: admitted %v, %q", c != nil, why)
	}
	if st := l.Stats(); st != (Stats{Open: 3, Accepted: 3, Refused: 2}) {
		t.Fatalf("stats %+v", st)
	}
	// A place is freed once however often its connection is closed.
	a.Close()
	a.Close()
	if st := l.Stats(); st.Open != 2 {
		t.Fatalf("%d open after a close, want 2", st.Open)
	}
	if c, why := dialFrom(t, l, acc, "127.0.0.1"); c == nil {
		t.Fatalf("refused after a place was freed: %q", why)
	}
	if c, _ := dialFrom(t, l, acc, "127.0.0.4"); c != nil {
		t.Fatal("admitted past the total bound after it was reached again")
	}
}

func TestNoBounds(t *testing.T) {
	l, acc := limited(t, 0, 0)
	for range 10 {
		if c, why := dialFrom(t, l, acc, "127.0.0.1"); c == nil {
			t.Fatalf("refused without bounds: %q", why)
		}
	}
}

// The accepted connection still offers its socket (the data channel sends
// with sendfile through it), and Accept passes the listener's close on.
func TestConnKeepsSocket(t *testing.T) {
	l, acc := limited(t, 1, 1)
	c, _ := dialFrom(t, l, acc, "127.0.0.1")
	if _, ok := c.(syscall.Conn); !ok {
		t.Fatalf("accepted %T offers no syscall.Conn", c)
	}
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

func TestPeer(t *testing.T) {
	tcp := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 9} }
	for _, c := range []struct {
		addr net.Addr
		want string
	}{
		{tcp("192.0.2.7"), "192.0.2.7"},
		{tcp("::ffff:192.0.2.7"), "192.0.2.7"},
		{tcp("2001:db8::1"), "2001:db8::/64"},
		{tcp("2001:db8::ffff:1"), "2001:db8::/64"},
		{tcp("2001:db8:0:1::1"), "2001:db8:0:1::/64"},
		{&net.UnixAddr{Name: "/run/s", Net: "unix"}, "/run/s"},
	} {
		if got := Peer(c.addr); got != c.want {
			t.Errorf("Peer(%v) = %q, want %q", c.addr, got, c.want)
		}
	}
}
