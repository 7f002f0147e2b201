package datapath

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Split moves data over the server's bulk-data channel: several TCP
// connections of their own (the "connection clones" of Cache-Bypassing
// AFS Client), each carrying
// one fetch or store at a time, the server sending with sendfile and the
// client reading straight into the chunk's buffer. Calls go to the
// fallback (the gRPC streams) when the channel fails.
type Split struct {
	addr     string
	tls      *tls.Config // nil: plain TCP
	session  func() string
	fallback Path
	conns    chan *dataConn // idle connections
	slots    chan struct{}  // one per connection that may exist
	// restUntil (unix ns) keeps calls on the fallback after the channel
	// failed twice in a row.
	restUntil atomic.Int64
}

type dataConn struct {
	conn   net.Conn
	br     *bufio.Reader
	pooled bool // taken from the pool: it may have idled past the server's timeout
}

// NewSplit uses up to streams connections to addr, in TLS with tlsc if it
// is not nil; session gives the client's current session for promise
// grants.
func NewSplit(addr string, streams int, fallback Path, session func() string, tlsc *tls.Config) *Split {
	if tlsc != nil {
		tlsc = tlsc.Clone()
		tlsc.NextProtos = []string{ALPN}
		if host, _, err := net.SplitHostPort(addr); err == nil && tlsc.ServerName == "" {
			tlsc.ServerName = host
		}
	}
	s := &Split{addr: addr, tls: tlsc, session: session, fallback: fallback,
		conns: make(chan *dataConn, streams), slots: make(chan struct{}, streams)}
	for i := 0; i < streams; i++ {
		s.slots <- struct{}{}
	}
	return s
}

// Close closes the idle connections; busy ones close when they return.
func (s *Split) Close() {
	for {
		select {
		case dc := <-s.conns:
			dc.conn.Close()
			s.slots <- struct{}{}
		default:
			return
		}
	}
}

// get returns an idle connection, or dials one if none is idle and a slot
// is free (a dial costs a round trip).
func (s *Split) get(ctx context.Context) (*dataConn, error) {
	var dc *dataConn
	select {
	case dc = <-s.conns:
	default:
		select {
		case dc = <-s.conns:
		case <-s.slots:
			conn, err := s.dial(ctx)
			if err != nil {
				s.slots <- struct{}{}
				return nil, err
			}
			return &dataConn{conn: conn, br: bufio.NewReaderSize(conn, 64<<10)}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	dc.pooled = true
	return dc, nil
}

// ALPN names the data channel's protocol in its TLS handshake.
const ALPN = "hoard-data/3"

// dial opens a data connection; in TLS, the handshake is done by the
// time it returns, so that a refusal is told apart from a slow reply.
func (s *Split) dial(ctx context.Context) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if s.tls == nil {
		return d.DialContext(ctx, "tcp", s.addr)
	}
	td := tls.Dialer{NetDialer: &d, Config: s.tls}
	return td.DialContext(ctx, "tcp", s.addr)
}

// userOf is the token of the user a call of ctx is made for, as the
// connection put it in the gRPC metadata.
func userOf(ctx context.Context) string {
	md, _ := metadata.FromOutgoingContext(ctx)
	if v := md.Get(pb.UserMetadata); len(v) > 0 {
		return strings.TrimPrefix(v[len(v)-1], "Bearer ")
	}
	return ""
}

func (s *Split) put(dc *dataConn, broken bool) {
	if broken {
		dc.conn.Close()
		s.slots <- struct{}{}
		return
	}
	s.conns <- dc
}

// Fetch implements Path. A connection that breaks mid-reply, or a reply
// whose length or checksum is wrong, is dropped and the fetch retried on
// another; if the channel keeps failing, the gRPC path serves it. The sink
// sees whole, checked replies only.
func (s *Split) Fetch(ctx context.Context, fid node.FID, off, n int64, piece int, sink Sink) (node.Status, time.Duration, error) {
	var st node.Status
	var ttl time.Duration
	err := s.try(ctx, func() error {
		return s.withConn(ctx, func(dc *dataConn) (err error) {
			var data []byte
			st, ttl, data, err = dc.fetch(ctx, s.session(), fid, off, n)
			if err == nil && len(data) > 0 {
				if err = sink(off, st.DataVersion, data); err != nil {
					err = &final{err}
				}
			}
			return err
		})
	})
	if errors.Is(err, errChannelDown) && s.fallback != nil {
		return s.fallback.Fetch(ctx, fid, off, n, piece, sink)
	}
	return st, ttl, err
}

// Store implements Path: the pieces go out with their checksums, and the
// server commits them as one store when the last has arrived. A store
// that fails in transit is sent again whole, which is safe: a store the
// server committed before its reply was lost is not made twice (its op id).
func (s *Split) Store(ctx context.Context, a StoreArgs) (node.Status, time.Duration, error) {
	var st node.Status
	var ttl time.Duration
	err := s.try(ctx, func() error {
		return s.withConn(ctx, func(dc *dataConn) (err error) {
			st, ttl, err = dc.store(ctx, s.session(), a)
			return err
		})
	})
	if errors.Is(err, errChannelDown) && s.fallback != nil {
		return s.fallback.Store(ctx, a)
	}
	return st, ttl, err
}

// final wraps an error that is an answer, not a transport failure: the
// server's own error, or the local side's. It is not retried.
type final struct{ err error }

func (f *final) Error() string { return f.err.Error() }

// errChannelDown sends a call to the fallback path.
var errChannelDown = errors.New("data channel down")

// channelRest is how long the channel is left alone after it failed
// twice in a row, so that a server refusing it costs no more dials.
const channelRest = 10 * time.Second

// try runs once until it fails twice on the channel; a pooled connection
// the server had closed is no failure of the channel, and costs a try
// more (as many as the pool holds). It returns errChannelDown when the call
// should go to the fallback instead.
func (s *Split) try(ctx context.Context, once func() error) error {
	if time.Now().UnixNano() < s.restUntil.Load() && s.fallback != nil {
		return errChannelDown
	}
	var err error
	for failures, stale := 0, 0; failures < 2; {
		err = once()
		var f *final
		if err == nil || errors.As(err, &f) {
			if f != nil {
				err = f.err
			}
			return err
		}
		if ctx.Err() != nil {
			return err
		}
		var sc *staleConn
		if errors.As(err, &sc) && stale < cap(s.conns) {
			stale++
		} else {
			failures++
		}
	}
	if s.fallback == nil {
		return err
	}
	s.restUntil.Store(time.Now().Add(channelRest).UnixNano())
	return errChannelDown
}

// ioTimeout bounds each step of a transfer: a server that stops sending
// or reading is given up on, whatever the caller's own deadline.
const ioTimeout = 30 * time.Second

func (dc *dataConn) deadline(ctx context.Context) { dc.deadlineIn(ctx, ioTimeout) }

func (dc *dataConn) deadlineIn(ctx context.Context, wait time.Duration) {
	dl := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	dc.conn.SetDeadline(dl)
}

// answer decodes a reply, which must begin within wait, and its (empty or
// checked) data.
func (dc *dataConn) answer(ctx context.Context, wait time.Duration, want func(st node.Status) int64) (node.Status, time.Duration, []byte, error) {
	dc.deadlineIn(ctx, wait)
	rep, err := ReadReply(dc.br)
	if err != nil {
		return node.Status{}, 0, nil, err
	}
	switch rep.Errno {
	case 0:
	case ErrSession:
		return node.Status{}, 0, nil, &final{status.Error(codes.Unauthenticated, rep.Message)}
	case ErrChecksum, ErrProtocol:
		return node.Status{}, 0, nil, fmt.Errorf("data channel: %s", rep.Message)
	case ErrElsewhere:
		return node.Status{}, 0, nil, &final{errChannelDown} // this call only
	default:
		return node.Status{}, 0, nil, &final{pb.Err(fmt.Errorf("%s: %w", rep.Message, syscall.Errno(rep.Errno)))}
	}
	var ps pb.Status
	if err := proto.Unmarshal(rep.Status, &ps); err != nil {
		return node.Status{}, 0, nil, fmt.Errorf("data channel: bad status: %w", err)
	}
	st, ttl, err := ps.ToStatus()
	if err != nil {
		return st, 0, nil, &final{err}
	}
	if n := want(st); int64(rep.Length) != n {
		return node.Status{}, 0, nil, fmt.Errorf("data channel: %d bytes for %v, want %d", rep.Length, st.FID, n)
	}
	data := GetBuffer(int(rep.Length))
	for got := 0; got < len(data); {
		dc.deadline(ctx)
		k, err := io.ReadFull(dc.br, data[got:min(len(data), got+MaxPiece)])
		if err != nil {
			return node.Status{}, 0, nil, err
		}
		got += k
	}
	crc, err := ReadCRC(dc.br)
	if err != nil {
		return node.Status{}, 0, nil, err
	}
	if crc != Checksum(0, data) {
		return node.Status{}, 0, nil, fmt.Errorf("data channel: checksum mismatch on %d bytes of %v", len(data), st.FID)
	}
	return st, ttl, data, nil
}

// withConn runs call on a connection of the pool; one whose call failed
// in transit is closed, not reused.
func (s *Split) withConn(ctx context.Context, call func(dc *dataConn) error) error {
	dc, err := s.get(ctx)
	if err != nil {
		return err
	}
	pooled := dc.pooled
	err = call(dc)
	var f *final
	broken := err != nil && !errors.As(err, &f)
	s.put(dc, broken)
	if broken && pooled && closedByPeer(err) {
		return &staleConn{err}
	}
	return err
}

// staleConn is the failure of a pooled connection the server had closed,
// as it does those that idle past its timeout.
type staleConn struct{ err error }

func (e *staleConn) Error() string { return e.err.Error() }
func (e *staleConn) Unwrap() error { return e.err }

// closedByPeer says err is the other end's close (an end of stream or a
// reset), not a timeout or a garbled reply.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (dc *dataConn) fetch(ctx context.Context, session string, fid node.FID, off, n int64) (node.Status, time.Duration, []byte, error) {
	n = min(n, MaxFetch)
	dc.deadline(ctx)
	req := AppendRequest(nil, Request{Op: OpFetch, Session: session, User: userOf(ctx), FID: fid, Offset: uint64(off), Length: uint64(n)})
	if _, err := dc.conn.Write(req); err != nil {
		return node.Status{}, 0, nil, err
	}
	return dc.answer(ctx, ioTimeout, func(st node.Status) int64 {
		return max(0, min(n, int64(st.Size)-off))
	})
}

// smallStore is the largest store sent in one write.
const smallStore = 64 << 10

func (dc *dataConn) store(ctx context.Context, session string, a StoreArgs) (node.Status, time.Duration, error) {
	hdr, err := proto.Marshal(storeHeader(a))
	if err != nil {
		return node.Status{}, 0, &final{err}
	}
	out := append(AppendRequest(nil, Request{Op: OpStore, Session: session, User: userOf(ctx), FID: a.FID, Length: uint64(len(hdr))}), hdr...)
	// A small store goes out in one write, its end included: each write is
	// a system call, and often a packet of its own.
	whole := a.bytes() <= smallStore
	dc.deadline(ctx)
	if !whole {
		if _, err := dc.conn.Write(out); err != nil {
			return node.Status{}, 0, err
		}
		out = out[:0]
	}
	err = a.eachPiece(func(off int64, p []byte) error {
		if whole {
			out = AppendCRC(append(AppendPiece(out, off, len(p)), p...), Checksum(0, p))
			return nil
		}
		dc.deadline(ctx)
		v := net.Buffers{AppendPiece(nil, off, len(p)), p, AppendCRC(nil, Checksum(0, p))}
		_, err := v.WriteTo(dc.conn)
		return err
	})
	var local *localError
	if errors.As(err, &local) {
		return node.Status{}, 0, &final{local}
	}
	if err != nil {
		return node.Status{}, 0, err
	}
	if _, err := dc.conn.Write(AppendPiece(out, 0, 0)); err != nil {
		return node.Status{}, 0, err
	}
	// The server commits before it answers: a synchronous commit of a big
	// store, and the breaks it waits for, take longer than a transfer step.
	st, ttl, _, err := dc.answer(ctx, ioTimeout+time.Duration(a.bytes()>>20)*100*time.Millisecond, func(node.Status) int64 { return 0 })
	return st, ttl, err
}
