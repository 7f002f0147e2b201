package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
	content := pattern(3<<20+5, 7)
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
		{[]string{"ls", "/", "--cache", file}, file},
		{[]string{"ls", "/", "--cache-size", "lots"}, "--cache-size"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"put", "onlyone"}, "accepts 2 arg"},
		{[]string{"cache", "stats", "--cache", filepath.Join(tmp, "nope")}, "nope"},
		{[]string{"proxy", "--cache", tmp}, "--origin"},
		{[]string{"proxy", "--origin", "noport", "--cache", tmp}, "noport"},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", file}, file},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh3"), "--timeout", "1s"}, "127.0.0.1:9"},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh4"), "--layout", "striped"}, "striped"},
		{[]string{"proxy", "--origin", "127.0.0.1:9", "--cache", filepath.Join(tmp, "fresh5"), "--fast-fetch", "0s"}, "--fast-fetch"},
		{[]string{"proxy", "stats", "--proxy", "noport"}, "noport"},
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
	for _, d := range []string{"missing", "fresh1", "fresh2", "fresh3", "fresh4", "fresh5", "fresh6"} {
		if _, err := os.Stat(filepath.Join(tmp, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused server or proxy invocation left %s behind", d)
		}
	}
}

// Volumes and mount points: one tree spans volumes; names are checked by
// the server.
func TestVolumesAndMountPoints(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 16<<20)
	b := dial(t, srv.addr, "mem", 16<<20)
	v, err := a.CreateVolume("proj")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateVolume("proj"); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("duplicate volume: %v", err)
	}
	if _, err := a.CreateVolume("bad/name"); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("bad volume name: %v", err)
	}
	if err := a.MountVolume("/proj", "proj"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, a, "/proj/readme", []byte("in another volume"))
	st, err := b.Stat("/proj/readme")
	if err != nil || st.FID.Volume != v.ID {
		t.Fatalf("file through the mount point: %+v %v", st, err)
	}
	if got := readFile(t, b, "/proj/readme"); string(got) != "in another volume" {
		t.Fatalf("read %q", got)
	}
	lst, err := b.Lstat("/proj")
	if err != nil || lst.Target != "proj" {
		t.Fatalf("lstat of the mount point: %+v %v", lst, err)
	}
	if err := a.Rename("/proj/readme", "/readme"); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename across volumes: %v", err)
	}
	vs, err := b.Volumes()
	if err != nil || len(vs) != 2 {
		t.Fatalf("volumes: %v %v", vs, err)
	}
	out, code := run(t, "vol", "list", "--server", srv.addr, "--cache", "")
	if code != 0 || !strings.Contains(out, "proj") || !strings.Contains(out, "root") {
		t.Fatalf("vol list: %d %q", code, out)
	}
	if err := a.MountVolume("/nowhere", "missing"); !errors.Is(err, syscall.ENOENT) {
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
	writeFile(t, a, "/../../escaped", []byte("x"))
	if _, err := a.Stat("/escaped"); err != nil {
		t.Fatalf("/../../escaped should resolve to /escaped: %v", err)
	}
}
