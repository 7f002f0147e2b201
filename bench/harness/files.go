package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/client/pathfs"
)

// WriteLocal writes size bytes, data repeated, to a new file at path.
func WriteLocal(path string, data []byte, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return fillAndClose(f, data, size)
}

// WriteRemote writes size bytes, data repeated, to a new file at path
// through c.
func WriteRemote(c *pathfs.FS, path string, data []byte, size int64) error {
	f, err := c.Create(path)
	if err != nil {
		return err
	}
	return fillAndClose(f, data, size)
}

// fillAndClose writes size bytes, data repeated, then closes.
func fillAndClose(f io.WriteCloser, data []byte, size int64) error {
	if err := Fill(f, data, size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Fill writes size bytes, data repeated.
func Fill(f io.Writer, data []byte, size int64) error {
	for off := int64(0); off < size; off += int64(len(data)) {
		if _, err := f.Write(data[:min(int64(len(data)), size-off)]); err != nil {
			return err
		}
	}
	return nil
}

// RawTCP copies the local file over a loopback TCP connection (sendfile on
// the sending side, a plain read loop on the receiving side, writing into
// the file sink unless it is empty) and times it.
func (e *Env) RawTCP(path string, size int64, sink string) (time.Duration, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		io.Copy(conn, f)
	}()
	e.ReadLocal(path, size) // the sender reads from the page cache, as hoard's server does
	var out *os.File
	if sink != "" {
		if out, err = os.Create(sink); err != nil {
			return 0, err
		}
		defer os.Remove(sink)
		defer out.Close()
	}
	start := time.Now()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	p := make([]byte, 256<<10)
	var got int64
	for got < size {
		n, err := conn.Read(p)
		if out != nil && n > 0 {
			if _, werr := out.Write(p[:n]); werr != nil {
				return 0, werr
			}
		}
		got += int64(n)
		if err != nil {
			break
		}
	}
	if got != size {
		return 0, fmt.Errorf("raw TCP moved %d bytes, want %d", got, size)
	}
	return time.Since(start), nil
}

var readBuf = make([]byte, 1<<20)

// ReadFile reads a whole file with 1 MiB reads into one reused buffer.
func ReadFile(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total int64
	for {
		n, err := f.Read(readBuf)
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// FindCat is `find DIR -type f | xargs cat > /dev/null`, until ctx ends.
func FindCat(ctx context.Context, dir string) error {
	_, err := RunCmd(ctx, "bash", "-o", "pipefail", "-c", `find "$1" -type f -print0 | xargs -0 cat > /dev/null`, "bash", dir)
	return err
}

// DropCaches empties the page cache (root only) so a cold run is cold.
func DropCaches() {
	syscall.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o644)
}

// killable is exec.CommandContext for commands with children (a shell's
// pipeline): ctx's end kills its whole process group.
func killable(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// RunCmd runs a command until ctx ends and returns its standard output;
// its failure is an error with what it wrote to standard error.
func RunCmd(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := killable(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}
