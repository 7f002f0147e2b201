package integration

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// Ctrl-C of make run stores what the mount holds before the server stops:
// the terminal's SIGINT reaches every process of the foreground job, the
// script's and the server's alike, and a server that stopped first left
// the mount's write-back nowhere to go (the writes went to lost/).
func TestMakeRunCtrlC(t *testing.T) {
	needFuse(t)
	top := t.TempDir()
	data, listen := filepath.Join(top, "server"), freeAddr(t)
	script, err := filepath.Abs("../scripts/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(script, hoardBin, data, listen)
	cmd.Env = append(os.Environ(), "HOARD_MNT="+filepath.Join(top, "mnt"), "HOARD_CACHE="+filepath.Join(top, "cache"))
	// A terminal's foreground job: its own process group, which Ctrl-C
	// signals whole.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, _ := cmd.StdoutPipe()
	logs := &logBuf{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		exec.Command(hoardBin, "umount", filepath.Join(top, "mnt")).Run()
	})
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "hoard is running") {
				ready <- true
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("make run did not mount:\n%s", logs)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("make run did not come up:\n%s", logs)
	}
	want := testkit.Pattern(200<<10, 3)
	if err := os.WriteFile(filepath.Join(top, "mnt", "last"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("make run did not stop on Ctrl-C:\n%s", logs)
	}
	if strings.Contains(logs.String(), "could not be stored") {
		t.Fatalf("Ctrl-C sent writes to lost/:\n%s", logs)
	}
	srv := exec.Command(hoardBin, "server", "--data", data, "--listen", listen)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	env := append(os.Environ(), "HOARD_CA="+filepath.Join(data, "cell", "ca.crt"))
	var got string
	poll.Wait(t, 30*time.Second, "the server back after Ctrl-C", func() bool {
		got, _ = runEnv(t, env, "cat", "/last", "--server", listen, "--cache", "", "--token", filepath.Join(data, "cell", "admin.token"))
		return len(got) >= len(want)
	})
	if !bytes.Equal([]byte(got), want) {
		t.Fatalf("the last write before Ctrl-C: %d bytes at the server, want %d\n%s", len(got), len(want), logs)
	}
}
