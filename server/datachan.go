package server

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
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/connlimit"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// ServeData starts the bulk-data channel on l, which runs until l is
// closed, and advertises it to clients that connect from now on: file
// contents go to the socket on connections that carry nothing else, so
// control RPCs are never queued behind them, from the vnode file with
// sendfile where the backend keeps local files (a proxy's go through a
// buffer); stores come in on the same connections. Clients are told to
// connect to advertise, or to l's address if it is empty.
func (s *Server) ServeData(l net.Listener, advertise string) {
	if advertise == "" {
		advertise = l.Addr().String()
	}
	s.dataAddr.Store(&advertise)
	// A flood's lines are thinned by the process's log (lograte).
	var lim net.Listener = connlimit.New(l, s.cfg.MaxDataConns, s.cfg.MaxDataConnsPerPeer, func(conn net.Conn, why error) {
		// A client reads this as a channel it cannot use, and moves the
		// transfer to gRPC.
		conn.Write(datapath.AppendError(nil, datapath.ErrProtocol, "data connection refused: "+why.Error()))
		s.log.Warn("data connection refused", "from", conn.RemoteAddr(), "why", why)
	})
	if s.cfg.TLS != nil {
		// The handshake happens at the first read, under the deadline
		// of the connection's first request.
		c := s.cfg.TLS.Clone()
		c.NextProtos = []string{datapath.ALPN}
		lim = tls.NewListener(lim, c)
	}
	go s.acceptData(lim)
}

// acceptData serves l's connections until l is closed. A failed accept
// (out of descriptors, most often, in a flood) is retried after a pause
// that grows from 5 ms to 1 s, as net/http's Server does: the channel
// must outlive the flood.
func (s *Server) acceptData(l net.Listener) {
	var delay time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Error("data channel: accept failed, retrying", "err", err, "retry_in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		go s.dataConn(conn)
	}
}

func (s *Server) dataConn(conn net.Conn) {
	s.data.open.Add(1)
	s.data.accepted.Add(1)
	defer s.data.open.Add(-1)
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	// A new connection's first request is due whole soon after it opens.
	conn.SetReadDeadline(time.Now().Add(s.cfg.DataRequestTimeout))
	for {
		req, err := datapath.ReadRequest(br)
		if err != nil {
			if errors.Is(err, datapath.ErrBadRequest) {
				conn.Write(datapath.AppendError(nil, datapath.ErrProtocol, err.Error()))
			}
			return
		}
		if req.Op == datapath.OpStore {
			err = s.serveStore(conn, br, req)
		} else {
			err = s.serveFetch(conn, req)
		}
		if err != nil {
			return // the connection is unusable (a write failed mid-reply)
		}
		// Between requests the connection waits in its client's pool, for
		// a while; a request begun must then arrive whole in time, however
		// slowly it trickles in.
		conn.SetReadDeadline(time.Now().Add(s.cfg.DataIdleTimeout))
		if _, err := br.Peek(1); err != nil {
			return
		}
		conn.SetReadDeadline(time.Now().Add(s.cfg.DataRequestTimeout))
	}
}

// replyError answers a request with err's errno (EIO if it has none),
// also one a proxy's origin answered with. A volume held elsewhere now,
// or being handed over, is ErrElsewhere: the client asks over gRPC, whose
// answer says where, or to send again.
func (s *Server) replyError(conn net.Conn, err error) error {
	errno := uint32(pb.Errno(err))
	if elsewhere(s.wire(err)) {
		errno = datapath.ErrElsewhere
	}
	_, werr := conn.Write(datapath.AppendError(nil, errno, err.Error()))
	return werr
}

// serveFetch answers one fetch; an error means the connection broke.
func (s *Server) serveFetch(conn net.Conn, req datapath.Request) error {
	id, err := s.session(req.Session, conn.RemoteAddr())
	if err != nil {
		_, werr := conn.Write(datapath.AppendError(nil, datapath.ErrSession, err.Error()))
		return werr
	}
	if req.FID.Volume == 0 || req.FID.Vnode == 0 {
		return s.replyError(conn, fmt.Errorf("fetch: zero fid: %w", syscall.EINVAL))
	}
	o := s.opFor(id)
	if o.who, err = s.connWho(req.User, conn); err == nil {
		err = o.may(req.FID, access.Read, "read")
	}
	if err != nil {
		return s.replyError(conn, err)
	}
	if _, err := s.recallFor(context.Background(), o, false, req.FID); err != nil {
		return s.replyError(conn, err)
	}
	// The file's lock is not held while the reply goes out (sendPinned),
	// but a client that stops reading must not hold the connection and
	// the pinned version for ever either.
	conn.SetWriteDeadline(time.Now().Add(dataWriteTimeout))
	defer conn.SetWriteDeadline(time.Time{})
	var werr error
	var dv uint64
	if s.log.Enabled(context.Background(), slog.LevelDebug) { // a hot path
		defer func() {
			s.log.Debug("data fetch", "client", id, "fid", req.FID, "off", req.Offset, "len", req.Length, "version", dv, "err", err)
		}()
	}
	if files, ok := s.local.(pinFiles); ok {
		dv, werr, err = s.sendPinned(conn, o, files, req)
	} else {
		dv, werr, err = s.sendRead(conn, o, req)
	}
	if werr != nil {
		return werr
	}
	if err != nil {
		return s.replyError(conn, err)
	}
	return nil
}

// maxReadFetch bounds a fetch served through a buffer (sendRead): clients
// ask for a chunk at a time.
const maxReadFetch = 16 << 20

// sendRead answers a fetch from a backend whose bytes are not in local
// files (a proxy's store): the range is read whole, of one version, then
// sent. werr means the connection broke; err is the fetch's.
func (s *Server) sendRead(conn net.Conn, o *op, req datapath.Request) (dv uint64, werr, err error) {
	if req.Length > maxReadFetch {
		return 0, nil, fmt.Errorf("fetch %v: %d bytes at once, at most %d here: %w", req.FID, req.Length, maxReadFetch, syscall.EINVAL)
	}
	buf := datapath.GetBuffer(int(req.Length))
	defer datapath.PutBuffer(buf)
	n, st, err := s.store.ReadAt(req.FID, buf[:req.Length], int64(req.Offset), o.user)
	if err == io.EOF {
		n, err = 0, nil
	}
	if err != nil {
		return 0, nil, err
	}
	if st.Type != node.TypeFile {
		return 0, nil, fmt.Errorf("fetch %v: %w", req.FID, syscall.EISDIR)
	}
	status, err := proto.Marshal(o.status(st))
	if err != nil {
		return 0, nil, err
	}
	out := datapath.AppendOK(nil, status, uint64(n))
	if _, werr = conn.Write(out); werr == nil {
		if _, werr = conn.Write(buf[:n]); werr == nil {
			s.data.sent.Add(int64(n))
			_, werr = conn.Write(datapath.AppendCRC(nil, datapath.Checksum(0, buf[:n])))
		}
	}
	return st.DataVersion, werr, nil
}

// serveStore receives one store's pieces, checks each piece's checksum,
// and commits them as one store after the last. The whole request is read
// even when the store fails early, so that the connection stays in step;
// an error means the connection broke or fell out of step.
func (s *Server) serveStore(conn net.Conn, br *bufio.Reader, req datapath.Request) error {
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
	var o *op
	var x *storing
	f := req.FID
	id, sessErr := s.session(req.Session, conn.RemoteAddr())
	failed := sessErr
	if failed == nil {
		ctx, cancel := context.WithTimeout(context.Background(), dataWriteTimeout)
		failed = s.storeGrace(ctx, &hdr)
		cancel()
	}
	if failed == nil {
		o = s.opFor(id)
		if o.who, failed = s.connWho(req.User, conn); failed == nil {
			x, failed = s.beginStore(o, &hdr)
		}
	}
	if x != nil {
		defer x.release()
	}
	badCRC := false
	// The pieces have a request's time, and more for each byte announced
	// at minStoreRate: a store may be big, but one trickling in must not
	// hold its connection, and its staged update, for ever.
	due := time.Now().Add(s.cfg.DataRequestTimeout)
	deadline := func() {
		dl := time.Now().Add(dataWriteTimeout)
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
		s.data.received.Add(int64(n))
		due = due.Add(time.Duration(n) * time.Second / minStoreRate)
		deadline()
		if err := receivePiece(br, n, func(p []byte, crc uint32) {
			switch {
			case failed != nil || badCRC:
			case crc != datapath.Checksum(0, p):
				badCRC = true
			default:
				if failed = x.write(p, off); failed != nil {
					x.fail(failed)
				}
			}
		}); err != nil {
			return err
		}
	}
	conn.SetWriteDeadline(time.Now().Add(dataWriteTimeout))
	defer conn.SetWriteDeadline(time.Time{})
	var err error
	switch {
	case sessErr != nil:
		_, err = conn.Write(datapath.AppendError(nil, datapath.ErrSession, sessErr.Error()))
	case badCRC:
		_, err = conn.Write(datapath.AppendError(nil, datapath.ErrChecksum, fmt.Sprintf("store %v: checksum mismatch", f)))
	case failed != nil:
		err = s.replyError(conn, failed)
	default:
		// No deadline of our own: the change is acknowledged only after
		// the breaks, which the break timeout bounds.
		var st node.Status
		st, failed = x.finish(context.Background(), o, &hdr)
		s.log.Debug("data store", "client", id, "fid", f, "base", hdr.BaseVersion, "deleg", hdr.DelegState, "stage", hdr.Stage, "publish", hdr.Publish, "version", st.DataVersion, "err", failed)
		if failed != nil {
			return s.replyError(conn, failed)
		}
		status, merr := proto.Marshal(o.status(st))
		if merr != nil {
			return s.replyError(conn, merr)
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

// dataWriteTimeout bounds one data-channel reply, and one store piece's
// arrival.
const dataWriteTimeout = 30 * time.Second

// minStoreRate (bytes/s) is the slowest a store's pieces may come in, past
// the request's own time (DataRequestTimeout): a link slower than 64 kbit/s.
const minStoreRate = 8 << 10

// session identifies the client of a data-channel request: a live
// session, used from its own host. A request without one is refused:
// file contents go only to clients the server knows.
func (s *Server) session(sess string, from net.Addr) (callback.ClientID, error) {
	if sess == "" {
		return 0, errors.New("data channel: no session: say Hello first")
	}
	return s.live(sess, from, false)
}

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
