// Package datachan is the server end of the bulk-data channel: file
// contents go to the socket on connections that carry nothing else, so
// control RPCs are never queued behind them, from the vnode file with
// sendfile where the backend keeps local files (a proxy's go through a
// buffer); stores come in on the same connections. The channel moves and
// checks the bytes; whose session a request is, whom it acts for and
// what it may do are the file server's, asked through a Handler.
package datachan

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/connlimit"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Handler is the file server behind the channel.
type Handler interface {
	// Session is the live session a request's token names, used from
	// from (its own host: the channel's connections are its own).
	Session(token string, from net.Addr) (callback.ClientID, error)
	// BeginFetch begins session id's fetch of f for the user whose token
	// is user (none: ""), on a connection in state (nil: not TLS): it
	// checks the right to read, and recalls other clients' write
	// delegations on f.
	BeginFetch(id callback.ClientID, user string, state *tls.ConnectionState, f node.FID) (Fetch, error)
	// BeginStore is BeginFetch for a store whose header is hdr: it waits
	// out the grace period after a restart (until ctx ends), checks the
	// right to write, and begins the staged update.
	BeginStore(ctx context.Context, id callback.ClientID, user string, state *tls.ConnectionState, hdr *pb.StoreRequest) (Store, error)
	// Elsewhere reports whether err is of a volume held elsewhere now,
	// or being handed over: the client asks over gRPC, whose answer says
	// where, or to send again.
	Elsewhere(err error) bool
}

// Fetch is one fetch begun.
type Fetch interface {
	// Status is st as the reply carries it, granting the caller a promise.
	Status(st node.Status) *pb.Status
	// ReadAt reads the file's bytes, and the status of their version.
	ReadAt(p []byte, off int64) (int, node.Status, error)
}

// Store is one store begun.
type Store interface {
	// Status is as Fetch's.
	Status(st node.Status) *pb.Status
	Write(p []byte, off int64) error
	// Fail says Write failed: a stage the store adds to is dropped, as
	// the writes it lost would be missing from its publication.
	Fail(err error)
	// Finish commits the store and says the file's status after it.
	Finish(ctx context.Context) (node.Status, error)
	// Release ends the store, whether finished or not.
	Release()
}

// Counts are the channel's connections and bytes, for the server's load.
type Counts struct {
	Open, Accepted, Sent, Received atomic.Int64
}

// Config is what Serve needs beside its Handler.
type Config struct {
	// MaxConns and MaxConnsPerPeer bound the connections open at once, in
	// all and from one IP address (0: no bound).
	MaxConns, MaxConnsPerPeer int
	// RequestTimeout is how long a connection has to send a whole request
	// once it begins one, and its first once it opens; IdleTimeout how
	// long it may wait between requests.
	RequestTimeout, IdleTimeout time.Duration
	// TLS, if set, secures the channel.
	TLS *tls.Config
	// Files, if set, is where fetches are sent from (nil: through
	// Fetch.ReadAt).
	Files  Files
	Counts *Counts
	Log    *slog.Logger
}

type channel struct {
	h   Handler
	cfg Config
	log *slog.Logger
}

// Serve serves the channel on l for h until l is closed.
func Serve(l net.Listener, h Handler, cfg Config) {
	c := &channel{h: h, cfg: cfg, log: cfg.Log}
	// A flood's lines are thinned by the process's log (lograte).
	var lim net.Listener = connlimit.New(l, cfg.MaxConns, cfg.MaxConnsPerPeer, func(conn net.Conn, why error) {
		// A client reads this as a channel it cannot use, and moves the
		// transfer to gRPC.
		conn.Write(datapath.AppendError(nil, datapath.ErrProtocol, "data connection refused: "+why.Error()))
		c.log.Warn("data connection refused", "from", conn.RemoteAddr(), "why", why)
	})
	if cfg.TLS != nil {
		// The handshake happens at the first read, under the deadline
		// of the connection's first request.
		tc := cfg.TLS.Clone()
		tc.NextProtos = []string{datapath.ALPN}
		lim = tls.NewListener(lim, tc)
	}
	go c.accept(lim)
}

// accept serves l's connections until l is closed. A failed accept (out
// of descriptors, most often, in a flood) is retried after a pause that
// grows from 5 ms to 1 s, as net/http's Server does: the channel must
// outlive the flood.
func (c *channel) accept(l net.Listener) {
	var delay time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			c.log.Error("data channel: accept failed, retrying", "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		go c.serve(conn)
	}
}

func (c *channel) serve(conn net.Conn) {
	c.cfg.Counts.Open.Add(1)
	c.cfg.Counts.Accepted.Add(1)
	defer c.cfg.Counts.Open.Add(-1)
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	// A new connection's first request is due whole soon after it opens.
	conn.SetReadDeadline(time.Now().Add(c.cfg.RequestTimeout))
	for {
		req, err := datapath.ReadRequest(br)
		if err != nil {
			if errors.Is(err, datapath.ErrBadRequest) {
				conn.Write(datapath.AppendError(nil, datapath.ErrProtocol, err.Error()))
			}
			return
		}
		if req.Op == datapath.OpStore {
			err = c.serveStore(conn, br, req)
		} else {
			err = c.serveFetch(conn, req)
		}
		if err != nil {
			return // the connection is unusable (a write failed mid-reply)
		}
		// Between requests the connection waits in its client's pool, for
		// a while; a request begun must then arrive whole in time, however
		// slowly it trickles in.
		conn.SetReadDeadline(time.Now().Add(c.cfg.IdleTimeout))
		if _, err := br.Peek(1); err != nil {
			return
		}
		conn.SetReadDeadline(time.Now().Add(c.cfg.RequestTimeout))
	}
}

// replyError answers a request with err's errno (EIO if it has none),
// also one a proxy's origin answered with; ErrElsewhere for a volume
// that is not here (Handler.Elsewhere).
func (c *channel) replyError(conn net.Conn, err error) error {
	errno := uint32(pb.Errno(err))
	if c.h.Elsewhere(err) {
		errno = datapath.ErrElsewhere
	}
	_, werr := conn.Write(datapath.AppendError(nil, errno, err.Error()))
	return werr
}

// session identifies the client of a request: a live session, used from
// its own host. A request without one is refused: file contents go only
// to clients the server knows.
func (c *channel) session(sess string, from net.Addr) (callback.ClientID, error) {
	if sess == "" {
		return 0, errors.New("data channel: no session: say Hello first")
	}
	return c.h.Session(sess, from)
}

// tlsState is conn's TLS state, nil if it is not TLS: the certificate a
// request without a token is trusted by.
func tlsState(conn net.Conn) *tls.ConnectionState {
	tc, ok := conn.(*tls.Conn)
	if !ok {
		return nil
	}
	cs := tc.ConnectionState()
	return &cs
}

// serveFetch answers one fetch; an error means the connection broke.
func (c *channel) serveFetch(conn net.Conn, req datapath.Request) error {
	id, err := c.session(req.Session, conn.RemoteAddr())
	if err != nil {
		_, werr := conn.Write(datapath.AppendError(nil, datapath.ErrSession, err.Error()))
		return werr
	}
	if req.FID.Volume == 0 || req.FID.Vnode == 0 {
		return c.replyError(conn, fmt.Errorf("fetch: zero fid: %w", syscall.EINVAL))
	}
	f, err := c.h.BeginFetch(id, req.User, tlsState(conn), req.FID)
	if err != nil {
		return c.replyError(conn, err)
	}
	// The file's lock is not held while the reply goes out (sendPinned),
	// but a client that stops reading must not hold the connection and
	// the pinned version for ever either.
	conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	defer conn.SetWriteDeadline(time.Time{})
	var werr error
	var dv uint64
	if c.log.Enabled(context.Background(), slog.LevelDebug) { // a hot path
		defer func() {
			c.log.Debug("data fetch", "client", id, "fid", req.FID, "off", req.Offset, "len", req.Length, "version", dv, "err", err)
		}()
	}
	if c.cfg.Files != nil {
		dv, werr, err = c.sendPinned(conn, f, req)
	} else {
		dv, werr, err = c.sendRead(conn, f, req)
	}
	if werr != nil {
		return werr
	}
	if err != nil {
		return c.replyError(conn, err)
	}
	return nil
}

// maxReadFetch bounds a fetch served through a buffer (sendRead): clients
// ask for a chunk at a time.
const maxReadFetch = 16 << 20

// sendRead answers a fetch from a backend whose bytes are not in local
// files (a proxy's store): the range is read whole, of one version, then
// sent. werr means the connection broke; err is the fetch's.
func (c *channel) sendRead(conn net.Conn, f Fetch, req datapath.Request) (dv uint64, werr, err error) {
	if req.Length > maxReadFetch {
		return 0, nil, fmt.Errorf("fetch %v: %d bytes at once, at most %d here: %w", req.FID, req.Length, maxReadFetch, syscall.EINVAL)
	}
	buf := datapath.GetBuffer(int(req.Length))
	defer datapath.PutBuffer(buf)
	n, st, err := f.ReadAt(buf[:req.Length], int64(req.Offset))
	if err == io.EOF {
		n, err = 0, nil
	}
	if err != nil {
		return 0, nil, err
	}
	if st.Type != node.TypeFile {
		return 0, nil, fmt.Errorf("fetch %v: %w", req.FID, syscall.EISDIR)
	}
	status, err := proto.Marshal(f.Status(st))
	if err != nil {
		return 0, nil, err
	}
	out := datapath.AppendOK(nil, status, uint64(n))
	if _, werr = conn.Write(out); werr == nil {
		if _, werr = conn.Write(buf[:n]); werr == nil {
			c.cfg.Counts.Sent.Add(int64(n))
			_, werr = conn.Write(datapath.AppendCRC(nil, datapath.Checksum(0, buf[:n])))
		}
	}
	return st.DataVersion, werr, nil
}

// serveStore receives one store's pieces, checks each piece's checksum,
// and commits them as one store after the last. The whole request is read
// even when the store fails early, so that the connection stays in step;
// an error means the connection broke or fell out of step.
func (c *channel) serveStore(conn net.Conn, br *bufio.Reader, req datapath.Request) error {
	hb := make([]byte, req.Length) // part of the request, due with it
	if _, err := io.ReadFull(br, hb); err != nil {
		return err
	}
	var hdr pb.StoreRequest
	if err := proto.Unmarshal(hb, &hdr); err != nil {
		conn.Write(datapath.AppendError(nil, datapath.ErrProtocol, "store header: "+err.Error()))
		return err
	}
	hdr.Fid = pb.FromFID(req.FID)
	var x Store
	f := req.FID
	id, sessErr := c.session(req.Session, conn.RemoteAddr())
	failed := sessErr
	if failed == nil {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		x, failed = c.h.BeginStore(ctx, id, req.User, tlsState(conn), &hdr)
		cancel()
	}
	if x != nil {
		defer x.Release()
	}
	badCRC := false
	// The pieces have a request's time, and more for each byte announced
	// at minStoreRate: a store may be big, but one trickling in must not
	// hold its connection, and its staged update, for ever.
	due := time.Now().Add(c.cfg.RequestTimeout)
	deadline := func() {
		dl := time.Now().Add(writeTimeout)
		if due.Before(dl) {
			dl = due
		}
		conn.SetReadDeadline(dl)
	}
	for {
		deadline()
		off, n, err := datapath.ReadPiece(br)
		if err != nil {
			if errors.Is(err, datapath.ErrBadRequest) {
				conn.Write(datapath.AppendError(nil, datapath.ErrProtocol, err.Error()))
			}
			return err
		}
		if n == 0 {
			break
		}
		c.cfg.Counts.Received.Add(int64(n))
		due = due.Add(time.Duration(n) * time.Second / minStoreRate)
		deadline()
		if err := receivePiece(br, n, func(p []byte, crc uint32) {
			switch {
			case failed != nil || badCRC:
			case crc != datapath.Checksum(0, p):
				badCRC = true
			default:
				if failed = x.Write(p, off); failed != nil {
					x.Fail(failed)
				}
			}
		}); err != nil {
			return err
		}
	}
	conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	defer conn.SetWriteDeadline(time.Time{})
	var err error
	switch {
	case sessErr != nil:
		_, err = conn.Write(datapath.AppendError(nil, datapath.ErrSession, sessErr.Error()))
	case badCRC:
		_, err = conn.Write(datapath.AppendError(nil, datapath.ErrChecksum, fmt.Sprintf("store %v: checksum mismatch", f)))
	case failed != nil:
		err = c.replyError(conn, failed)
	default:
		// No deadline of our own: the change is acknowledged only after
		// the breaks, which the break timeout bounds.
		var st node.Status
		st, failed = x.Finish(context.Background())
		c.log.Debug("data store", "client", id, "fid", f, "base", hdr.BaseVersion, "deleg", hdr.DelegState, "stage", hdr.Stage, "publish", hdr.Publish, "version", st.DataVersion, "err", failed)
		if failed != nil {
			return c.replyError(conn, failed)
		}
		status, merr := proto.Marshal(x.Status(st))
		if merr != nil {
			return c.replyError(conn, merr)
		}
		_, err = conn.Write(datapath.AppendCRC(datapath.AppendOK(nil, status, 0), 0))
	}
	return err
}

// receivePiece reads a store piece of n bytes and its checksum into a
// pooled buffer and hands them to use.
func receivePiece(br *bufio.Reader, n int, use func(p []byte, crc uint32)) error {
	p := datapath.GetBuffer(n)
	defer datapath.PutBuffer(p)
	if _, err := io.ReadFull(br, p); err != nil {
		return err
	}
	crc, err := datapath.ReadCRC(br)
	if err != nil {
		return err
	}
	use(p, crc)
	return nil
}

// checksum is the CRC32C of n bytes of file from off, zeros past have
// (the file's length when it was pinned) or its end.
func checksum(file *os.File, have, off, n int64) (uint32, error) {
	var crc uint32
	err := eachRun(file, have, off, n, func(p []byte) error {
		crc = datapath.Checksum(crc, p)
		return nil
	})
	return crc, err
}

// runSize is how much of a file eachRun reads at a time.
const runSize = 256 << 10

// eachRun hands fn the n bytes of file from off, a run at a time, with
// zeros past have (as sendData sends them).
func eachRun(file *os.File, have, off, n int64, fn func(p []byte) error) error {
	buf := datapath.GetBuffer(int(min(n, runSize)))
	defer datapath.PutBuffer(buf)
	for n > 0 {
		p := buf[:min(n, int64(len(buf)))]
		k := 0
		if file != nil && off < have {
			var err error
			k, err = file.ReadAt(p[:min(int64(len(p)), have-off)], off)
			if err != nil && err != io.EOF {
				return err
			}
		}
		clear(p[k:])
		if err := fn(p); err != nil {
			return err
		}
		off, n = off+int64(len(p)), n-int64(len(p))
	}
	return nil
}

// writeTimeout bounds one reply, and one store piece's arrival.
const writeTimeout = 30 * time.Second

// minStoreRate (bytes/s) is the slowest a store's pieces may come in, past
// the request's own time (DataRequestTimeout): a link slower than 64 kbit/s.
const minStoreRate = 8 << 10

// sendData writes n bytes of file from off to conn: by sendfile, and zeros
// where the file is shorter (a size extended by truncation) or absent.
// have is the file's length when it was pinned: bytes a commit added
// since are not of the version being sent.
func sendData(conn net.Conn, file *os.File, have, off, n int64) error {
	if file != nil {
		have := max(0, min(n, have-off))
		if err := sendfile(conn, file, off, have); err != nil {
			return err
		}
		off, n = off+have, n-have
	}
	zeros := make([]byte, min(n, 1<<20))
	for n > 0 {
		k, err := conn.Write(zeros[:min(n, int64(len(zeros)))])
		if err != nil {
			return err
		}
		n -= int64(k)
	}
	return nil
}

func sendfile(conn net.Conn, file *os.File, off, n int64) error {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		_, err := io.Copy(conn, io.NewSectionReader(file, off, n))
		return err
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	src := int(file.Fd())
	var serr error
	for n > 0 && serr == nil {
		werr := raw.Write(func(fd uintptr) bool {
			k, err := unix.Sendfile(int(fd), src, &off, int(min(n, 1<<30)))
			if k > 0 {
				n -= int64(k)
			}
			switch {
			case err == unix.EAGAIN:
				return false // wait until the socket is writable
			case err != nil:
				serr = err
			case k == 0:
				serr = io.ErrUnexpectedEOF // the file ended early
			}
			return true
		})
		if werr != nil {
			return werr
		}
	}
	return serr
}
