package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
)

// A session token, "<epoch>.<id>.<line>.<mac>", names a client's session
// on every request. The mac, 128 bits of HMAC-SHA256 under the server's
// key, makes it unforgeable: a process cannot act as another session by
// counting ids, nor claim to continue another client's line of sessions
// (and so reclaim its delegations) by giving the same name. Delegation
// state ids are honoured only for the session holding them, so they need
// no secret of their own. The key outlives restarts (LoadKey), so a token
// of an earlier server life still proves who held what in the grace
// period after a restart.
const (
	keySize = 32
	macSize = 16
	// maxToken is far past the longest token (three 20-digit numbers and
	// the mac): a longer one is not parsed at all.
	maxToken = 128
)

// LoadKey reads the server's session key from path, making one the first
// time (0600: whoever reads it can make tokens).
func LoadKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	switch {
	case err == nil && len(key) == keySize:
		return key, nil
	case err == nil:
		return nil, fmt.Errorf("session key %s: %d bytes, want %d (remove it to make a new one; clients then reconnect)", path, len(key), keySize)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("session key: %w", err)
	}
	key = make([]byte, keySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".session-key-*")
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(key); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	return key, nil
}

// token is the session token of session id, of line, in epoch.
func (s *Server) token(epoch uint64, id, line callback.ClientID) string {
	body := fmt.Sprintf("%d.%d.%d", epoch, id, line)
	return body + "." + hex.EncodeToString(s.mac(body))
}

func (s *Server) mac(body string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(body))
	return m.Sum(nil)[:macSize]
}

// session is what a valid token says.
type session struct {
	epoch    uint64
	id, line callback.ClientID
}

// parseToken checks tok's mac and returns what it says, of any epoch.
func (s *Server) parseToken(tok string) (session, error) {
	if len(tok) > maxToken {
		return session{}, status.Errorf(codes.InvalidArgument, "malformed session token")
	}
	body, sum, ok := cutLast(tok, ".")
	f := strings.Split(body, ".")
	if !ok || len(f) != 3 || len(sum) != 2*macSize {
		return session{}, status.Errorf(codes.InvalidArgument, "malformed session token")
	}
	got, err := hex.DecodeString(sum)
	if err != nil || !hmac.Equal(got, s.mac(body)) {
		return session{}, status.Errorf(codes.Unauthenticated, "session token not made by this server: reconnect")
	}
	var n [3]uint64
	for i := range n {
		if n[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return session{}, status.Errorf(codes.InvalidArgument, "malformed session token")
		}
	}
	return session{epoch: n[0], id: callback.ClientID(n[1]), line: callback.ClientID(n[2])}, nil
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// caller is the session of a control RPC: none (0) without a token; a
// token is honoured on the connection its session's back channel came
// on, as gRPC sends a client's requests on one connection.
func (s *Server) caller(ctx context.Context) (callback.ClientID, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(pb.ClientMetadata)
	if len(vals) == 0 {
		return 0, nil
	}
	var from net.Addr
	if p, ok := peer.FromContext(ctx); ok {
		from = p.Addr
	}
	return s.live(vals[0], from, true)
}

// live checks that tok names a live session of this server life, used
// from from: the very connection of its back channel (sameConn), or the
// same host (the data channel's connections are its own).
func (s *Server) live(tok string, from net.Addr, sameConn bool) (callback.ClientID, error) {
	sess, err := s.parseToken(tok)
	if err != nil {
		return 0, err
	}
	if sess.epoch != s.store.Epoch() {
		return 0, status.Errorf(codes.Unauthenticated, "session from server epoch %d, now %d: reconnect", sess.epoch, s.store.Epoch())
	}
	s.mu.Lock()
	c := s.conns[sess.id]
	known := c != nil && s.cb.Known(sess.id)
	s.mu.Unlock()
	if !known {
		return 0, status.Errorf(codes.Unauthenticated, "unknown client %d: reconnect", sess.id)
	}
	if !samePeer(c.from, from, sameConn) {
		return 0, status.Errorf(codes.Unauthenticated, "session %d used from %v, not from where it connected", sess.id, from)
	}
	return sess.id, nil
}

// samePeer reports whether b is a (the same connection if conn, else the
// same host as a; every loopback address is one host).
func samePeer(a, b net.Addr, conn bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	if conn {
		return a.Network() == b.Network() && a.String() == b.String()
	}
	ha, hb := hostIP(a), hostIP(b)
	if ha == nil || hb == nil {
		return a.Network() == b.Network() && a.String() == b.String()
	}
	return ha.Equal(hb) || ha.IsLoopback() && hb.IsLoopback()
}

func hostIP(a net.Addr) net.IP {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return nil
	}
	return net.ParseIP(host)
}

// previous resolves a Hello's previous session token: the line the new
// session continues (0: a new one), and whether it comes from an earlier
// server life (its holder may reclaim in the grace period). A token that
// does not check out is ignored: the client starts a new line.
func (s *Server) previous(tok string) (line callback.ClientID, restarted bool) {
	if tok == "" || len(tok) > maxToken {
		return 0, false
	}
	sess, err := s.parseToken(tok)
	switch {
	case err != nil:
		s.log.Warn("a previous session token that does not check out", "err", err)
		return 0, false
	case sess.epoch == s.store.Epoch():
		return sess.line, false
	default:
		return 0, sess.epoch < s.store.Epoch()
	}
}
