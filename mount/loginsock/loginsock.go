// Package loginsock is how `hoard login` hands a user's token to the
// mounts running on the machine, as AFS's aklog hands tokens to its cache
// manager. Each mount listens on a Unix socket: a root mount's, which
// every local user may reach, in /run/hoard/mounts (0755, the socket
// 0666); another user's in $XDG_RUNTIME_DIR/hoard/mounts (0700). The
// kernel tells the mount who is connected (SO_PEERCRED), and a request
// sets or drops the token of that local user alone: nobody names another
// user's uid.
//
// The protocol is one JSON line per request, answered by one JSON line:
//
//	{"op":"login","token":"..."}     {"ok":true,"user":"alice","mount":"/mnt/hoard"}
//	{"op":"logout"}                  {"ok":true,"mount":"/mnt/hoard"}
//	{"op":"logout","cell":"lab"}     (only if the mount is of cell lab)
//	anything else, or refused        {"error":"...","mount":"/mnt/hoard"}
//
// A line is at most MaxLine bytes, and a connection lasts at most
// Timeout. Tokens are never logged, nor put in a reply.
package loginsock

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MaxLine bounds a request's line, newline included.
const MaxLine = 8 << 10

// Timeout bounds a connection, on either side.
const Timeout = 5 * time.Second

// maxConns bounds the connections a mount serves at once, maxPerUID
// those of one local user; more are closed at once: a user flooding the
// socket gets nothing more, and takes nothing from the others.
const (
	maxConns  = 64
	maxPerUID = 4
)

// Request is one request line.
type Request struct {
	Op    string `json:"op"`
	Token string `json:"token,omitempty"`
	// Cell, in a logout, limits it to a mount of that cell.
	Cell string `json:"cell,omitempty"`
}

// Reply is the answer to one request.
type Reply struct {
	OK    bool   `json:"ok,omitempty"`
	User  string `json:"user,omitempty"`
	Mount string `json:"mount,omitempty"`
	Error string `json:"error,omitempty"`
}

// Handler does what requests ask, for the local user uid.
type Handler interface {
	// Login checks token and sets it as uid's; it returns the token's
	// user.
	Login(uid uint32, token string) (user string, err error)
	// Logout drops uid's token, if the mount is of cell ("": any).
	Logout(uid uint32, cell string) error
}

// rootDir is where root's mounts listen.
const rootDir = "/run/hoard/mounts"

// Dir is where this process's mounts listen: root's in /run/hoard/mounts,
// another user's under $XDG_RUNTIME_DIR ("" when it is not set: such a
// mount takes no logins).
func Dir() string {
	if os.Geteuid() == 0 {
		return rootDir
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" {
		return filepath.Join(x, "hoard", "mounts")
	}
	return ""
}

// Sockets lists the mounts' sockets this process may tell: root's, and
// its own user's.
func Sockets() []string {
	dirs := []string{rootDir}
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && os.Geteuid() != 0 {
		dirs = append(dirs, filepath.Join(x, "hoard", "mounts"))
	}
	var out []string
	for _, d := range dirs {
		found, _ := filepath.Glob(filepath.Join(d, "*.sock"))
		out = append(out, found...)
	}
	return out
}

// Tell sends req to the mount listening at path and returns its answer;
// an error when the mount does not answer.
func Tell(path string, req Request) (Reply, error) {
	c, err := net.DialTimeout("unix", path, Timeout)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(Timeout))
	line, err := json.Marshal(req)
	if err != nil {
		return Reply{}, err
	}
	if _, err := c.Write(append(line, '\n')); err != nil {
		return Reply{}, err
	}
	r := bufio.NewReaderSize(c, MaxLine)
	line, err = r.ReadSlice('\n')
	if err != nil {
		return Reply{}, fmt.Errorf("no answer: %w", err)
	}
	var rep Reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return Reply{}, fmt.Errorf("an answer that is not one: %w", err)
	}
	return rep, nil
}

// Server is a mount's socket.
type Server struct {
	l     *net.UnixListener
	path  string
	mount string
	h     Handler
	log   *slog.Logger
	wg    sync.WaitGroup

	mu    sync.Mutex
	open  int
	byUID map[uint32]int
}

// Listen opens the socket of the mount at mountpoint, run by this
// process, in dir (Dir): named after the process, so that a mount that
// died leaves a socket the next one can tell is stale and remove.
func Listen(dir, mountpoint string, h Handler, log *slog.Logger) (*Server, error) {
	if dir == "" {
		return nil, errors.New("no directory for the login socket ($XDG_RUNTIME_DIR is not set)")
	}
	root := os.Geteuid() == 0
	dirMode, sockMode := os.FileMode(0o700), os.FileMode(0o600)
	if root {
		// Every local user hands root's mounts their tokens; the kernel
		// says who each is.
		dirMode, sockMode = 0o755, 0o666
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, dirMode); err != nil {
		return nil, err
	}
	if root {
		os.Chmod(filepath.Dir(dir), 0o755) // /run/hoard
	}
	removeStale(dir)
	path := filepath.Join(dir, strconv.Itoa(os.Getpid())+".sock")
	os.Remove(path) // an earlier process's of the same pid, dead
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, sockMode); err != nil {
		l.Close()
		return nil, err
	}
	s := &Server{l: l, path: path, mount: mountpoint, h: h, log: log, byUID: map[uint32]int{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// removeStale removes the sockets of mounts that died: their process is
// gone and nobody answers on them.
func removeStale(dir string) {
	found, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
	for _, p := range found {
		pid, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(p), ".sock"))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
			c.Close()
			continue
		}
		os.Remove(p)
	}
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Close stops serving and removes the socket.
func (s *Server) Close() error {
	err := s.l.Close() // unlinks the socket
	s.wg.Wait()
	return err
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.l.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("login socket", "err", err)
			}
			return
		}
		// The kernel says who connected at once: a connection is
		// counted against its user before anything is read from it.
		uid, err := peerUID(c)
		if err != nil {
			s.log.Warn("login socket: who is connected is not known", "err", err)
			c.Close()
			continue
		}
		if !s.admit(uid) {
			c.Close() // busy: a flood gets nothing
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.release(uid)
			defer c.Close()
			c.SetDeadline(time.Now().Add(Timeout))
			if err := Handle(c, uid, s.mount, s.h); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) {
				s.log.Debug("login socket", "uid", uid, "err", err)
			}
		}()
	}
}

// admit takes a place for a connection of uid's, if there is one.
func (s *Server) admit(uid uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open >= maxConns || s.byUID[uid] >= maxPerUID {
		return false
	}
	s.open++
	s.byUID[uid]++
	return true
}

func (s *Server) release(uid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	if s.byUID[uid]--; s.byUID[uid] <= 0 {
		delete(s.byUID, uid)
	}
}

// peerUID is the uid of the process at the other end of c, as the kernel
// recorded it when it connected.
func peerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

// Handle answers the requests on rw, which come from the local user uid,
// for the mount at mount, until the end of rw or a line too long to read.
func Handle(rw io.ReadWriter, uid uint32, mount string, h Handler) error {
	r := bufio.NewReaderSize(rw, MaxLine)
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			answer(rw, Reply{Error: fmt.Sprintf("request longer than %d bytes", MaxLine), Mount: mount})
			return err
		}
		if err == io.EOF && len(bytes.TrimSpace(line)) > 0 {
			err = nil // a last request without its newline
		}
		if err != nil {
			return err
		}
		rep := do(line, uid, h)
		rep.Mount = mount
		if err := answer(rw, rep); err != nil {
			return err
		}
	}
}

// do carries out the request in line.
func do(line []byte, uid uint32, h Handler) Reply {
	var req Request
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields() // a uid, say: it is the kernel's to say
	err := d.Decode(&req)
	if _, end := d.Token(); err == nil && end != io.EOF {
		err = errors.New("more after the request")
	}
	if err != nil {
		return Reply{Error: "not a request: want one JSON object a line, as {\"op\":\"login\",\"token\":\"...\"}"}
	}
	switch req.Op {
	case "login":
		if req.Token == "" {
			return Reply{Error: "login: no token"}
		}
		user, err := h.Login(uid, req.Token)
		if err != nil {
			return Reply{Error: "login: " + err.Error()}
		}
		return Reply{OK: true, User: user}
	case "logout":
		if req.Token != "" {
			return Reply{Error: "logout takes no token"}
		}
		if err := h.Logout(uid, req.Cell); err != nil {
			return Reply{Error: "logout: " + err.Error()}
		}
		return Reply{OK: true}
	}
	return Reply{Error: fmt.Sprintf("unknown op %q: want login or logout", req.Op)}
}

func answer(w io.Writer, rep Reply) error {
	line, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	_, err = w.Write(append(line, '\n'))
	return err
}
