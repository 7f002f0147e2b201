package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The commands of a cell's life, as a new operator runs them: make a
// cell, a server of it, tokens for users; log in, check who you are, set
// ACLs, make groups, revoke, log out.
func TestCellCommands(t *testing.T) {
	tmp := t.TempDir()
	cellDir := filepath.Join(tmp, "cell")
	// hoard runs with a config dir of its own and none of the tests'
	// cell in its environment.
	env := []string{"XDG_CONFIG_HOME=" + filepath.Join(tmp, "config"), "HOME=" + tmp, "PATH=" + os.Getenv("PATH")}
	hoard := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(hoardBin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	must := func(want string, args ...string) string {
		t.Helper()
		out, code := hoard(args...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("hoard %s: exit %d: %s; want %q", strings.Join(args, " "), code, out, want)
		}
		return out
	}
	refused := func(want string, code int, args ...string) {
		t.Helper()
		out, got := hoard(args...)
		if got != code || !strings.Contains(out, want) || strings.Count(strings.TrimSpace(out), "\n") > 0 {
			t.Fatalf("hoard %s: exit %d: %s; want exit %d and one line saying %q", strings.Join(args, " "), got, out, code, want)
		}
	}

	must("hoard login --ca", "cell", "init", "--dir", cellDir, "--name", "example")
	refused("already", 1, "cell", "init", "--dir", cellDir)
	must(filepath.Join(cellDir, "servers", "fs2"), "cell", "cert", "--dir", cellDir, "--server", "fs2")
	refused("--server", 2, "cell", "cert", "--dir", cellDir)
	srv := startProc(t, "server", filepath.Join(tmp, "data"), []string{"server", "--data", filepath.Join(tmp, "data"), "--cell", filepath.Join(cellDir, "servers", "fs2")}, nil)
	if !strings.Contains(srv.logs.String(), "cell example, TLS 1.3") {
		t.Fatalf("the server does not say its cell: %s", srv.logs)
	}
	at := []string{"--server", srv.addr, "--cache", ""}

	// No login yet: no CA to trust, so nothing is sent.
	refused("no cell CA", 2, append([]string{"ls", "/"}, at...)...)
	ca := filepath.Join(cellDir, "ca.crt")
	// Anonymous may not even look at the root volume, and is told so;
	// asked who it is, the server says.
	refused("anonymous: not permitted to look up volume root", 1, append([]string{"ls", "/", "--ca", ca}, at...)...)
	if out, code := hoard(append([]string{"whoami", "--ca", ca}, at...)...); code != 0 || !strings.HasPrefix(out, "anonymous") {
		t.Fatalf("hoard whoami without a token: exit %d: %s", code, out)
	}
	issue := exec.Command(hoardBin, "token", "issue", "--cell", cellDir, "--user", "alice", "--uid", "1001")
	issue.Env = env
	tok, err := issue.Output() // the token alone on stdout; what it is on stderr
	if err != nil || strings.Count(string(tok), "\n") != 1 {
		t.Fatalf("token issue: %v: %q", err, tok)
	}
	aliceFile := filepath.Join(tmp, "alice.token")
	os.WriteFile(aliceFile, tok, 0o600)
	refused("--uid", 2, "token", "issue", "--cell", cellDir, "--user", "bob")

	must("logged in to cell example as admin", "login", "--ca", ca, "--file", filepath.Join(cellDir, "admin.token"))
	if fi, err := os.Stat(filepath.Join(tmp, "config", "hoard", "cells", "example", "token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the stored token: %v, %v; want it 0600", fi, err)
	}
	must("admin", "tokens")
	must("admin (uid 0, admin)", append([]string{"whoami"}, at...)...)
	must("", append([]string{"mkdir", "/team"}, at...)...)
	refused("no user or group named \"alice\"", 1, append([]string{"acl", "set", "/team", "alice", "write"}, at...)...)
	must("", append([]string{"user", "create", "alice", "--uid", "1001"}, at...)...)
	must("alice  1001", append([]string{"user", "list"}, at...)...)
	must("alice", append([]string{"acl", "set", "/team", "alice", "write"}, at...)...)
	must("", append([]string{"group", "create", "staff"}, at...)...)
	must("", append([]string{"group", "add", "staff", "alice"}, at...)...)
	must("staff  admin  alice", append([]string{"group", "list"}, at...)...)
	must("staff", append([]string{"acl", "set", "/team", "staff", "read"}, at...)...)
	out := must("system:authuser", append([]string{"acl", "get", "/team"}, at...)...)
	if !strings.Contains(out, "alice                  rlidwk") || !strings.Contains(out, "staff                  rl") {
		t.Fatalf("acl get /team:\n%s", out)
	}
	must("alice (uid 1001, groups staff)", append([]string{"whoami", "--token", aliceFile}, at...)...)
	must("", append([]string{"put", aliceFile, "/team/note", "--token", aliceFile}, at...)...)
	refused("permission denied", 1, append([]string{"mkdir", "/elsewhere", "--token", aliceFile}, at...)...)
	refused("not permitted", 1, append([]string{"vol", "create", "mine", "--token", aliceFile}, at...)...)
	refused("not permitted", 1, append([]string{"token", "revoke", aliceFile, "--token", aliceFile}, at...)...)

	must("revoked", append([]string{"token", "revoke", aliceFile}, at...)...)
	refused("revoked", 1, append([]string{"whoami", "--token", aliceFile}, at...)...)
	must("", "logout")
	refused("no tokens", 0, "tokens")
	refused("no cell CA", 2, append([]string{"ls", "/"}, at...)...)
}
