package datapath

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

var testFID = node.FID{Volume: 1, Vnode: 2, Unique: 3}

// fakeServer answers fetches of a fixed file; cut > 0 makes the first
// connection break after sending cut bytes of data.
type fakeServer struct {
	l     net.Listener
	data  []byte
	cut   int
	conns atomic.Int32
}

func newFakeServer(t *testing.T, data []byte, cut int) *fakeServer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{l: l, data: data, cut: cut}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			first := f.conns.Add(1) == 1
			go f.serve(conn, first)
		}
	}()
	return f
}

func (f *fakeServer) serve(conn net.Conn, first bool) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for {
		req, err := ReadRequest(br)
		if err != nil {
			if errors.Is(err, ErrBadRequest) {
				conn.Write(AppendError(nil, uint32(syscall.EINVAL), err.Error()))
			}
			return
		}
		if req.FID != testFID {
			conn.Write(AppendError(nil, uint32(syscall.ESTALE), "no such fid"))
			continue
		}
		st, _ := proto.Marshal(pb.FromStatus(node.Status{FID: testFID, Type: node.TypeFile, Size: uint64(len(f.data)), DataVersion: 9}, time.Minute))
		start := min(int(req.Offset), len(f.data))
		body := f.data[start:min(int(req.Offset+req.Length), len(f.data))]
		conn.Write(AppendOK(nil, st, uint64(len(body))))
		if first && f.cut > 0 {
			conn.Write(body[:f.cut])
			return // break mid-reply
		}
		conn.Write(body)
	}
}

// fallbackPath records that it was used.
type fallbackPath struct{ used atomic.Int32 }

func (p *fallbackPath) Fetch(ctx context.Context, fid node.FID, off, n int64, piece int, sink Sink) (node.Status, time.Duration, error) {
	p.used.Add(1)
	return node.Status{FID: fid, Type: node.TypeFile}, 0, sink(off, 1, []byte("fallback"))
}

func (p *fallbackPath) Store(ctx context.Context, a StoreArgs) (node.Status, time.Duration, error) {
	p.used.Add(1)
	return node.Status{}, 0, nil
}

func fetch(t *testing.T, s *Split, fid node.FID, off, n int64) (node.Status, []byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []byte
	st, _, err := s.Fetch(ctx, fid, off, n, 0, func(o int64, dv uint64, data []byte) error {
		if o != off {
			t.Errorf("sink at %d, want %d", o, off)
		}
		got = append(got, data...)
		return nil
	})
	return st, got, err
}

func TestSplitFetch(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 100000)
	srv := newFakeServer(t, data, 0)
	fb := &fallbackPath{}
	s := NewSplit(srv.l.Addr().String(), 2, fb, func() string { return "1.1" })
	defer s.Close()
	for _, r := range [][2]int64{{0, 262144}, {500000, 262144}, {999990, 100}, {2000000, 10}} {
		st, got, err := fetch(t, s, testFID, r[0], r[1])
		if err != nil {
			t.Fatal(err)
		}
		want := data[min(int(r[0]), len(data)):min(int(r[0]+r[1]), len(data))]
		if !bytes.Equal(got, want) || st.DataVersion != 9 {
			t.Fatalf("range %v: %d bytes, dv %d", r, len(got), st.DataVersion)
		}
	}
	// The server's own answer is an error with its errno, not a reason to
	// fall back.
	if _, _, err := fetch(t, s, node.FID{Volume: 1, Vnode: 9, Unique: 9}, 0, 10); pb.Errno(err) != syscall.ESTALE {
		t.Fatalf("fetch of an unknown fid: %v", err)
	}
	if fb.used.Load() != 0 || srv.conns.Load() > 2 {
		t.Fatalf("fallback used %d times, %d connections (limit 2)", fb.used.Load(), srv.conns.Load())
	}
}

// A connection dropped mid-chunk: the fetch is retried on another
// connection and the sink sees only the whole, right bytes.
func TestSplitRetriesBrokenConnection(t *testing.T) {
	data := bytes.Repeat([]byte("abcdefgh"), 50000)
	srv := newFakeServer(t, data, 1000)
	fb := &fallbackPath{}
	s := NewSplit(srv.l.Addr().String(), 2, fb, func() string { return "" })
	defer s.Close()
	_, got, err := fetch(t, s, testFID, 0, int64(len(data)))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetch across a broken connection: %d bytes, %v", len(got), err)
	}
	if srv.conns.Load() != 2 || fb.used.Load() != 0 {
		t.Fatalf("%d connections, fallback used %d times", srv.conns.Load(), fb.used.Load())
	}
}

// A server without a data channel: the gRPC path serves the fetch.
func TestSplitFallsBack(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	fb := &fallbackPath{}
	s := NewSplit(addr, 2, fb, func() string { return "" })
	_, got, err := fetch(t, s, testFID, 0, 10)
	if err != nil || string(got) != "fallback" || fb.used.Load() != 1 {
		t.Fatalf("fallback: %q %v used %d", got, err, fb.used.Load())
	}
}

func TestFrameRoundTrip(t *testing.T) {
	req := Request{Op: OpFetch, Session: "7.42", FID: testFID, Offset: 123, Length: 456}
	got, err := ReadRequest(bufio.NewReader(bytes.NewReader(AppendRequest(nil, req))))
	if err != nil || got != req {
		t.Fatalf("request round trip: %+v %v", got, err)
	}
	for _, bad := range []Request{
		{Op: 9, FID: testFID},
		{Op: OpFetch, Length: MaxFetch + 1},
		{Op: OpFetch, Offset: 1 << 63},
		{Op: OpFetch, Session: string(make([]byte, 300))},
	} {
		if _, err := ReadRequest(bufio.NewReader(bytes.NewReader(AppendRequest(nil, bad)))); !errors.Is(err, ErrBadRequest) {
			t.Errorf("request %+v accepted: %v", bad, err)
		}
	}
	rep, err := ReadReply(bufio.NewReader(bytes.NewReader(AppendError(nil, 5, "boom"))))
	if err != nil || rep.Errno != 5 || rep.Message != "boom" {
		t.Fatalf("error reply: %+v %v", rep, err)
	}
}

// FuzzReadRequest: the server's request decoder refuses or accepts any
// bytes without panicking, and what it accepts is within bounds.
func FuzzReadRequest(f *testing.F) {
	f.Add(AppendRequest(nil, Request{Op: OpFetch, Session: "1.1", FID: testFID, Length: 10}))
	f.Add([]byte("HDF1\x01\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ReadRequest(bufio.NewReader(bytes.NewReader(b)))
		if err == nil && (req.Length > MaxFetch || len(req.Session) > maxSession || req.Op != OpFetch) {
			t.Fatalf("accepted %+v", req)
		}
	})
}
