// Package integration runs a real `hoard server` process and real clients
// against it over loopback TCP.
package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	pb "github.com/hoardfs/hoard/hoardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

var hoardBin string

// logLevel is the --log-level of the servers and mounts tests start
// (HOARD_TEST_LOG_LEVEL, default info); a failed test prints their logs.
func logLevel() string {
	if l := os.Getenv("HOARD_TEST_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}

// mountDebug is the flag that has a mount log every FUSE request, when
// HOARD_TEST_LOG_LEVEL is debug, unless HOARD_TEST_NO_FUSE_TRACE is set
// (the trace slows the mounts enough to hide some races).
func mountDebug() []string {
	if logLevel() == "debug" && os.Getenv("HOARD_TEST_NO_FUSE_TRACE") == "" {
		return []string{"--debug"}
	}
	return nil
}

func TestMain(m *testing.M) {
	if os.Getenv("HOARD_TEST_HELPER") != "" {
		os.Exit(helperMain())
	}
	// A chunk buffer used after it was given back reads as wrong bytes.
	os.Setenv("HOARD_POISON_BUFFERS", "1")
	hoardBin = os.Getenv("HOARD_BIN")
	if hoardBin == "" {
		dir, err := os.MkdirTemp("", "hoard-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		hoardBin = filepath.Join(dir, "hoard")
		// As make build does: hoard version says what it was built from.
		out, err := exec.Command("make", "-s", "-C", "..", "build", "BIN="+hoardBin).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building hoard: %v\n%s", err, out)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
	}
	cleanup, err := makeTestCell()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// The tests' cell: every server and proxy they start belongs to it, and
// every client acts as its admin unless a test says otherwise. HOARD_CA
// and HOARD_TOKEN say so to the hoard commands the tests run, and to
// their helper processes.
var testCell struct {
	dir, proxyDir, admin string
}

func makeTestCell() (func(), error) {
	dir, err := os.MkdirTemp("", "hoard-cell-")
	if err != nil {
		return nil, err
	}
	cellDir, proxyDir := filepath.Join(dir, "cell"), filepath.Join(dir, "proxy")
	for _, args := range [][]string{
		{"cell", "init", "--dir", cellDir, "--name", "test"},
		{"cell", "cert", "--dir", cellDir, "--proxy", "testproxy", "--out", proxyDir},
	} {
		if out, err := exec.Command(hoardBin, args...).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("hoard %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	tok, err := os.ReadFile(filepath.Join(cellDir, cell.AdminTokenFile))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	testCell.dir, testCell.proxyDir, testCell.admin = cellDir, proxyDir, strings.TrimSpace(string(tok))
	os.Setenv("HOARD_CA", filepath.Join(cellDir, cell.CAFile))
	os.Setenv("HOARD_TOKEN", testCell.admin)
	return func() { os.RemoveAll(dir) }, nil
}

// cellGRPC opens a bare gRPC connection to addr in the tests' cell:
// TLS with its CA, each request with the token in HOARD_TOKEN.
func cellGRPC(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	ca, err := cell.LoadCA(os.Getenv("HOARD_CA"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cell.UserTLS(ca))),
		grpc.WithPerRPCCredentials(bearer(os.Getenv("HOARD_TOKEN"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// bearer sends a token with every request.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{pb.UserMetadata: "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// cellDial is pathfs.Dial in the tests' cell: over TLS with its CA, with
// the token in HOARD_TOKEN (the admin's, unless a test set another).
func cellDial(o client.Options) (*pathfs.FS, error) {
	if o.TLS == nil {
		ca, err := cell.LoadCA(os.Getenv("HOARD_CA"))
		if err != nil {
			return nil, err
		}
		o.TLS = cell.UserTLS(ca)
	}
	if o.Token == "" {
		o.Token = os.Getenv("HOARD_TOKEN")
	}
	return pathfs.Dial(o)
}

// logBuf collects a process's log lines while the test reads them.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.WriteString(string(p))
	return len(p), nil
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serverProc is a running `hoard server` (or `hoard proxy`).
type serverProc struct {
	t    testing.TB
	cmd  *exec.Cmd
	addr string
	data string
	// base is the command and its data flag: server --data DIR, or proxy
	// --origin ADDR --cache DIR.
	base []string
	args []string
	logs *logBuf // across restarts
	// wrap, if set, runs the server under it (prlimit ... --).
	wrap []string
	// spare is the process the next restart turns into the server
	// (prepare).
	spare *standby
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServer starts a server on a fresh port with its data in data.
func startServer(t testing.TB, data string, extra ...string) *serverProc {
	t.Helper()
	return startProc(t, "server", data, []string{"server", "--data", data, "--cell", testCell.dir}, extra)
}

// startProxy starts a proxy of origin on a fresh port, its cache in dir.
func startProxy(t testing.TB, origin *serverProc, dir string, extra ...string) *serverProc {
	t.Helper()
	// The pooled store allocates its size at start: keep tests' small.
	return startProc(t, "proxy", dir, []string{"proxy", "--origin", origin.addr, "--cache", dir, "--cache-size", "256M", "--cell", testCell.proxyDir}, extra)
}

func startProc(t testing.TB, what, data string, base, extra []string) *serverProc {
	t.Helper()
	s := &serverProc{t: t, addr: freeAddr(t), data: data, base: base, args: extra}
	s.start()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() || os.Getenv("HOARD_TEST_DUMP") != "" {
			t.Logf("%s log:\n%s", what, s.logs)
		}
	})
	return s
}

func (s *serverProc) start() {
	s.t.Helper()
	sp := s.launch(false)
	s.cmd = sp.cmd
	s.wait(sp.ready)
}

// launch starts the server process; its ready closes once it says it
// serves (or ends). Held, it is a shell that turns into the server when
// a line comes on its stdin (standby).
func (s *serverProc) launch(held bool) *standby {
	s.t.Helper()
	args := slices.Concat(s.base, []string{"--listen", s.addr, "--log-level", logLevel(), "--grace", "1s"}, s.args)
	sp := &standby{cmd: exec.Command(hoardBin, args...)}
	if s.wrap != nil {
		sp.cmd = exec.Command(s.wrap[0], slices.Concat(s.wrap[1:], []string{hoardBin}, args)...)
	}
	if held {
		sp.cmd = exec.Command("/bin/sh", append([]string{"-c", `read go && exec "$0" "$@"`, hoardBin}, args...)...)
		sp.stdin, _ = sp.cmd.StdinPipe()
	}
	if s.logs == nil {
		s.logs = &logBuf{}
	}
	stderr, _ := sp.cmd.StderrPipe()
	if err := sp.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			s.logs.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), "serving") {
				once = true
				close(ready)
			}
		}
		if !once {
			close(ready)
		}
	}()
	sp.ready = ready
	return sp
}

func (s *serverProc) wait(ready <-chan struct{}) {
	s.t.Helper()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		s.t.Fatalf("server did not start: %s", s.logs)
	}
	if c, err := net.DialTimeout("tcp", s.addr, time.Second); err != nil {
		s.t.Fatalf("server not listening on %s: %v\n%s", s.addr, err, s.logs)
	} else {
		c.Close()
	}
}

// kill9 kills the server as a crash would.
func (s *serverProc) kill9() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

func (s *serverProc) kill() {
	s.kill9()
	if s.spare != nil {
		s.spare.cmd.Process.Kill()
		s.spare.cmd.Wait()
		s.spare = nil
	}
}

// stop asks the server to stop and waits for it.
func (s *serverProc) stop() error {
	s.cmd.Process.Signal(syscall.SIGTERM)
	err := s.cmd.Wait()
	s.cmd = nil
	return err
}

// standby is a started server process, or (prepare) one held back for
// the next restart.
type standby struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser // held: a line here starts the server
	ready <-chan struct{}
}

// prepare forks, now, the process the next restart turns into the
// server. Forked later, by a test process with files open on a FUSE
// mount, it would carry copies of their descriptors, and its exec would
// close them, each close a FUSE flush that may wait for the very server
// being restarted (it cost 10-20 s restarts). The restart must follow a
// kill9 or stop.
func (s *serverProc) prepare() {
	s.t.Helper()
	s.spare = s.launch(true)
}

// restart starts the server again, from the standby if one was prepared.
func (s *serverProc) restart() {
	s.t.Helper()
	sp := s.spare
	if sp == nil {
		s.start()
		return
	}
	s.spare = nil
	s.cmd = sp.cmd
	if _, err := io.WriteString(sp.stdin, "go\n"); err != nil {
		s.t.Fatalf("standby server: %v", err)
	}
	s.wait(sp.ready)
}

// dial connects a library client, with a disk cache in its own directory
// unless cacheDir is "mem".
func dial(t testing.TB, addr, cacheDir string, size int64) *pathfs.FS {
	t.Helper()
	if cacheDir == "mem" {
		cacheDir = ""
	}
	c, err := cellDial(client.Options{Server: addr, CacheDir: cacheDir, CacheSize: size, DialTimeout: 5 * time.Second, RPCTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// run runs the hoard binary and returns its combined output and exit code.
func run(t testing.TB, args ...string) (string, int) {
	t.Helper()
	return runEnv(t, nil, args...)
}

// runTimeout bounds a command run: one that should have ended (a server
// that should have refused to start) is killed rather than hang the tests.
const runTimeout = 2 * time.Minute

// runEnv is run with env added to the tests' environment.
func runEnv(t testing.TB, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, hoardBin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}
