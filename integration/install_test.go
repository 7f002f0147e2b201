package integration

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hoard version and hoard --version say the version, the commit and its
// date, the build date (make build sets it) and the Go release.
func TestVersion(t *testing.T) {
	want := regexp.MustCompile(`(?s)^hoard \S+\ncommit: [0-9a-f]{40}( \(with uncommitted changes\))?, of \S+\nbuilt: 20\d\d-\S+Z\ngo: go1\.\d+\S* \w+/\w+\n$`)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, code := run(t, args...)
		if code != 0 || !want.MatchString(out) {
			t.Errorf("hoard %s: exit %d:\n%s", args[0], code, out)
		}
	}
	if out, code := run(t, "version", "extra"); code != 2 {
		t.Errorf("hoard version extra: exit %d: %q", code, out)
	}
}

// make man's pages: one per command, from the commands' own help.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	if out, code := run(t, "man", dir); code != 0 {
		t.Fatalf("hoard man: exit %d: %s", code, out)
	}
	for _, c := range []struct{ page, want string }{
		{"hoard.1", `.TH "HOARD" "1"`},
		// Each page is titled by its command.
		{"hoard-mount.1", `.TH "HOARD-MOUNT" "1"`},
		{"hoard-vol-move.1", `.TH "HOARD-VOL-MOVE" "1"`},
		{"hoard-server.1", "--metrics"},
		{"hoard-vol-release.1", "read-only sites"},
		{"hoard-mount.1", "mount.log in the cache directory"},
		{"hoard-cache-stats.1", "hits"},
		{"hoard-vol-addsite.1", "SERVER"},
	} {
		b, err := os.ReadFile(filepath.Join(dir, c.page))
		if err != nil || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: %v; want it to say %q", c.page, err, c.want)
		}
	}
	// A default from the environment of whoever made the pages shows as
	// the reader's own.
	if home, err := os.UserHomeDir(); err == nil && home != "/" {
		b, _ := os.ReadFile(filepath.Join(dir, "hoard-mount.1"))
		if strings.Contains(string(b), home+"/") || !strings.Contains(string(b), `--cache\fP="~/`) {
			t.Errorf("hoard-mount.1 shows %s's cache as the default, or no ~/ one", home)
		}
	}
}

// The systemd units in contrib/ use only flags hoard has, and pass
// systemd-analyze verify but for the binary not being installed.
func TestSystemdUnits(t *testing.T) {
	units, err := filepath.Glob(filepath.Join("..", "contrib", "systemd", "*.service"))
	if err != nil || len(units) != 3 {
		t.Fatalf("units: %v %v", units, err)
	}
	flag := regexp.MustCompile(`--[a-z-]+`)
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			cmdline, ok := strings.CutPrefix(line, "ExecStart=/usr/bin/hoard ")
			if !ok {
				cmdline, ok = strings.CutPrefix(line, "ExecStop=/usr/bin/hoard ")
			}
			if !ok {
				continue
			}
			sub := strings.Fields(cmdline)[0]
			help, code := run(t, sub, "--help")
			if code != 0 {
				t.Fatalf("%s: hoard %s --help: exit %d", u, sub, code)
			}
			for _, f := range flag.FindAllString(cmdline, -1) {
				if !strings.Contains(help, f+" ") {
					t.Errorf("%s: hoard %s has no flag %s", filepath.Base(u), sub, f)
				}
			}
		}
		if _, err := exec.LookPath("systemd-analyze"); err != nil {
			continue
		}
		out, _ := exec.Command("systemd-analyze", "verify", u).CombinedOutput()
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line != "" && !strings.Contains(line, "/usr/bin/hoard is not executable") && !strings.Contains(line, "Command 'man ") {
				t.Errorf("systemd-analyze verify %s: %s", filepath.Base(u), line)
			}
		}
	}
}

// A server started by systemd as a Type=notify service says when it is
// ready, and when it stops.
func TestNotifyReady(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cmd := exec.Command(hoardBin, "server", "--insecure", "--data", t.TempDir(), "--listen", freeAddr(t))
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	next := func() string {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		buf := make([]byte, 256)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no word from the server on NOTIFY_SOCKET: %v", err)
		}
		return string(buf[:n])
	}
	if got := next(); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if got := next(); got != "STOPPING=1" {
		t.Fatalf("notification on SIGTERM %q, want STOPPING=1", got)
	}
	cmd.Wait()
}

// A mount --daemon that fails says why, in the daemon's words, on one
// line: not only where its log is.
func TestMountDaemonFails(t *testing.T) {
	needFuse(t)
	addr, dir, cache := freeAddr(t), t.TempDir(), t.TempDir()
	out, code := run(t, "mount", "--daemon", "--server", addr, "--cache", cache, "--timeout", "1s", "--insecure", dir)
	want := "hoard: the mount daemon failed: server " + addr + " unreachable: connection refused (log "
	if code != 1 || !strings.HasPrefix(out, want) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("mount --daemon of an unreachable server: exit %d: %q, want %q...", code, out, want)
	}
}

// Every command's help has an example (its man page an EXAMPLE section).
func TestEveryCommandHasAnExample(t *testing.T) {
	dir := t.TempDir()
	if out, code := run(t, "man", dir); code != 0 {
		t.Fatalf("hoard man: exit %d: %s", code, out)
	}
	pages, _ := filepath.Glob(filepath.Join(dir, "*.1"))
	if len(pages) < 50 {
		t.Fatalf("%d man pages", len(pages))
	}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "\n.SH EXAMPLE") {
			t.Errorf("%s has no example (%v)", strings.TrimSuffix(filepath.Base(p), ".1"), err)
		}
	}
}
