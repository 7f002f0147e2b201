package server

import (
	"net"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
)

func TestSamePeer(t *testing.T) {
	tcp := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	cases := []struct {
		a, b string
		conn bool
		want bool
	}{
		{"10.0.0.1:5000", "10.0.0.1:5000", true, true},
		{"10.0.0.1:5000", "10.0.0.1:5001", true, false},
		{"10.0.0.1:5000", "10.0.0.1:6000", false, true},
		{"10.0.0.1:5000", "10.0.0.2:5000", false, false},
		{"127.0.0.1:5000", "[::1]:6000", false, true},
		{"127.0.0.1:5000", "10.0.0.1:5000", false, false},
	}
	for _, c := range cases {
		if got := samePeer(tcp(c.a), tcp(c.b), c.conn); got != c.want {
			t.Errorf("samePeer(%s, %s, conn %v) = %v", c.a, c.b, c.conn, got)
		}
	}
}

// One user's sessions at an address are bounded at a quarter of the
// address's, so that a user holding theirs at a shared address leaves
// room for the others there.
func TestSessionsBoundedPerUser(t *testing.T) {
	s, _ := newFuzzServer(t)
	s.cfg.MaxSessions, s.cfg.MaxSessionsPerPeer = 100, 16
	s.mu.Lock()
	defer s.mu.Unlock()
	bob := sessionOwner(access.Identity{User: "bob"}, "10.0.0.1")
	s.peers["10.0.0.1"], s.owners[bob] = 4, 4
	if err := s.admitLocked("10.0.0.1", bob); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("bob's fifth session: %v", err)
	}
	if err := s.admitLocked("10.0.0.1", sessionOwner(access.Identity{User: "alice"}, "10.0.0.1")); err != nil {
		t.Fatalf("alice at bob's address: %v", err)
	}
	if err := s.admitLocked("10.0.0.2", sessionOwner(access.Identity{User: "bob"}, "10.0.0.2")); err != nil {
		t.Fatalf("bob at another address: %v", err)
	}
}
