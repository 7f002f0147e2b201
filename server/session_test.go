package server

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
)

func keyed(key []byte) *Server { return &Server{key: key} }

// A token checks out only as the server made it: a changed id, line or
// epoch, a changed mac, another server's key are all refused.
func TestSessionTokenUnforgeable(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, keySize), bytes.Repeat([]byte{2}, keySize)
	s := keyed(k1)
	tok := s.token(7, 3, 2)
	got, err := s.parseToken(tok)
	if err != nil || got != (session{epoch: 7, id: 3, line: 2}) {
		t.Fatalf("own token: %+v, %v", got, err)
	}
	body, mac, _ := cutLast(tok, ".")
	forged := []string{
		"7.4.2." + mac, // another session, same mac
		"7.3.1." + mac, // another line
		"8.3.2." + mac, // another epoch
		body + "." + strings.Repeat("0", 2*macSize), // a made-up mac
		keyed(k2).token(7, 3, 2),                    // another server's
	}
	for _, f := range forged {
		if _, err := s.parseToken(f); status.Code(err) != codes.Unauthenticated {
			t.Errorf("forged token %q: %v, want Unauthenticated", f, err)
		}
	}
	for _, bad := range []string{"", "7.3", "7.3.2", "7.3.2.zz", "a.b.c." + mac, "7.3.2.1." + mac, strings.Repeat("7", 1<<20) + ".3.2." + mac} {
		if _, err := s.parseToken(bad); err == nil {
			t.Errorf("malformed token %q accepted", bad)
		}
	}
}

// The key is made once, private, and read back the same at the next start;
// a damaged one stops the start with a clear message.
func TestLoadKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "session.key")
	k, err := LoadKey(path)
	if err != nil || len(k) != keySize {
		t.Fatalf("first load: %d bytes, %v", len(k), err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi, err)
	}
	again, err := LoadKey(path)
	if err != nil || !bytes.Equal(again, k) {
		t.Fatalf("second load differs: %v", err)
	}
	os.WriteFile(path, []byte("short"), 0o600)
	if _, err := LoadKey(path); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Fatalf("damaged key: %v", err)
	}
}

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
