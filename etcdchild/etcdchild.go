// Package etcdchild runs a file server's own etcd member as a child
// process of the same binary (hoard etcd), started again whenever it
// stops.
package etcdchild

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A Child is a server's own etcd member, run as a child process (hoard
// etcd) and started again whenever it stops. etcd ends its process on
// some errors (out of descriptors while purging its log, say): as a
// child, that ends the member, never the file server, and the descriptors
// a flood of its clients' port takes are the child's own.
type Child struct {
	args     []string // hoard etcd's, but --client
	client   string   // host:port it serves at: the first start's from then on
	endpoint string   // the URL clients reach it at
	logFile  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	stop chan struct{} // Close was called
	done chan struct{} // the supervisor has ended
}

// readyTimeout bounds a member's start: hoard etcd waits up to a minute
// for its cluster's leader.
const readyTimeout = 70 * time.Second

// Start starts the member, serving clients at client (port 0:
// any), its data in dir, secured by the certificates of cellDir (""
// plain TCP), and returns once it serves.
func Start(dir, client, cellDir string) (*Child, error) {
	args := []string{"etcd", "--name", "default", "--data", dir, "--peer", "127.0.0.1:0"}
	if cellDir != "" {
		args = append(args, "--cell", cellDir)
	} else {
		args = append(args, "--insecure")
	}
	c := &Child{args: args, client: client, logFile: filepath.Join(dir, "etcd.log"), stop: make(chan struct{}), done: make(chan struct{})}
	if err := c.start(); err != nil {
		return nil, err
	}
	go c.supervise()
	return c, nil
}

// start runs the member and waits for the line that says where it
// serves.
func (c *Child) start() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("etcd member: %v", err)
	}
	cmd := exec.Command(exe, append(c.args, "--client", c.client)...)
	// Its own process group: a terminal's Ctrl-C is the server's to
	// handle, which stops the member last. It dies with the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcd member: %v", err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		said := false
		for sc.Scan() {
			line := sc.Text()
			if _, at, ok := strings.Cut(line, "serving clients at "); ok && !said {
				said = true
				ready <- at
				continue
			}
			slog.Warn("the cell's etcd member says", "line", line)
		}
		close(ready)
	}()
	select {
	case at, ok := <-ready:
		if !ok {
			err := cmd.Wait()
			return fmt.Errorf("etcd member in %s did not start: %v%s", filepath.Dir(c.logFile), err, c.lastSaid())
		}
		u, err := url.Parse(strings.TrimSpace(at))
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			return fmt.Errorf("etcd member: serves at %q: %v", at, err)
		}
		c.mu.Lock()
		c.cmd, c.client, c.endpoint = cmd, u.Host, u.String()
		c.mu.Unlock()
		return nil
	case <-time.After(readyTimeout):
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("etcd member in %s: not serving within %v%s", filepath.Dir(c.logFile), readyTimeout, c.lastSaid())
	}
}

// supervise starts the member again whenever it stops, waiting longer
// after each stop that came soon after its start.
func (c *Child) supervise() {
	defer close(c.done)
	wait := time.Second
	for {
		c.mu.Lock()
		cmd := c.cmd
		c.mu.Unlock()
		began := time.Now()
		err := cmd.Wait()
		select {
		case <-c.stop:
			return
		default:
		}
		if time.Since(began) > time.Minute {
			wait = time.Second
		}
		slog.Error("the cell's etcd member stopped; starting it again", "err", err, "in", wait, "log", c.logFile, "last", c.lastWords())
		for {
			select {
			case <-c.stop:
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 30*time.Second)
			if err := c.start(); err != nil {
				slog.Error("the cell's etcd member did not start again", "err", err, "in", wait)
				continue
			}
			slog.Info("the cell's etcd member serves again", "at", c.Endpoint())
			break
		}
	}
}

// lastWords is the last line of the member's log ("" when there is
// none): what it said before it ended.
func (c *Child) lastWords() string {
	f, err := os.Open(c.logFile)
	if err != nil {
		return ""
	}
	defer f.Close()
	const tail = 4096
	if fi, err := f.Stat(); err == nil && fi.Size() > tail {
		f.Seek(-tail, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	b = bytes.TrimSpace(b)
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return string(b)
}

// lastSaid is lastWords for the end of an error message.
func (c *Child) lastSaid() string {
	if w := c.lastWords(); w != "" {
		return "; its log's last line: " + w
	}
	return ""
}

// Close stops the member and waits for it: SIGTERM, again (a start
// under way may make another child meanwhile), and SIGKILL past 10 s.
func (c *Child) Close() {
	close(c.stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		cmd := c.cmd
		c.mu.Unlock()
		sig := syscall.SIGTERM
		if time.Now().After(deadline) {
			sig = syscall.SIGKILL
		}
		cmd.Process.Signal(sig)
		select {
		case <-c.done:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Endpoint is the URL the member's clients reach it at. It stays the
// same across restarts: each serves at the first start's address.
func (c *Child) Endpoint() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endpoint
}
