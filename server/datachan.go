package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/datapath"
	"github.com/hoardfs/hoard/node"
)

// ServeData starts the bulk-data channel on l, which runs until l is
// closed, and advertises it to clients that connect from now on: file
// contents go from the vnode file to the socket with sendfile, without
// passing through user space, on connections that carry nothing else, so
// control RPCs are never queued behind them.
func (s *Server) ServeData(l net.Listener) {
	addr := l.Addr().String()
	s.dataAddr.Store(&addr)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					s.log.Error("data channel stopped", "err", err)
				}
				return
			}
			go s.dataConn(conn)
		}
	}()
}

func (s *Server) dataConn(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for {
		req, err := datapath.ReadRequest(br)
		if err != nil {
			if errors.Is(err, datapath.ErrBadRequest) {
				conn.Write(datapath.AppendError(nil, uint32(syscall.EINVAL), err.Error()))
			}
			return
		}
		if err := s.serveFetch(conn, req); err != nil {
			return // the connection is unusable (a write failed mid-reply)
		}
	}
}

// serveFetch answers one fetch; an error means the connection broke.
func (s *Server) serveFetch(conn net.Conn, req datapath.Request) error {
	fail := func(err error) error {
		errno := syscall.EIO
		errors.As(err, &errno)
		_, werr := conn.Write(datapath.AppendError(nil, uint32(errno), err.Error()))
		return werr
	}
	id, err := s.session(req.Session)
	if err != nil {
		_, werr := conn.Write(datapath.AppendError(nil, datapath.ErrSession, err.Error()))
		return werr
	}
	if req.FID.Volume == 0 || req.FID.Vnode == 0 {
		return fail(fmt.Errorf("fetch: zero fid: %w", syscall.EINVAL))
	}
	s.mu.Lock()
	o := &op{s: s, id: id, since: s.cb.Seq()}
	s.mu.Unlock()
	// The reply is sent under the file's read lock, which a store waits
	// for: a client that stops reading must not hold it for long.
	conn.SetWriteDeadline(time.Now().Add(dataWriteTimeout))
	defer conn.SetWriteDeadline(time.Time{})
	var werr error
	err = s.store.WithData(req.FID, func(st node.Status, file *os.File) error {
		status, err := proto.Marshal(o.status(st))
		if err != nil {
			return err
		}
		var n uint64
		if req.Offset < st.Size {
			n = min(req.Length, st.Size-req.Offset)
		}
		if _, werr = conn.Write(datapath.AppendOK(nil, status, n)); werr != nil {
			return nil
		}
		werr = sendData(conn, file, int64(req.Offset), int64(n))
		return nil
	})
	if werr != nil {
		return werr
	}
	if err != nil {
		return fail(err)
	}
	return nil
}

// dataWriteTimeout bounds one data-channel reply.
const dataWriteTimeout = 30 * time.Second

// session identifies the client of a data-channel request ("" is
// anonymous: served, no promises).
func (s *Server) session(sess string) (callback.ClientID, error) {
	if sess == "" {
		return 0, nil
	}
	return s.parseSession(sess)
}

// sendData writes n bytes of file from off to conn: by sendfile, and zeros
// where the file is shorter (a size extended by truncation) or absent.
func sendData(conn net.Conn, file *os.File, off, n int64) error {
	if file != nil {
		fi, err := file.Stat()
		if err != nil {
			return err
		}
		have := max(0, min(n, fi.Size()-off))
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
