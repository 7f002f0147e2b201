package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/poll"
)

// A server at RLIMIT_NOFILE 1024 under a flood of idle TCP connections
// to its control port, and half-open TLS handshakes to its data port and
// its etcd member's, from six addresses, stays up and serves a client
// from a seventh: its bounds are sized from the descriptor limit, and no
// part of it (the embedded etcd included) may end it.
func TestFloodAtFDLimit(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) not found: cannot lower the server's descriptor limit")
	}
	data := t.TempDir()
	s := &serverProc{t: t, addr: freeAddr(t), data: data, base: []string{"server", "--data", data, "--cell", testCell.dir},
		wrap: []string{prlimit, "--nofile=1024:1024", "--"}}
	s.start()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() || os.Getenv("HOARD_TEST_DUMP") != "" {
			t.Logf("server log:\n%s", s.logs)
		}
	})
	ports := []string{s.addr}
	for _, re := range []string{`data channel (\S+?),`, `etcd member of its own at https://(\S+?) `} {
		m := regexp.MustCompile(re).FindStringSubmatch(s.logs.String())
		if m == nil {
			t.Fatalf("no %q in the server's start line: %s", re, s.logs)
		}
		ports = append(ports, m[1])
	}
	admin := dialAs(t, s.addr, testCell.admin)
	writeAs(t, admin, "/before", "before the flood")

	// The flood: every port, from 127.0.0.2-7, 1,100 connections each,
	// opened again as soon as the server closes one.
	const perPort, flood = 1100, 20 * time.Second
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var open, dials atomic.Int64
	hello := []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01} // a ClientHello's first bytes, never finished
	for pi, addr := range ports {
		for i := range perPort {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%6))}, Timeout: 2 * time.Second}
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := d.Dial("tcp", addr)
					dials.Add(1)
					if err != nil {
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
						}
						continue
					}
					open.Add(1)
					if pi > 0 {
						c.Write(hello)
					}
					done := make(chan struct{})
					go func() { c.Read(make([]byte, 1)); close(done) }() // until the server closes it
					select {
					case <-stop:
					case <-done:
					}
					c.Close()
					open.Add(-1)
				}
			}()
		}
	}
	// A well-behaved client, new during the flood, keeps working.
	deadline := time.Now().Add(flood)
	var c = dialAs(t, s.addr, testCell.admin)
	for i := 0; time.Now().Before(deadline); i++ {
		name, text := fmt.Sprintf("/f%d", i%8), fmt.Sprintf("write %d", i)
		writeAs(t, c, name, text)
		if got, err := readAs(c, name); err != nil || got != text {
			t.Fatalf("during the flood (%d attackers' connections open): read %s: %q, %v", open.Load(), name, got, err)
		}
		if s.cmd.ProcessState != nil {
			t.Fatalf("the server ended during the flood")
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("flood: %d dials, %d open at its end", dials.Load(), open.Load())
	if err := s.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the server is gone after the flood: %v", err)
	}
	close(stop)
	wg.Wait()
	if got, err := readAs(dialAs(t, s.addr, testCell.admin), "/before"); err != nil || got != "before the flood" {
		t.Fatalf("after the flood: %q, %v", got, err)
	}
	for _, bad := range []string{"panic", "fatal", "too many open files"} {
		if bytes.Contains(bytes.ToLower([]byte(s.logs.String())), []byte(bad)) {
			t.Errorf("the server's log says %q", bad)
		}
	}
}

// The server's own etcd member is a child process the server starts
// again when it ends: etcd ends its process on some errors, and that must
// not end the file server. Killed, it comes back, says so in the
// server's log, and the cell's changes go on.
func TestEtcdMemberRestarts(t *testing.T) {
	s := startServer(t, t.TempDir())
	admin := dialAs(t, s.addr, testCell.admin)
	child := etcdChildOf(t, s.cmd.Process.Pid)
	if err := syscall.Kill(child, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 30*time.Second, "the member serves again", func() bool {
		return strings.Contains(s.logs.String(), "etcd member serves again")
	})
	if !strings.Contains(s.logs.String(), "the cell's etcd member stopped; starting it again") {
		t.Fatalf("the member's end is not in the server's log:\n%s", s.logs)
	}
	writeAs(t, admin, "/after", "the server still serves")
	poll.Wait(t, 30*time.Second, "a volume made after the restart", func() bool {
		_, err := admin.Admin().CreateVolume("after")
		return err == nil
	})
}

// etcdChildOf is the pid of the hoard etcd child of process pid.
func etcdChildOf(t *testing.T, pid int) int {
	t.Helper()
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			var child int
			fmt.Sscan(f, &child)
			if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", child)); bytes.Contains(cmdline, []byte("etcd\x00")) {
				return child
			}
		}
	}
	t.Fatalf("no etcd child of process %d", pid)
	return 0
}
