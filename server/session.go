package server

import (
	"context"
	"net"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/server/session"
)

// Which session a request is of: its token (package session), honoured
// only from where the session connected.

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
	sess, err := s.key.Parse(tok)
	if err != nil {
		return 0, err
	}
	if sess.Epoch != s.store.Epoch() {
		return 0, status.Errorf(codes.Unauthenticated, "session from server epoch %d, now %d: reconnect", sess.Epoch, s.store.Epoch())
	}
	s.mu.Lock()
	c := s.conns[sess.ID]
	known := c != nil && s.cb.Known(sess.ID)
	s.mu.Unlock()
	if !known {
		return 0, status.Errorf(codes.Unauthenticated, "unknown client %d: reconnect", sess.ID)
	}
	if !samePeer(c.from, from, sameConn) {
		return 0, status.Errorf(codes.Unauthenticated, "session %d used from %v, not from where it connected", sess.ID, from)
	}
	return sess.ID, nil
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
	if tok == "" || len(tok) > session.MaxToken {
		return 0, false
	}
	sess, err := s.key.Parse(tok)
	switch {
	case err != nil:
		s.log.Warn("a previous session token that does not check out", "err", err)
		return 0, false
	case sess.Epoch == s.store.Epoch():
		return sess.Line, false
	default:
		return 0, sess.Epoch < s.store.Epoch()
	}
}
