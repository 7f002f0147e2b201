package harness

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
)

// StartServer runs `hoard server` with its data in data, insecure, and
// returns its address, its pid and how to stop it.
func StartServer(bin, data string, extra ...string) (string, int, func(), error) {
	// Security is measured on its own (bench/secure); the rest run
	// insecure, as before there was any.
	return StartHoard(bin, append([]string{"server", "--insecure", "--data", data}, extra...)...)
}

// StartHoard runs `hoard args... --listen ADDR` on a free port until it
// says it serves, and returns ADDR, its pid and how to stop it.
func StartHoard(bin string, args ...string) (string, int, func(), error) {
	addr, err := FreePort()
	if err != nil {
		return "", 0, nil, err
	}
	cmd := exec.Command(bin, append(args, "--listen", addr)...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	sc := bufio.NewScanner(stderr)
	serving := false
	for !serving && sc.Scan() {
		serving = strings.Contains(sc.Text(), "serving")
	}
	if !serving {
		cmd.Process.Kill()
		cmd.Wait()
		return "", 0, nil, fmt.Errorf("hoard %s did not start", args[0])
	}
	go io.Copy(io.Discard, stderr)
	return addr, cmd.Process.Pid, func() { cmd.Process.Kill(); cmd.Wait() }, nil
}

// FreePort is a loopback address no one listens on.
func FreePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// MountCell mounts the cell's root at mnt: a daemon with a cache of its
// own. It returns the unmount.
func MountCell(bin, addr, mnt, cacheDir string, flags ...string) (func(), error) {
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, err
	}
	args := append([]string{"mount", "--server", addr, "--cache", cacheDir, "--daemon"}, flags...)
	if !slices.Contains(flags, "--ca") {
		args = append(args, "--insecure")
	}
	if out, err := exec.Command(bin, append(args, mnt)...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mount: %v: %s", err, out)
	}
	return func() { exec.Command(bin, "umount", mnt).Run() }, nil
}

// DialAll dials n clients, client i with opts(i); on an error the ones
// dialed are closed.
func DialAll(n int, opts func(i int) client.Options) ([]*pathfs.FS, error) {
	cs := make([]*pathfs.FS, 0, n)
	for i := range n {
		c, err := pathfs.Dial(opts(i))
		if err != nil {
			CloseAll(cs)
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// CloseAll closes the clients cs.
func CloseAll(cs []*pathfs.FS) {
	for _, c := range cs {
		c.Close()
	}
}

// Collect is the errors sent on errs until it closes.
func Collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}
