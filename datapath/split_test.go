package datapath

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/node"
)

var testFID = node.FID{Volume: 1, Vnode: 2, Unique: 3}

// fakeServer answers fetches of a fixed file. Its first connection can be
// made to misbehave once.
type fakeServer struct {
	l      net.Listener
	data   []byte
	fault  fault
	conns  atomic.Int32
	closed atomic.Int32
}

type fault int

const (
	none      fault = iota
	cut             // break the connection mid-reply
	flip            // corrupt a byte of the data
	short           // announce fewer bytes than the range holds
	badCRC          // send a wrong checksum
	refuse          // answer as a server that does not speak the protocol
	corruptIn       // (store) corrupt a byte of the piece on its way in
	idleClose       // close a connection that waits 50 ms for a request
)

func newFakeServer(t *testing.T, data []byte, fault fault) *fakeServer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{l: l, data: data, fault: fault}
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
	defer f.closed.Add(1)
	defer conn.Close()
	br := bufio.NewReader(conn)
	for {
		if f.fault == idleClose {
			conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		}
		req, err := ReadRequest(br)
		if err != nil {
			if errors.Is(err, ErrBadRequest) {
				conn.Write(AppendError(nil, ErrProtocol, err.Error()))
			}
			return
		}
		if f.fault == refuse {
			conn.Write(AppendError(nil, ErrProtocol, "bad magic"))
			return
		}
		if req.Op == OpStore {
			f.store(conn, br, req, first)
			continue
		}
		if req.FID != testFID {
			conn.Write(AppendError(nil, uint32(syscall.ESTALE), "no such fid"))
			continue
		}
		st, _ := proto.Marshal(pb.FromStatus(node.Status{FID: testFID, Type: node.TypeFile, Size: uint64(len(f.data)), DataVersion: 9}, time.Minute))
		start := min(int(req.Offset), len(f.data))
		body := bytes.Clone(f.data[start:min(int(req.Offset+req.Length), len(f.data))])
		crc := Checksum(0, body)
		if first {
			switch f.fault {
			case cut:
				conn.Write(AppendOK(nil, st, uint64(len(body))))
				conn.Write(body[:len(body)/2])
				return
			case flip:
				body[len(body)/3] ^= 1
			case short:
				body = body[:len(body)-1]
				crc = Checksum(0, body)
			case badCRC:
				crc++
			}
		}
		conn.Write(AppendCRC(append(AppendOK(nil, st, uint64(len(body))), body...), crc))
	}
}

// store takes a store into f.data (whole pieces only, as a test needs).
func (f *fakeServer) store(conn net.Conn, br *bufio.Reader, req Request, first bool) {
	hdr := make([]byte, req.Length)
	io.ReadFull(br, hdr)
	bad := false
	for {
		off, n, err := ReadPiece(br)
		if err != nil || n == 0 {
			break
		}
		p := make([]byte, n)
		io.ReadFull(br, p)
		crc, _ := ReadCRC(br)
		if first && f.fault == corruptIn {
			p[0] ^= 1
		}
		if crc != Checksum(0, p) {
			bad = true
			continue
		}
		f.data = append(f.data[:min(int(off), len(f.data))], p...)
	}
	if bad {
		conn.Write(AppendError(nil, ErrChecksum, "checksum mismatch"))
		return
	}
	st, _ := proto.Marshal(pb.FromStatus(node.Status{FID: testFID, Type: node.TypeFile, Size: uint64(len(f.data)), DataVersion: 10}, time.Minute))
	conn.Write(AppendCRC(AppendOK(nil, st, 0), 0))
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
	s := NewSplit(srv.l.Addr().String(), 2, fb, func() string { return "1.1" }, nil)
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

// A connection dropped mid-chunk, a reply whose length or checksum is
// wrong: the fetch is retried on another connection and the sink sees only
// the whole, right bytes.
func TestSplitRetriesBadReplies(t *testing.T) {
	data := bytes.Repeat([]byte("abcdefgh"), 50000)
	for name, fl := range map[string]fault{"cut": cut, "flip": flip, "short": short, "crc": badCRC} {
		t.Run(name, func(t *testing.T) {
			srv := newFakeServer(t, data, fl)
			fb := &fallbackPath{}
			s := NewSplit(srv.l.Addr().String(), 2, fb, func() string { return "" }, nil)
			defer s.Close()
			_, got, err := fetch(t, s, testFID, 0, int64(len(data)))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("fetch across a bad reply: %d bytes, %v", len(got), err)
			}
			if srv.conns.Load() != 2 || fb.used.Load() != 0 {
				t.Fatalf("%d connections, fallback used %d times", srv.conns.Load(), fb.used.Load())
			}
		})
	}
}

// A server without a data channel, or one that refuses it: the gRPC path
// serves the call, and the channel is left alone for a while.
func TestSplitFallsBack(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l.Addr().String()
	l.Close()
	refusing := newFakeServer(t, nil, refuse)
	for name, addr := range map[string]string{"closed": closed, "refusing": refusing.l.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			fb := &fallbackPath{}
			s := NewSplit(addr, 2, fb, func() string { return "" }, nil)
			defer s.Close()
			for i := 1; i <= 3; i++ {
				_, got, err := fetch(t, s, testFID, 0, 10)
				if err != nil || string(got) != "fallback" || fb.used.Load() != int32(i) {
					t.Fatalf("fallback: %q %v used %d", got, err, fb.used.Load())
				}
			}
			if _, _, err := s.Store(context.Background(), StoreArgs{FID: testFID}); err != nil || fb.used.Load() != 4 {
				t.Fatalf("store: %v, fallback used %d", err, fb.used.Load())
			}
		})
	}
	if n := refusing.conns.Load(); n != 2 {
		t.Fatalf("refusing server dialled %d times, want 2 (then left alone)", n)
	}
}

// Pooled connections the server closed while they idled (its idle
// timeout): the call is made again on a fresh connection, not sent to the
// fallback nor failed, however many of them the pool holds.
func TestSplitRedialsClosedIdle(t *testing.T) {
	srv := newFakeServer(t, []byte("fresh"), idleClose)
	fb := &fallbackPath{}
	s := NewSplit(srv.l.Addr().String(), 2, fb, func() string { return "" }, nil)
	defer s.Close()
	ctx := context.Background()
	a, err := s.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.put(a, false)
	s.put(b, false)
	poll.Wait(t, 5*time.Second, "the server closing the idle connections", func() bool { return srv.closed.Load() >= 2 })
	if _, got, err := fetch(t, s, testFID, 0, 10); err != nil || string(got) != "fresh" {
		t.Fatalf("fetch after the pool went stale: %q %v", got, err)
	}
	if fb.used.Load() != 0 || srv.conns.Load() != 3 {
		t.Fatalf("fallback used %d times, %d connections, want 0 and 3", fb.used.Load(), srv.conns.Load())
	}
}

// Stores go over the channel with a checksum per piece; a piece corrupted
// on the way is refused by the server and the store sent again.
func TestSplitStore(t *testing.T) {
	want := bytes.Repeat([]byte("0123456789abcdef"), 300000) // several pieces
	for name, fl := range map[string]fault{"clean": none, "corrupted": corruptIn} {
		t.Run(name, func(t *testing.T) {
			srv := newFakeServer(t, nil, fl)
			fb := &fallbackPath{}
			s := NewSplit(srv.l.Addr().String(), 2, fb, func() string { return "" }, nil)
			defer s.Close()
			st, _, err := s.Store(context.Background(), StoreArgs{FID: testFID,
				Ranges: []Range{{0, int64(len(want))}},
				Read:   func(p []byte, off int64) error { copy(p, want[off:]); return nil }})
			if err != nil || st.DataVersion != 10 || !bytes.Equal(srv.data, want) {
				t.Fatalf("store: %v, dv %d, %d bytes stored", err, st.DataVersion, len(srv.data))
			}
			if fb.used.Load() != 0 {
				t.Fatalf("fallback used")
			}
		})
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
		{Op: OpStore, Length: maxStatus + 1},
	} {
		if _, err := ReadRequest(bufio.NewReader(bytes.NewReader(AppendRequest(nil, bad)))); !errors.Is(err, ErrBadRequest) {
			t.Errorf("request %+v accepted: %v", bad, err)
		}
	}
	rep, err := ReadReply(bufio.NewReader(bytes.NewReader(AppendError(nil, 5, "boom"))))
	if err != nil || rep.Errno != 5 || rep.Message != "boom" {
		t.Fatalf("error reply: %+v %v", rep, err)
	}
	if _, _, err := ReadPiece(bufio.NewReader(bytes.NewReader(AppendPiece(nil, 0, MaxPiece+1)))); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("oversized piece accepted: %v", err)
	}
}

// FuzzReadRequest: the server's request decoder refuses or accepts any
// bytes without panicking, and what it accepts is within bounds.
func FuzzReadRequest(f *testing.F) {
	f.Add(AppendRequest(nil, Request{Op: OpFetch, Session: "1.1", FID: testFID, Length: 10}))
	f.Add([]byte("HDF3\x01\xff\xff"))
	f.Add(append(AppendPiece(AppendRequest(nil, Request{Op: OpStore, FID: testFID}), 0, 3), "abc\x00\x00\x00\x00"...))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ReadRequest(bufio.NewReader(bytes.NewReader(b)))
		if err == nil && (req.Length > MaxFetch || len(req.Session) > maxSession || req.Op != OpFetch && req.Op != OpStore) {
			t.Fatalf("accepted %+v", req)
		}
		if err != nil {
			return
		}
		// What follows a store's header: pieces, each within bounds.
		br := bufio.NewReader(bytes.NewReader(b[len(AppendRequest(nil, req)):]))
		for {
			off, n, err := ReadPiece(br)
			if err != nil || n == 0 {
				return
			}
			if n > MaxPiece || off > maxOffset {
				t.Fatalf("accepted piece %d+%d", off, n)
			}
			if _, err := br.Discard(n + 4); err != nil {
				return
			}
		}
	})
}
