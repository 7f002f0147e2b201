package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/poll"
)

// writeConfig writes a configuration file into a new directory.
func writeConfig(t testing.TB, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// showLine is the line of flag in hoard config show's output.
func showLine(out, flag string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == flag {
			return strings.Join(f, " ")
		}
	}
	return ""
}

// A flag on the command line beats HOARD_<FLAG>, which beats the file,
// which beats the default; the most specific table of the file wins.
func TestConfigPrecedence(t *testing.T) {
	cfg := writeConfig(t, `log-level = "info"
timeout = "7s"
[mount]
cache = "/var/cache/hoard-test"
server = "file.example:7100"
data-streams = 2
[vol]
server = "vol.example:7100"
[vol.move]
server = "move.example:7100"
`)
	out, code := runEnv(t, []string{"HOARD_SERVER=env.example:7100", "HOARD_DATA_STREAMS=3"},
		"config", "show", "mount", "--config", cfg, "--data-streams", "5")
	if code != 0 {
		t.Fatalf("config show mount: exit %d: %s", code, out)
	}
	for flag, want := range map[string]string{
		"data-streams": "data-streams 5 flag",
		"server":       "server env.example:7100 env HOARD_SERVER",
		"cache":        "cache /var/cache/hoard-test " + cfg + ": line 4 [mount]",
		"timeout":      "timeout 7s " + cfg + ": line 2",
		"log-level":    "log-level info " + cfg + ": line 1",
		"cache-size":   "cache-size 1G default",
	} {
		if got := showLine(out, flag); got != want {
			t.Errorf("config show mount: %q, want %q\n%s", got, want, out)
		}
	}
	for cmd, want := range map[string]string{
		"vol move":   "server move.example:7100 " + cfg + ": line 10 [vol.move]",
		"vol create": "server vol.example:7100 " + cfg + ": line 8 [vol]",
		"ls":         "server 127.0.0.1:7100 default",
	} {
		args := append(append([]string{"config", "show"}, strings.Fields(cmd)...), "--config", cfg)
		out, code := runEnv(t, []string{"HOARD_SERVER="}, args...)
		if got := showLine(out, "server"); code != 0 || got != want {
			t.Errorf("config show %s: exit %d, %q, want %q\n%s", cmd, code, got, want, out)
		}
	}

	// Without --config: the user's file, found through XDG_CONFIG_HOME
	// (and /etc/hoard/hoard.toml, which a test leaves alone).
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, "hoard"), 0o755)
	user := filepath.Join(home, "hoard", "config.toml")
	os.WriteFile(user, []byte("[mount]\ncache-size = \"3G\"\n"), 0o644)
	out, _ = runEnv(t, []string{"XDG_CONFIG_HOME=" + home}, "config", "show", "mount")
	if got, want := showLine(out, "cache-size"), "cache-size 3G "+user+": line 2 [mount]"; got != want {
		t.Errorf("the user's configuration file: %q, want %q\n%s", got, want, out)
	}
	// HOARD_CONFIG names the one file instead.
	out, _ = runEnv(t, []string{"XDG_CONFIG_HOME=" + home, "HOARD_CONFIG=" + cfg}, "config", "show", "mount")
	if got := showLine(out, "cache-size"); got != "cache-size 1G default" {
		t.Errorf("HOARD_CONFIG: %q, want the default\n%s", got, out)
	}
}

// Started with no environment at all, as a system unit is, a command
// finds its user's directories through the user database: the cache is
// the one a shell's mount uses, not a memory cache, and the logins are
// read where hoard login wrote them.
func TestNoHomeEnvironment(t *testing.T) {
	u, err := user.Current()
	if err != nil || u.HomeDir == "" {
		t.Skipf("no home directory in the user database: %v", err)
	}
	cmd := exec.Command(hoardBin, "config", "show", "mount")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("config show: %v\n%s", err, out)
	}
	if got, want := showLine(string(out), "cache"), "cache "+filepath.Join(u.HomeDir, ".cache", "hoard")+" default"; got != want {
		t.Errorf("without $HOME: %q, want %q\n%s", got, want, out)
	}
}

// A server takes its data directory from the file, and its address from
// the environment over the file's.
func TestConfigServerFromFile(t *testing.T) {
	data, addr := t.TempDir(), freeAddr(t)
	cfg := writeConfig(t, fmt.Sprintf("log-level = \"info\"\n[server]\ndata = %q\ncell = %q\nlisten = \"127.0.0.1:1\"\n", data, testCell.dir))
	cmd := exec.Command(hoardBin, "server", "--config", cfg)
	cmd.Env = append(os.Environ(), "HOARD_LISTEN="+addr)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sc := bufio.NewScanner(stderr)
	banner := ""
	for sc.Scan() {
		if strings.Contains(sc.Text(), "serving") {
			banner = sc.Text()
			break
		}
	}
	if want := "hoard server: serving " + data + " on " + addr; !strings.HasPrefix(banner, want) {
		t.Fatalf("server configured by a file: %q, want %q...", banner, want)
	}
	if _, err := os.Stat(filepath.Join(data, "session.key")); err != nil {
		t.Fatalf("the data directory from the file holds no server: %v", err)
	}
}

// Each mistake in a file, or the environment, is one line naming the
// file, the line and the key, and exit 2, before the command does
// anything.
func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		text string
		args []string
		env  []string
		want string // %s: the file
	}{
		{"log-level = \"info\"\n\n[mount\ncache = \"/x\"\n", []string{"version"}, nil,
			"hoard: %s:3: expected ']' to close table name"},
		{"log-level = \"info\"\n[mount]\ncolour = \"blue\"\n", []string{"version"}, nil,
			`hoard: %s: line 3: unknown key "colour" in [mount]`},
		// A mount's flag, in the table of a server that has none such.
		{"[mount]\npassthrough = false\n[server]\npassthrough = false\n", []string{"version"}, nil,
			`hoard: %s: line 4: unknown key "passthrough" in [server]`},
		{"colour = 1\n", []string{"version"}, nil,
			`hoard: %s: line 1: unknown key "colour"`},
		{"[vol.mvoe]\nto = \"s\"\n", []string{"version"}, nil,
			"hoard: %s: line 1: unknown table [vol.mvoe]: no command hoard vol mvoe"},
		{"vol = { move = { tx = \"s\" } }\n", []string{"version"}, nil,
			`hoard: %s: line 1: unknown key "tx" in [vol.move]`},
		{"log-level = \"info\"\n[server]\nmax-sessions = \"abc\"\n", []string{"server", "--data", dir, "--listen", freeAddr(t)}, nil,
			`hoard: %s: line 3: invalid value "abc" for max-sessions in [server]: strconv.ParseInt: parsing "abc": invalid syntax`},
		{"[mount]\ntimeout = 5\n", []string{"config", "show", "mount"}, nil,
			`hoard: %s: line 2: invalid value 5 for timeout in [mount]: time: missing unit in duration "5"`},
		// A size is checked where it is read, not first when used.
		{"[mount]\ncache-size = \"lots\"\n", []string{"config", "show", "mount"}, nil,
			`hoard: %s: line 2: invalid value "lots" for cache-size in [mount]: want a positive size such as 4096, 512M or 10G`},
		{"", []string{"config", "show", "proxy"}, []string{"HOARD_CACHE_SIZE=10Q"},
			`hoard: HOARD_CACHE_SIZE="10Q": invalid value for --cache-size: want a positive size such as 4096, 512M or 10G`},
		{"", []string{"server", "--data", dir, "--listen", freeAddr(t)}, []string{"HOARD_MAX_SESSIONS=abc"},
			`hoard: HOARD_MAX_SESSIONS="abc": invalid value for --max-sessions: strconv.ParseInt: parsing "abc": invalid syntax`},
	}
	for _, c := range cases {
		cfg := writeConfig(t, c.text)
		out, code := runEnv(t, c.env, append(c.args, "--config", cfg)...)
		want := c.want
		if strings.Contains(want, "%s") {
			want = fmt.Sprintf(want, cfg)
		}
		if code != 2 || strings.TrimSpace(out) != want {
			t.Errorf("file %q, hoard %s: exit %d, %q\nwant exit 2, %q", c.text, strings.Join(c.args, " "), code, out, want)
		}
	}
	// The mount's flag in its own table is fine.
	cfg := writeConfig(t, "[mount]\npassthrough = false\n")
	if out, code := run(t, "config", "show", "mount", "--config", cfg); code != 0 || showLine(out, "passthrough") != "passthrough false "+cfg+": line 2 [mount]" {
		t.Errorf("a mount's flag in [mount]: exit %d: %s", code, out)
	}
	missing := filepath.Join(dir, "none.toml")
	if out, code := runEnv(t, nil, "version", "--config", missing); code != 2 || strings.TrimSpace(out) != "hoard: --config "+missing+": no such file or directory" {
		t.Errorf("--config of a missing file: exit %d, %q", code, out)
	}
	// The server did not start on any of them.
	if _, err := os.Stat(filepath.Join(dir, "session.key")); err == nil {
		t.Error("a server started despite a bad configuration")
	}
}

// Under systemd, with stderr the journal's stream (JOURNAL_STREAM names
// its device and inode), records carry no time: journald stamps them.
func TestLogJournald(t *testing.T) {
	stopLine := func(journal bool) string {
		t.Helper()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var st syscall.Stat_t
		if err := syscall.Fstat(int(w.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(hoardBin, "server", "--insecure", "--data", t.TempDir(), "--listen", freeAddr(t), "--log-level", "info")
		cmd.Stderr = w
		cmd.Env = os.Environ()
		if journal {
			cmd.Env = append(cmd.Env, fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "serving") {
				cmd.Process.Signal(syscall.SIGTERM)
			}
			if strings.Contains(sc.Text(), "msg=stopping") {
				return sc.Text()
			}
		}
		t.Fatal("the server logged no msg=stopping")
		return ""
	}
	if l := stopLine(true); strings.Contains(l, "time=") || !strings.HasPrefix(l, "level=INFO msg=stopping") {
		t.Errorf("on the journal's stream: %q, want no time=", l)
	}
	if l := stopLine(false); !strings.HasPrefix(l, "time=") {
		t.Errorf("on a plain stderr: %q, want time=", l)
	}
}

// A server's --logfile takes its records; stderr keeps its banner.
func TestServerLogfile(t *testing.T) {
	log := filepath.Join(t.TempDir(), "logs", "server.log")
	srv := startServer(t, t.TempDir(), "--logfile", log, "--log-level", "debug")
	out, code := run(t, "ls", "--server", srv.addr, "--cache", "", "/")
	if code != 0 {
		t.Fatalf("ls: exit %d: %s", code, out)
	}
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "msg=request") {
		t.Errorf("server log file: %q, want its requests", b)
	}
	if logs := srv.logs.String(); strings.Contains(logs, "msg=request") || !strings.Contains(logs, "serving") {
		t.Errorf("server stderr with --logfile: %q, want the banner and no records", logs)
	}
	if out, code := runEnv(t, nil, "server", "--data", t.TempDir(), "--logfile", "/proc/nope/server.log"); code != 2 || !strings.HasPrefix(out, "hoard: --logfile /proc/nope/server.log: ") {
		t.Errorf("--logfile in a directory that cannot be: exit %d, %q", code, out)
	}
}

// A mount daemon's log is rotated at --log-max-size, its FUSE trace in
// it; a panic's trace (here SIGQUIT's dump) lands in the file being
// written, not in a rotated one.
func TestMountDaemonLogRotation(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	dir, cache := t.TempDir(), t.TempDir()
	out, code := run(t, "mount", "--daemon", "--server", srv.addr, "--cache", cache, "--log-level", "debug", "--debug",
		"--log-max-size", "1", "--log-backups", "2", dir)
	if code != 0 {
		t.Fatalf("mount --daemon: exit %d: %s", code, out)
	}
	pidText, _ := os.ReadFile(filepath.Join(cache, "mount.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pidText)))
	t.Cleanup(func() {
		if pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		run(t, "umount", "--wait", "0", dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(cache, "mount.log")
	backups := func() []string {
		b, _ := filepath.Glob(filepath.Join(cache, "mount-*.log*"))
		return b
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(backups()) == 0 {
		if time.Now().After(deadline) {
			fi, _ := os.Stat(log)
			t.Fatalf("no rotated log after a minute of FUSE requests (mount.log: %v)", fi.Size())
		}
		for range 100 {
			os.ReadFile(filepath.Join(dir, "f"))
			os.Stat(filepath.Join(dir, "nothing"))
		}
	}
	if fi, err := os.Stat(log); err != nil || fi.Size() > 1<<20 {
		t.Fatalf("mount.log after rotation: %v %v", fi, err)
	}
	// Descriptor 2, where the runtime writes the dump, follows the
	// rotation once the write that rotated returns: a record written
	// after it (writes take turns) says it has.
	size := func() int64 {
		fi, _ := os.Stat(log)
		if fi == nil {
			return 0
		}
		return fi.Size()
	}
	for rotated := size(); size() <= rotated; {
		if time.Now().After(deadline) {
			t.Fatal("nothing logged after the rotation")
		}
		os.Stat(filepath.Join(dir, "nothing"))
	}
	syscall.Kill(pid, syscall.SIGQUIT)
	poll.Wait(t, 10*time.Second, "the daemon's end after SIGQUIT", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(b), ") Z ")
	})
	pid = 0
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "SIGQUIT: quit") || !strings.Contains(string(b), "goroutine ") {
		t.Errorf("the daemon's dump on SIGQUIT is not in mount.log (%d bytes; backups %v)", len(b), backups())
	}
}

// A mount --daemon whose cache comes from the configuration file keeps
// its pid and log there, and hoard umount finds it.
func TestMountDaemonCacheFromConfig(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	dir, cache := t.TempDir(), t.TempDir()
	cfg := writeConfig(t, fmt.Sprintf("[mount]\ncache = %q\nserver = %q\ndaemon = true\n", cache, srv.addr))
	out, code := run(t, "mount", "--config", cfg, dir)
	t.Cleanup(func() { run(t, "umount", "--wait", "0", dir) })
	if want := ", log " + filepath.Join(cache, "mount.log"); code != 0 || !strings.Contains(out, "mounted at "+dir) || !strings.Contains(out, want) {
		t.Fatalf("mount with its cache and --daemon from a file: exit %d: %q, want %q", code, out, want)
	}
	if _, err := os.Stat(filepath.Join(cache, "mount.pid")); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, "umount", dir); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
}
