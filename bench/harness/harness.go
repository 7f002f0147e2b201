// Package harness is what bench's parts share, so that each part can be
// a package of its own: the run they are handed (Env), hoard's processes
// started and mounted, files written, read and timed, and the units the
// tables print in. It imports no part.
package harness

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/hoardfs/hoard/bench/chart"
	"github.com/hoardfs/hoard/client/pathfs"
)

// Env is one run of the bench as a part sees it: the hoard binary, the
// scratch directory, the server bench started, and the flags more than
// one part reads.
type Env struct {
	Bin       string // the hoard binary (HOARD_BIN)
	Scratch   string // the scratch directory, on the disk measured
	Addr      string // the server the parts in all share
	ServerPID int
	Size      int64    // -size: bytes in the large file
	Files     int      // -files: number of small files
	Small     int      // -small: bytes in each small file
	ReadSize  int      // -read: the size of ReadLocal's and ReadRemote's reads
	Charts    string   // -charts: where Figure saves, "" for nowhere
	Args      []string // the flags given but -charts, for the figures' notes
}

// Figure saves c as name in -charts, if given, under a note of the
// machine, the date and the command that measured it.
func (e *Env) Figure(name string, c *chart.Chart) error {
	if e.Charts == "" {
		return nil
	}
	c.Note = fmt.Sprintf("%s; %s, bench %s", MachineInfo(), time.Now().Format("2006-01-02"), strings.Join(e.Args, " "))
	if err := c.Save(e.Charts, name); err != nil {
		return fmt.Errorf("figure %s: %w", name, err)
	}
	fmt.Printf("\n(figure: %s/%s.svg)\n", e.Charts, name)
	return nil
}

// ReadLocal times reading size bytes of the file at path, -read at a time.
func (e *Env) ReadLocal(path string, size int64) (time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return e.readAll(f, size)
}

// ReadRemote times reading size bytes of the file at path through c,
// -read at a time.
func (e *Env) ReadRemote(c *pathfs.FS, path string, size int64) (time.Duration, error) {
	f, err := c.Open(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return e.readAll(f, size)
}

func (e *Env) readAll(r io.ReaderAt, size int64) (time.Duration, error) {
	p := make([]byte, e.ReadSize)
	start := time.Now()
	var off int64
	for off < size {
		n, err := r.ReadAt(p, off)
		off += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if off != size {
		return 0, fmt.Errorf("read %d bytes, want %d", off, size)
	}
	return time.Since(start), nil
}

// MinDur is the shorter of a and b, b if a is 0 (none yet).
func MinDur(a, b time.Duration) time.Duration {
	if a == 0 || b < a {
		return b
	}
	return a
}

// MBps is n bytes in d, in MB/s.
func MBps(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }

// Human is n bytes in the largest binary unit that divides it.
func Human(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// MiB is n bytes in whole MiB.
func MiB(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

// Micros is d in µs.
func Micros(d time.Duration) float64 { return float64(d) / 1e3 }

// ProcCPU is a process's user+system CPU time so far, from /proc.
func ProcCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	var utime, stime int64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// MachineInfo names the machine: cores, CPU, memory, kernel and Go.
func MachineInfo() string {
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscan(strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1], &kb)
		mem = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
	}
	return fmt.Sprintf("%d cores (%s), %s RAM, kernel %s, Go %s", runtime.NumCPU(), cpu, mem, strings.TrimSpace(string(kernel)), runtime.Version())
}
