package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// A bypassed file is stored as many stores behind the writer; what its
// close publishes must be all or nothing, as a cached file's is.

const (
	crashOld   = 48 << 20  // the old version
	crashNew   = 100 << 20 // the new one, written over it
	crashFile  = "/__big"  // bypassed by its name
	crashRuns  = 10
	writerStep = 1 << 20
)

// The writer runs in a process of its own (this test binary again), so
// that it can be killed: it says "wrote N" after each MiB.
func init() {
	if os.Getenv("HOARD_TEST_BYPASS_WRITER") != "" {
		os.Exit(bypassWriter())
	}
}

func bypassWriter() int {
	c, err := cellDial(client.Options{Server: os.Getenv("HOARD_TEST_SERVER"), CacheDir: os.Getenv("HOARD_TEST_CACHE"),
		DialTimeout: 5 * time.Second, RPCTimeout: 3 * time.Second, NoDataChannel: os.Getenv("HOARD_TEST_GRPC") != ""})
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	f, err := c.Open(crashFile, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	data := testkit.Pattern(crashNew, 2)
	for off := 0; off < len(data); off += writerStep {
		if _, err := f.Write(data[off : off+writerStep]); err != nil {
			fmt.Println("write:", err)
			fmt.Println("close:", f.Close())
			return 1
		}
		fmt.Println("wrote", off+writerStep)
	}
	fmt.Println("close:", f.Close())
	return 0
}

// startBypassWriter starts the writer and returns its output lines.
func startBypassWriter(t *testing.T, srv *serverProc, cache string, grpc bool) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "HOARD_TEST_BYPASS_WRITER=1", "HOARD_TEST_SERVER="+srv.addr, "HOARD_TEST_CACHE="+cache)
	if grpc {
		cmd.Env = append(cmd.Env, "HOARD_TEST_GRPC=1")
	}
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, lines
}

// waitWrote waits until the writer says it wrote at least n bytes.
func waitWrote(t *testing.T, lines <-chan string, n int) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the writer ended before writing %d bytes", n)
			}
			if k, err := strconv.Atoi(strings.TrimPrefix(l, "wrote ")); err == nil && k >= n {
				return
			} else if !strings.HasPrefix(l, "wrote ") {
				t.Fatalf("writer: %s", l)
			}
		case <-timeout:
			t.Fatalf("the writer did not write %d bytes in 60 s", n)
		}
	}
}

// wholly checks that the file is the old version or the new, and says
// which.
func wholly(t *testing.T, c *pathfs.FS, old, new []byte) string {
	t.Helper()
	got := testkit.ReadFile(t, c, crashFile)
	switch {
	case bytes.Equal(got, old):
		return "old"
	case bytes.Equal(got, new):
		return "new"
	}
	same := 0
	for same < len(got) && same < len(new) && got[same] == new[same] {
		same++
	}
	t.Fatalf("torn: %d bytes, the first %d of them new (old is %d bytes, new %d)", len(got), same, len(old), len(new))
	return ""
}

// stagingEmpty waits for the server's staging directory to empty: a
// stage goes with its session.
func stagingEmpty(t *testing.T, data string) {
	t.Helper()
	dir := filepath.Join(data, "staging")
	var ents []os.DirEntry
	if !poll.Until(10*time.Second, func() bool { ents, _ = os.ReadDir(dir); return len(ents) == 0 }) {
		t.Fatalf("%d staging files left 10 s after the writer's session ended", len(ents))
	}
}

// crashSetup starts a server (its data directory data), a client of it,
// and a random source for where the crashes strike.
func crashSetup(t *testing.T) (data string, srv *serverProc, c *pathfs.FS, rng *rand.Rand) {
	data = t.TempDir()
	srv = startServer(t, data)
	return data, srv, dial(t, srv.addr, t.TempDir(), 256<<20), rand.New(rand.NewSource(time.Now().UnixNano()))
}

// Killing the writer mid-write leaves the old file: its stage goes with
// its session, and nothing of it was published.
func TestBypassCrashWriter(t *testing.T) {
	data, srv, c, rng := crashSetup(t)
	old, new := testkit.Pattern(crashOld, 1), testkit.Pattern(crashNew, 2)
	for i := 0; i < crashRuns; i++ {
		testkit.WriteFile(t, c, crashFile, old)
		cmd, lines := startBypassWriter(t, srv, t.TempDir(), i%2 == 1)
		at := (8 + rng.Intn(84)) << 20
		waitWrote(t, lines, at)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if got := wholly(t, c, old, new); got != "old" {
			t.Fatalf("run %d: killed after %d MiB, the file is the %s one", i, at>>20, got)
		}
		stagingEmpty(t, data)
	}
}

// Killing the server mid-write leaves the old file, or (the writer carried
// on once it was back) the new one. Every other run the server stays down
// until the writer gave up, whose close then fails with EIO: a bypassed
// file keeps no local copy of its writes.
func TestBypassCrashServer(t *testing.T) {
	_, srv, c, rng := crashSetup(t)
	old, new := testkit.Pattern(crashOld, 1), testkit.Pattern(crashNew, 2)
	for i := 0; i < crashRuns; i++ {
		testkit.WriteFile(t, c, crashFile, old)
		cache := t.TempDir()
		cmd, lines := startBypassWriter(t, srv, cache, i%2 == 1)
		at := (8 + rng.Intn(84)) << 20
		waitWrote(t, lines, at)
		srv.kill9()
		var last string
		down := i%4 >= 2
		if down {
			for l := range lines {
				if last = l; strings.HasPrefix(l, "close: ") {
					break
				}
			}
		}
		srv.restart()
		for l := range lines {
			last = l
		}
		cmd.Wait()
		got := wholly(t, c, old, new)
		switch {
		case got == "old" && (!strings.HasPrefix(last, "close: ") || strings.HasSuffix(last, "<nil>")):
			t.Fatalf("run %d: the file is the old one, but the writer's close said %q", i, last)
		case got == "old" && !strings.Contains(last, "input/output error"):
			t.Fatalf("run %d: the file is the old one, and the writer's close said %q, want EIO", i, last)
		case got == "new" && last != "close: <nil>":
			t.Fatalf("run %d: the file is the new one, but the writer's close said %q", i, last)
		}
		t.Logf("run %d: server killed after %d MiB written (down until the writer gave up: %v): %s", i, at>>20, down, got)
	}
}
