package datapath

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Split fetches over the server's bulk-data channel: several TCP
// connections of their own (seed 003's "connection clones"), each carrying
// one fetch at a time, the server sending with sendfile and the client
// reading straight into the chunk's buffer. Stores, and fetches when the
// channel fails, go to Fallback (the gRPC streams).
type Split struct {
	addr     string
	session  func() string
	fallback Path
	conns    chan *dataConn // idle connections
	slots    chan struct{}  // one per connection that may exist
}

type dataConn struct {
	conn net.Conn
	br   *bufio.Reader
}

// NewSplit uses up to streams connections to addr; session gives the
// client's current session for promise grants.
func NewSplit(addr string, streams int, fallback Path, session func() string) *Split {
	s := &Split{addr: addr, session: session, fallback: fallback,
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

// get returns an idle connection, or dials one if a slot is free.
func (s *Split) get(ctx context.Context) (*dataConn, error) {
	select {
	case dc := <-s.conns:
		return dc, nil
	case <-s.slots:
		d := net.Dialer{Timeout: 5 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", s.addr)
		if err != nil {
			s.slots <- struct{}{}
			return nil, err
		}
		return &dataConn{conn: conn, br: bufio.NewReaderSize(conn, 64<<10)}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *Split) put(dc *dataConn, broken bool) {
	if broken {
		dc.conn.Close()
		s.slots <- struct{}{}
		return
	}
	s.conns <- dc
}

// Fetch implements Path. A connection that breaks mid-reply is dropped and
// the fetch retried on another; if the channel keeps failing, the gRPC
// path serves it. The sink sees whole, checked replies only.
func (s *Split) Fetch(ctx context.Context, fid node.FID, off, n int64, piece int, sink Sink) (node.Status, time.Duration, error) {
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		st, ttl, data, err := s.fetchOnce(ctx, fid, off, n)
		if err == nil {
			if len(data) > 0 {
				err = sink(off, st.DataVersion, data)
			}
			return st, ttl, err
		}
		var answer *serverAnswer
		if errors.As(err, &answer) {
			return node.Status{}, 0, answer.err // the server's own answer: not a transport failure
		}
		lastErr = err
		if ctx.Err() != nil {
			return node.Status{}, 0, err
		}
	}
	if s.fallback == nil {
		return node.Status{}, 0, lastErr
	}
	return s.fallback.Fetch(ctx, fid, off, n, piece, sink)
}

// serverAnswer wraps an error the server sent, as opposed to a broken
// connection.
type serverAnswer struct{ err error }

func (a *serverAnswer) Error() string { return a.err.Error() }

func (s *Split) fetchOnce(ctx context.Context, fid node.FID, off, n int64) (node.Status, time.Duration, []byte, error) {
	dc, err := s.get(ctx)
	if err != nil {
		return node.Status{}, 0, nil, err
	}
	broken := true
	defer func() { s.put(dc, broken) }()
	if dl, ok := ctx.Deadline(); ok {
		dc.conn.SetDeadline(dl)
	} else {
		dc.conn.SetDeadline(time.Time{})
	}
	req := AppendRequest(nil, Request{Op: OpFetch, Session: s.session(), FID: fid, Offset: uint64(off), Length: uint64(min(n, MaxFetch))})
	if _, err := dc.conn.Write(req); err != nil {
		return node.Status{}, 0, nil, err
	}
	rep, err := ReadReply(dc.br)
	if err != nil {
		return node.Status{}, 0, nil, err
	}
	if rep.Errno != 0 {
		broken = false
		if rep.Errno == ErrSession {
			return node.Status{}, 0, nil, &serverAnswer{status.Error(codes.Unauthenticated, rep.Message)}
		}
		errno := syscall.Errno(rep.Errno)
		return node.Status{}, 0, nil, &serverAnswer{pb.Err(fmt.Errorf("%s: %w", rep.Message, errno))}
	}
	var ps pb.Status
	if err := proto.Unmarshal(rep.Status, &ps); err != nil {
		return node.Status{}, 0, nil, fmt.Errorf("data channel: bad status: %w", err)
	}
	st, ttl, err := ps.ToStatus()
	if err != nil {
		return st, 0, nil, err
	}
	data := make([]byte, rep.Length)
	if _, err := io.ReadFull(dc.br, data); err != nil {
		return node.Status{}, 0, nil, err
	}
	broken = false
	return st, ttl, data, nil
}

// Store implements Path through the fallback path.
func (s *Split) Store(ctx context.Context, a StoreArgs) (node.Status, time.Duration, error) {
	return s.fallback.Store(ctx, a)
}
