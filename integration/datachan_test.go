package integration

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/datapath"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// dataChanAddr is where srv said its data channel listens.
func dataChanAddr(t *testing.T, srv *serverProc) string {
	t.Helper()
	m := regexp.MustCompile(`data channel ([^ ,)]+)`).FindStringSubmatch(srv.logs.String())
	if m == nil {
		t.Fatalf("no data channel advertised: %s", srv.logs)
	}
	return m[1]
}

// dialRawFrom connects to addr from the loopback address ip (127.0.0.0/8
// is all loopback: each is a peer of its own), in plain TCP: what a
// flood sends, and what the server's refusal, which precedes TLS, is
// read on.
func dialRawFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialFrom is dialRawFrom in TLS, as a client speaks the channel.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	c := tls.Client(dialRawFrom(t, ip, addr), dataTLS(t))
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		t.Fatalf("data channel handshake: %v", err)
	}
	c.SetDeadline(time.Time{})
	return c
}

// dataTLS is the TLS config a client of the tests' cell speaks the data
// channel with.
func dataTLS(t *testing.T) *tls.Config {
	t.Helper()
	c := cellTLS(t)
	c.NextProtos, c.ServerName = []string{datapath.ALPN}, "127.0.0.1"
	return c
}

// vmRSS is the resident memory of process pid, in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// dataFetches counts the fetches srv served on its data channel (its
// debug log).
func dataFetches(srv *serverProc) int {
	return strings.Count(srv.logs.String(), `msg="data fetch"`)
}

// writeOverGRPC writes name on srv with a client that keeps off the data
// channel, so that it holds none of its connections.
func writeOverGRPC(t *testing.T, srv *serverProc, name string, data []byte) {
	t.Helper()
	w, err := cellDial(client.Options{Server: srv.addr, NoDataChannel: true, DialTimeout: 5 * time.Second, RPCTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	testkit.WriteFile(t, w, name, data)
}

// readOverChannel reads name with a new client and checks that the data
// channel served it.
func readOverChannel(t *testing.T, srv *serverProc, name string, want []byte) {
	t.Helper()
	before := dataFetches(srv)
	if got := testkit.ReadFile(t, dial(t, srv.addr, "mem", 64<<20), name); !bytes.Equal(got, want) {
		t.Fatalf("read of %s differs", name)
	}
	if dataFetches(srv) == before {
		t.Fatalf("%s was not read over the data channel: %s", name, srv.logs)
	}
}

// A flood of data connections, past the bound from one address and past
// the bound in all, some sending a few bytes and stopping, one trickling
// a request a byte at a time: those past the bounds are refused at once
// with a protocol error, a client meanwhile reads over gRPC without
// waiting out the channel, the stalled ones are closed at the request
// timeout, the server's memory stays put, and the channel serves again.
func TestDataChanFlood(t *testing.T) {
	const perPeer, total, timeout = 8, 12, 2 * time.Second
	srv := startServer(t, t.TempDir(), "--log-level", "debug", "--max-data-conns", strconv.Itoa(total),
		"--max-data-conns-per-peer", strconv.Itoa(perPeer), "--data-request-timeout", timeout.String())
	addr := dataChanAddr(t, srv)
	content := testkit.Pattern(4<<20, 11)
	writeOverGRPC(t, srv, "/f", content)
	rss := vmRSS(t, srv.cmd.Process.Pid)

	// Within the bounds: 8 from one address, 4 from another, each watched
	// until the server closes it; past them, one more from the first
	// address (its bound) and one from a third (the bound in all).
	var wg sync.WaitGroup
	closed := make([]time.Duration, total)
	var trickle net.Conn
	for i := range total {
		ip := "127.0.0.1"
		if i >= perPeer {
			ip = "127.0.0.2"
		}
		if i == perPeer {
			expectRefused(t, dialRawFrom(t, "127.0.0.1", addr), "8 connections open from 127.0.0.1")
		}
		opened := time.Now()
		// A few bytes that are not TLS hold a connection as long as a
		// request begun does: the handshake waits for a whole record.
		dial := dialRawFrom
		if i == 1 {
			dial = dialFrom
		}
		c := dial(t, ip, addr)
		switch {
		case i == 1:
			trickle = c
		case i%2 == 0:
			c.Write([]byte("HDF"))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(4 * timeout))
			io.Copy(io.Discard, c)
			closed[i] = time.Since(opened)
		}()
	}
	expectRefused(t, dialRawFrom(t, "127.0.0.3", addr), "12 connections open,")
	// A request trickling in a byte every 100 ms, 4.7 s in all.
	go func() {
		for _, b := range datapath.AppendRequest(nil, datapath.Request{Op: datapath.OpFetch, FID: noFile, Length: 1}) {
			if _, err := trickle.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// The channel is full: a client's read goes over gRPC, at once.
	began := time.Now()
	if got := testkit.ReadFile(t, dial(t, srv.addr, "mem", 64<<20), "/f"); !bytes.Equal(got, content) {
		t.Fatal("read while the channel is full differs")
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("a read while the channel was full took %v", took)
	}

	// Many more, each sending a few bytes and holding on: each is refused,
	// or (once the stalled ones are gone) admitted and closed in its turn.
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	flood := min(5000, int(nofile.Cur)-256) // this process's descriptors
	conns := make([]net.Conn, flood)
	for i := range conns {
		conns[i] = dialRawFrom(t, "127.0.0.4", addr)
		conns[i].Write([]byte("HDF"))
	}
	admitted := 0
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(4 * timeout))
		rep, err := datapath.ReadReply(bufio.NewReader(c))
		switch {
		case err != nil && !errors.Is(err, os.ErrDeadlineExceeded):
			admitted++
		case err != nil || rep.Errno != datapath.ErrProtocol || !strings.Contains(rep.Message, "refused"):
			t.Fatalf("flood connection %d: %+v %v", i, rep, err)
		}
		c.Close()
	}
	if admitted > perPeer {
		t.Errorf("%d flood connections from one address admitted, at most %d", admitted, perPeer)
	}
	if grown := vmRSS(t, srv.cmd.Process.Pid) - rss; grown > 16<<20 {
		t.Errorf("%d connections grew the server by %d MiB", flood, grown>>20)
	}

	wg.Wait()
	for i, d := range closed {
		if d < timeout/2 || d >= 4*timeout {
			t.Errorf("stalled connection %d closed after %v, want about %v", i, d, timeout)
		}
	}
	readOverChannel(t, srv, "/f", content)
}

// A store whose pieces trickle in, a byte each, is cut off soon after
// the request timeout: the pieces buy time by their size only.
func TestDataChanSlowStore(t *testing.T) {
	const timeout = time.Second
	srv := startServer(t, t.TempDir(), "--grace", "0s", "--data-request-timeout", timeout.String())
	c := dialFrom(t, "127.0.0.1", dataChanAddr(t, srv))
	c.Write(datapath.AppendRequest(nil, datapath.Request{Op: datapath.OpStore, FID: noFile}))
	began := time.Now()
	go func() {
		for off := int64(0); ; off++ {
			piece := datapath.AppendCRC(append(datapath.AppendPiece(nil, off, 1), 'x'), datapath.Checksum(0, []byte{'x'}))
			if _, err := c.Write(piece); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	c.SetReadDeadline(time.Now().Add(10 * timeout))
	io.Copy(io.Discard, c)
	if took := time.Since(began); took >= 10*timeout {
		t.Fatalf("a store trickling in was still open after %v", took)
	}
}

// The server closes data connections that idle between requests past
// its idle timeout, and a client whose pooled connections it closed
// dials again: its next read still goes over the data channel.
func TestDataChanIdle(t *testing.T) {
	const idle = time.Second
	srv := startServer(t, t.TempDir(), "--log-level", "debug", "--data-idle-timeout", idle.String())
	a, b := testkit.Pattern(3<<20, 13), testkit.Pattern(3<<20, 14)
	writeOverGRPC(t, srv, "/a", a)
	writeOverGRPC(t, srv, "/b", b)
	c := dial(t, srv.addr, "mem", 64<<20)
	if got := testkit.ReadFile(t, c, "/a"); !bytes.Equal(got, a) {
		t.Fatal("read of /a differs")
	}
	// A connection that made a request after the client's did is closed
	// an idle timeout later: by then the client's have been too.
	raw := dialFrom(t, "127.0.0.1", dataChanAddr(t, srv))
	raw.Write(datapath.AppendRequest(nil, datapath.Request{Op: datapath.OpFetch, FID: noFile, Length: 1}))
	br := bufio.NewReader(raw)
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := datapath.ReadReply(br); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	raw.SetReadDeadline(time.Now().Add(10 * idle))
	io.Copy(io.Discard, br)
	if took := time.Since(answered); took < idle/2 || took >= 10*idle {
		t.Fatalf("an idle data connection was closed after %v, want about %v", took, idle)
	}
	before := dataFetches(srv)
	if got := testkit.ReadFile(t, c, "/b"); !bytes.Equal(got, b) {
		t.Fatal("read of /b differs")
	}
	if dataFetches(srv) == before {
		t.Fatalf("the client's read after its data connections were closed went over gRPC: %s", srv.logs)
	}
}

// expectRefused reads the protocol error a data connection past the
// server's bounds gets, saying why.
func expectRefused(t *testing.T, c net.Conn, why string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rep, err := datapath.ReadReply(bufio.NewReader(c))
	if err != nil || rep.Errno != datapath.ErrProtocol || !strings.Contains(rep.Message, why) {
		t.Fatalf("a connection past the bounds: %+v %v, want a protocol error saying %q", rep, err, why)
	}
}

// noFile is a FID no file has: a fetch of it is answered with an error.
var noFile = node.FID{Volume: 1, Vnode: 1 << 40, Unique: 1}

// A flood past the server's limit of open files: its accepts fail
// (EMFILE) while it lasts, and the channel serves again once it is over.
func TestDataChanPastFdLimit(t *testing.T) {
	srv := startServer(t, t.TempDir(), "--log-level", "debug")
	addr := dataChanAddr(t, srv)
	content := testkit.Pattern(3<<20, 12)
	writeOverGRPC(t, srv, "/f", content)
	pid := srv.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	limit := uint64(len(fds) + 40)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Skipf("cannot lower the server's open files limit: %v", err)
	}
	var flood []net.Conn
	for range 100 {
		c := dialRawFrom(t, "127.0.0.1", addr)
		c.Write([]byte("HDF"))
		flood = append(flood, c)
	}
	if !poll.Until(10*time.Second, func() bool { return strings.Contains(srv.logs.String(), "too many open files") }) {
		t.Fatalf("the server never ran out of descriptors: %s", srv.logs)
	}
	for _, c := range flood {
		c.Close()
	}
	// A request is answered again (the accept loop waits at most 1 s).
	c := dialFrom(t, "127.0.0.1", addr)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write(datapath.AppendRequest(nil, datapath.Request{Op: datapath.OpFetch, FID: noFile, Length: 1}))
	if _, err := datapath.ReadReply(bufio.NewReader(c)); err != nil {
		t.Fatalf("the data channel did not answer after the flood: %v\n%s", err, srv.logs)
	}
	readOverChannel(t, srv, "/f", content)
}
