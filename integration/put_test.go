package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/testkit"
)

// Ctrl-C of hoard put leaves the file it was replacing as it was, no
// partial file at the server, and nothing in the cache's lost/: an
// interrupted copy is dropped, not a write that failed to arrive.
func TestPutInterrupted(t *testing.T) {
	srv := startServer(t, t.TempDir())
	cache := t.TempDir()
	c := dial(t, srv.addr, "mem", 64<<20)
	testkit.WriteFile(t, c, "/target", []byte("the old file"))
	fifo := filepath.Join(t.TempDir(), "in")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	put := exec.Command(hoardBin, "put", fifo, "/target", "--server", srv.addr, "--cache", cache, "--cache-size", "16M")
	logs := &logBuf{}
	put.Stdout, put.Stderr = logs, logs
	if err := put.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- put.Wait() }()
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	chunk := testkit.Pattern(1<<20, 1)
	for range 40 { // past the cache: some of it stored already
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	put.Process.Signal(syscall.SIGINT)
	// The put finds out between reads.
	go func() {
		for range 100 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("an interrupted put exited 0: %s", logs)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("put did not stop on SIGINT: %s", logs)
	}
	w.Close()
	if got := string(testkit.ReadFile(t, c, "/target")); got != "the old file" {
		t.Fatalf("after an interrupted put the target holds %d bytes", len(got))
	}
	if names := testkit.Names(t, c, "/"); len(names) != 1 {
		t.Fatalf("after an interrupted put the directory holds %v", names)
	}
	if out, _ := run(t, "cache", "lost", "--cache", cache); !strings.Contains(out, "no lost writes") {
		t.Fatalf("an interrupted put left lost writes: %s", out)
	}
	// And a put that is not interrupted replaces the file whole.
	local := filepath.Join(t.TempDir(), "new")
	os.WriteFile(local, chunk, 0o644)
	if out, code := run(t, "put", local, "/target", "--server", srv.addr, "--cache", cache); code != 0 {
		t.Fatalf("put: %d %s", code, out)
	}
	if got := testkit.ReadFile(t, c, "/target"); len(got) != len(chunk) {
		t.Fatalf("after a put: %d bytes", len(got))
	}
}
