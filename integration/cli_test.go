package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// The short-lived client commands, end to end, sharing one cache directory
// between invocations.
func TestCLI(t *testing.T) {
	srv := startServer(t, t.TempDir())
	cache := t.TempDir()
	h := func(args ...string) (string, int) {
		return run(t, append(args, "--server", srv.addr, "--cache", cache)...)
	}
	mustOK := func(args ...string) string {
		t.Helper()
		out, code := h(args...)
		if code != 0 {
			t.Fatalf("hoard %v: exit %d: %s", args, code, out)
		}
		return out
	}
	local := filepath.Join(t.TempDir(), "in")
	content := testkit.Pattern(3<<20+5, 7)
	os.WriteFile(local, content, 0o640)

	mustOK("mkdir", "-p", "/a/b/c")
	mustOK("put", local, "/a/b/c/file")
	mustOK("put", local, "/a") // into a directory: keeps the base name
	if out := mustOK("ls", "/a"); !strings.Contains(out, "b\n") || !strings.Contains(out, "in\n") {
		t.Fatalf("ls /a: %q", out)
	}
	if out := mustOK("ls", "-l", "/a/b/c"); !strings.Contains(out, "-rw-r-----") || !strings.Contains(out, "3145733") {
		t.Fatalf("ls -l: %q", out)
	}
	if out := mustOK("stat", "/a/b/c/file"); !strings.Contains(out, "DataVersion:") || !strings.Contains(out, "size: 3145733") {
		t.Fatalf("stat: %q", out)
	}
	out := filepath.Join(t.TempDir(), "out")
	mustOK("get", "/a/b/c/file", out)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, content) {
		t.Fatal("get returned different bytes")
	}
	cmd := exec.Command(hoardBin, "cat", "/a/in", "--server", srv.addr, "--cache", cache)
	catOut, err := cmd.Output()
	if err != nil || !bytes.Equal(catOut, content) {
		t.Fatalf("cat: %v (%d bytes)", err, len(catOut))
	}
	// The second read of the same file came from the persistent cache.
	stats, code := run(t, "cache", "stats", "--cache", cache)
	if code != 0 || !strings.Contains(stats, "hits:") || !strings.Contains(stats, "bytes fetched:") || !strings.Contains(stats, "callbacks:") {
		t.Fatalf("cache stats: %q", stats)
	}
	mustOK("mv", "/a/in", "/a/b")
	if _, code := h("stat", "/a/b/in"); code != 0 {
		t.Fatal("mv into a directory did not land there")
	}
	if o, code := h("rm", "/a"); code != 1 || !strings.Contains(o, "is a directory") && !strings.Contains(o, "directory not empty") {
		t.Fatalf("rm of a non-empty directory: exit %d %q", code, o)
	}
	mustOK("rm", "-r", "/a")
	if o, code := h("stat", "/a"); code != 1 || strings.TrimSpace(o) != "hoard: no such file or directory: /a" {
		t.Fatalf("stat of a removed path: exit %d %q", code, o)
	}
}

// Bad invocations: a one-line error naming what is wrong, exit 2, and no
// partial state.
func TestCLIBadInput(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "plainfile")
	os.WriteFile(file, nil, 0o600)
	ro := filepath.Join(tmp, "ro")
	os.Mkdir(ro, 0o500)
	full := filepath.Join(tmp, "full")
	os.MkdirAll(filepath.Join(full, "kept"), 0o755)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"server"}, "--data"},
		{[]string{"server", "--data", file}, file},
		{[]string{"server", "--data", filepath.Join(tmp, "missing", "deeper")}, "missing/deeper"},
		{[]string{"server", "--data", tmp, "--listen", "not-an-address"}, "not-an-address"},
		{[]string{"server", "--data", tmp, "--bogus"}, "bogus"},
		{[]string{"server", "--data", filepath.Join(tmp, "fresh1"), "--data-advertise", "noport"}, "noport"},
		{[]string{"server", "--data", filepath.Join(tmp, "fresh2"), "--data-listen", "none", "--data-advertise", "127.0.0.1:9"}, "--data-listen none"},
		{[]string{"server", "--data", filepath.Join(tmp, "fresh6"), "--dir-delegations", "some"}, "some"},
		{[]string{"server", "--data", filepath.Join(tmp, "fresh7"), "--max-sessions", "-1"}, "--max-sessions"},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh8"), "--data-idle-timeout", "0s"}, "--data-idle-timeout"},
		{[]string{"ls", "/", "--cache", file}, file},
		{[]string{"ls", "/", "--cache-size", "lots"}, "--cache-size"},
		// A mount would hide a directory's files.
		{[]string{"mount", "--server", "127.0.0.1:9", full}, "is not empty (it holds kept): the mount would hide its files until unmounted; pass --nonempty"},
		// A port alone, or a host alone, is not a server's address.
		{[]string{"ls", "/", "--server", "7601"}, `--server "7601": want the host:port of a hoard server`},
		{[]string{"ls", "/", "--server", "localhost"}, `--server "localhost": want the host:port`},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"put", "onlyone"}, "hoard put: needs LOCAL and REMOTE"},
		{[]string{"put", "a", "b", "c"}, "hoard put: takes only LOCAL and REMOTE"},
		{[]string{"vol", "addsite", "v"}, "hoard vol addsite: needs NAME and SERVER"},
		{[]string{"vol", "create"}, "hoard vol create: needs NAME"},
		{[]string{"cache", "stats", "--cache", filepath.Join(tmp, "nope")}, "nope"},
		{[]string{"proxy", "--cache", tmp}, "--origin"},
		{[]string{"proxy", "--origin", "noport", "--cache", tmp}, "noport"},
		{[]string{"proxy", "--cell", testCell.proxyDir, "--origin", "127.0.0.1:9", "--cache", file}, file},
		{[]string{"proxy", "--cell", testCell.proxyDir, "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh3"), "--timeout", "1s"}, "127.0.0.1:9"},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh4"), "--layout", "striped"}, "striped"},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh5"), "--fast-fetch", "0s"}, "--fast-fetch"},
		{[]string{"proxy", "stats", "--proxy", "noport"}, "noport"},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh9")}, "--cell DIR is required"},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh10"), "--cell", tmp}, "ca.crt"},
		{[]string{"server", "--data", filepath.Join(tmp, "fresh11"), "--cell", filepath.Join(tmp, "nocell")}, "nocell"},
		{[]string{"server", "--data", filepath.Join(tmp, "fresh12"), "--cell", tmp, "--insecure"}, "pick one"},
		{[]string{"ls", "/", "--ca", filepath.Join(tmp, "nope.crt")}, "nope.crt"},
		{[]string{"ls", "/", "--ca", file}, file},
		{[]string{"token", "issue", "--cell", tmp, "--user", "alice", "--uid", "1"}, "ca.key"},
		{[]string{"acl", "set", "/", "alice", "rlq"}, "q"},
		// An unknown subcommand at any level, and an empty argument.
		{[]string{"cache", "stat"}, `unknown command "stat" for "hoard cache"`},
		{[]string{"vol", "frob"}, `unknown command "frob" for "hoard vol"`},
		{[]string{"completion", "frob"}, `unknown command "frob" for "hoard completion"`},
		{[]string{"help", "cache", "stat"}, `unknown command "stat" for "hoard cache"`},
		{[]string{"cat", ""}, "argument 1 is empty"},
		{[]string{"vol", "mount", "v", ""}, "argument 2 is empty"},
		{[]string{"cache", "policy", ""}, "argument 1 is empty"},
	}
	if os.Getuid() != 0 {
		cases = append(cases, struct {
			args []string
			want string
		}{[]string{"server", "--data", ro}, ro})
	}
	for _, c := range cases {
		out, code := run(t, c.args...)
		if code != 2 || !strings.Contains(out, c.want) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("hoard %v: exit %d, output %q; want exit 2 and one line mentioning %q", c.args, code, out, c.want)
		}
	}
	for _, d := range []string{"missing", "fresh1", "fresh2", "fresh3", "fresh4", "fresh5", "fresh6", "fresh7", "fresh8"} {
		if _, err := os.Stat(filepath.Join(tmp, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused server or proxy invocation left %s behind", d)
		}
	}
}

// A put of a large file shows its progress on a terminal (a pty, as
// script(1) gives), and nothing when its output is not one.
func TestPutProgress(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("no script(1) to run hoard put on a terminal")
	}
	srv := startServer(t, t.TempDir())
	local := filepath.Join(t.TempDir(), "big")
	os.WriteFile(local, testkit.Pattern(40<<20, 3), 0o644)
	line := fmt.Sprintf("%s put %s /big --server %s --cache ''", hoardBin, local, srv.addr)
	out, err := exec.Command("script", "-qefc", line, "/dev/null").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "copying") {
		t.Fatalf("hoard put on a terminal: %v, no progress in:\n%q", err, out)
	}
	if out, code := run(t, "put", local, "/big2", "--server", srv.addr, "--cache", ""); code != 0 || strings.TrimSpace(out) != "" {
		t.Fatalf("hoard put to a pipe: exit %d, said %q", code, out)
	}
	if out, code := run(t, "stat", "/big", "--server", srv.addr, "--cache", ""); code != 0 || !strings.Contains(out, fmt.Sprintf("size: %d", 40<<20)) {
		t.Fatalf("stat /big after the put: exit %d: %s", code, out)
	}
}

// Pointed at a port that is not a hoard server's (the server's own etcd
// member), or at a TLS server without TLS, a command says so in a line.
func TestCLIWrongService(t *testing.T) {
	srv := startServer(t, t.TempDir())
	m := regexp.MustCompile(`etcd member of its own at https://([0-9.:]+)`).FindStringSubmatch(srv.logs.String())
	if m == nil {
		t.Fatalf("the server named no etcd member of its own:\n%s", srv.logs)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "/", "--server", m[1], "--cache", ""}, "server " + m[1] + " unreachable: it answered, but not as a hoard server (another service's port"},
		{[]string{"ls", "/", "--server", srv.addr, "--cache", "", "--insecure"}, "it answered, but not as a hoard server without TLS (one with TLS, reached with --insecure?"},
	} {
		out, code := run(t, c.args...)
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.Contains(l, "WARNING: insecure") { // --insecure's own
				lines = append(lines, l)
			}
		}
		out = strings.Join(lines, "\n")
		if code != 1 || !strings.Contains(out, c.want) || strings.Contains(out, "\n") {
			t.Errorf("hoard %v: exit %d, output %q; want exit 1 and one line mentioning %q", c.args, code, out, c.want)
		}
	}
}

// Volumes and mount points: one tree spans volumes; names are checked by
// the server.
func TestVolumesAndMountPoints(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 16<<20)
	b := dial(t, srv.addr, "mem", 16<<20)
	v, err := a.Admin().CreateVolume("proj")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Admin().CreateVolume("proj"); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("duplicate volume: %v", err)
	}
	if _, err := a.Admin().CreateVolume("bad/name"); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("bad volume name: %v", err)
	}
	if err := a.Admin().MountVolume("/proj", "proj"); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, a, "/proj/readme", []byte("in another volume"))
	st, err := b.Stat("/proj/readme")
	if err != nil || st.FID.Volume != v.ID {
		t.Fatalf("file through the mount point: %+v %v", st, err)
	}
	if got := testkit.ReadFile(t, b, "/proj/readme"); string(got) != "in another volume" {
		t.Fatalf("read %q", got)
	}
	lst, err := b.Lstat("/proj")
	if err != nil || lst.Target != "proj" {
		t.Fatalf("lstat of the mount point: %+v %v", lst, err)
	}
	if err := a.Rename("/proj/readme", "/readme"); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename across volumes: %v", err)
	}
	vs, err := b.Admin().Volumes()
	if err != nil || len(vs) != 2 {
		t.Fatalf("volumes: %v %v", vs, err)
	}
	out, code := run(t, "vol", "list", "--server", srv.addr, "--cache", "")
	if code != 0 || !strings.Contains(out, "proj") || !strings.Contains(out, "root") {
		t.Fatalf("vol list: %d %q", code, out)
	}
	if err := a.Admin().MountVolume("/nowhere", "missing"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("mount point to a missing volume: %v", err)
	}
}

// Names the server must refuse even from a client that does not check.
func TestBadNames(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 16<<20)
	for _, name := range []string{"/" + strings.Repeat("n", 256), "/a\x00b"} {
		if _, err := a.Create(name); err == nil {
			t.Errorf("created %q", name)
		}
	}
	// ".." cannot climb out of the root.
	testkit.WriteFile(t, a, "/../../escaped", []byte("x"))
	if _, err := a.Stat("/escaped"); err != nil {
		t.Fatalf("/../../escaped should resolve to /escaped: %v", err)
	}
}

// Every command that takes a remote path, given each kind of path a user
// can get wrong: no panic, one line unless it succeeds, the exit code it
// should have, and nothing removed but what the command was asked to
// remove. The root and mount points are never removed or moved.
func TestCLINoPanic(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 16<<20)
	if _, err := a.Admin().CreateVolume("proj"); err != nil {
		t.Fatal(err)
	}
	// A local file that a failing get must leave alone.
	local := filepath.Join(t.TempDir(), "local")
	os.WriteFile(local, []byte("kept"), 0o644)

	tree := []struct {
		name   string
		typ    node.Type
		target string
	}{
		{"/d", node.TypeDir, ""},
		{"/d/f", node.TypeFile, ""},
		{"/d/sub", node.TypeDir, ""},
		{"/d/proj", node.TypeFile, ""},
		{"/sl", node.TypeSymlink, "d"},
		{"/vols", node.TypeDir, ""},
		{"/vols/proj", node.TypeMountPoint, "proj"},
		{"/vols/proj/inner", node.TypeFile, ""},
	}
	// restore puts back what a case removed as asked.
	restore := func() {
		for _, e := range tree {
			if _, err := a.Lstat(e.name); err == nil {
				continue
			}
			var err error
			switch e.typ {
			case node.TypeDir:
				err = a.Mkdir(e.name, 0o755)
			case node.TypeFile:
				testkit.WriteFile(t, a, e.name, []byte(e.name))
			case node.TypeSymlink:
				err = a.Symlink(e.target, e.name)
			case node.TypeMountPoint:
				err = a.Admin().MountVolume(e.name, e.target)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// check reports what is missing or changed, but what is under gone.
	check := func(what []string, gone string) {
		t.Helper()
		for _, e := range tree {
			if gone != "" && (e.name == gone || strings.HasPrefix(e.name, gone+"/")) {
				continue
			}
			st, err := a.Lstat(e.name)
			if err != nil || st.Type != e.typ || st.Target != e.target {
				t.Errorf("after hoard %q: %s is %v %q (%v), want %v %q", what, e.name, st.Type, st.Target, err, e.typ, e.target)
			} else if e.typ == node.TypeFile {
				if got, err := testkit.TryRead(a, e.name); string(got) != e.name {
					t.Errorf("after hoard %q: %s reads %q (%v)", what, e.name, got, err)
				}
			}
		}
		if got, _ := os.ReadFile(local); string(got) != "kept" {
			t.Errorf("after hoard %q: the local file reads %q", what, got)
		}
	}
	restore()

	// The library refuses to open a directory, however it is reached.
	for _, p := range []string{"/d", "/sl", "/", "/vols/proj"} {
		if _, err := a.Open(p, os.O_RDONLY, 0); !errors.Is(err, syscall.EISDIR) {
			t.Errorf("open %s for reading: %v, want EISDIR", p, err)
		}
	}

	kinds := []string{"/d", "/no/such", "/sl", "/", "", "/vols/proj"}
	type cmd struct {
		args    func(p string) []string
		codes   []int // per kind, in the order of kinds
		removes bool  // a success may remove the path (and what is under it)
	}
	one := func(args ...string) func(string) []string {
		return func(p string) []string { return append(args, p) }
	}
	cmds := []cmd{
		{one("ls"), []int{0, 1, 0, 0, 2, 0}, false},
		{one("ls", "-l"), []int{0, 1, 0, 0, 2, 0}, false},
		{one("stat"), []int{0, 1, 0, 0, 2, 0}, false},
		{one("cat"), []int{1, 1, 1, 1, 2, 1}, false},
		{func(p string) []string { return []string{"get", p, local} }, []int{1, 1, 1, 1, 2, 1}, false},
		{one("put", local), []int{0, 1, 0, 0, 2, 0}, false},
		{one("mkdir"), []int{1, 1, 1, 1, 2, 1}, false},
		{one("rm"), []int{1, 1, 0, 1, 2, 1}, true},
		{one("rm", "-r"), []int{0, 1, 0, 1, 2, 1}, true},
		{func(p string) []string { return []string{"mv", p, "/d/sub/moved"} }, []int{1, 1, 0, 1, 2, 1}, true},
		{one("vol", "mount", "proj"), []int{1, 1, 1, 1, 2, 1}, false},
		{one("cache", "policy"), []int{0, 1, 0, 0, 2, 0}, false},
		// Last: it makes the missing path.
		{one("mkdir", "-p"), []int{0, 0, 0, 0, 2, 0}, false},
	}
	type tcase struct {
		args []string
		code int
		gone string
	}
	var cases []tcase
	for _, c := range cmds {
		for i, p := range kinds {
			tc := tcase{args: c.args(p), code: c.codes[i]}
			if c.removes && tc.code == 0 {
				tc.gone = p
			}
			cases = append(cases, tc)
		}
	}
	cases = append(cases,
		tcase{args: []string{"rm", "/d/f", "/"}, code: 1},              // refused before the first is removed
		tcase{args: []string{"rm", "-r", "/vols"}, code: 1},            // a mount point inside
		tcase{args: []string{"rm", "-r", "/sl/sub", "/vols"}, code: 1}, // the same, after a good one
		tcase{args: []string{"mv", "/d/proj", "/vols"}, code: 1},       // onto the mount point /vols/proj
	)
	for _, c := range cases {
		out, code := run(t, append(c.args, "--server", srv.addr, "--cache", "")...)
		lines := strings.Count(strings.TrimSpace(out), "\n") + 1
		switch {
		case strings.Contains(out, "panic") || strings.Contains(out, "goroutine "):
			t.Errorf("hoard %q panicked: %s", c.args, out)
		case code != c.code:
			t.Errorf("hoard %q: exit %d, want %d: %s", c.args, code, c.code, out)
		case code != 0 && (lines != 1 || !strings.HasPrefix(out, "hoard: ")):
			t.Errorf("hoard %q: exit %d with %q, want one line", c.args, code, out)
		}
		check(c.args, c.gone)
		restore()
	}
	if out, _ := run(t, "cat", "/d", "--server", srv.addr, "--cache", ""); out != "hoard: is a directory: /d\n" {
		t.Errorf("cat of a directory: %q", out)
	}
}
