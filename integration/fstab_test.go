package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/mount"
)

// helperPaths are where mount(8) and umount(8) look for the helpers of
// type fuse.hoard.
var helperPaths = []string{"/sbin/mount.fuse.hoard", "/sbin/umount.fuse.hoard"}

// installHelper links helperPaths to the hoard binary under test for
// this test only, as the Debian package links /usr/sbin/mount.fuse.hoard
// and umount.fuse.hoard to /usr/bin/hoard.
func installHelper(t *testing.T) {
	t.Helper()
	needFuse(t)
	if os.Geteuid() != 0 {
		t.Skip("SKIP: mount(8) runs " + helperPaths[0] + " only for root here, and installing it needs root: not root")
	}
	if _, err := exec.LookPath("mount"); err != nil {
		t.Skip("SKIP: no mount(8)")
	}
	bin, err := filepath.Abs(hoardBin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range helperPaths {
		if to, err := os.Readlink(p); err == nil && to == bin {
			os.Remove(p) // left by a test that was killed
		} else if _, err := os.Lstat(p); err == nil {
			t.Skipf("SKIP: %s exists and is not this test's (-> %q): not replacing it", p, to)
		}
		if err := os.Symlink(bin, p); err != nil {
			t.Skipf("SKIP: cannot install the mount helpers: %v", err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
}

// secOpts are the mount options that reach the tests' cell: its CA and the
// admin's token, in files, as an fstab entry would name them.
func secOpts() string {
	return "ca=" + filepath.Join(testCell.dir, cell.CAFile) + ",token=" + filepath.Join(testCell.dir, cell.AdminTokenFile)
}

// runMount runs mount(8) (or umount(8)) with the hoard settings of the
// tests' environment taken away, so that only the mount options count,
// and returns its combined output and exit status.
func runMount(t *testing.T, name string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(name, args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "HOARD_CA=") && !strings.HasPrefix(e, "HOARD_TOKEN=") && !strings.HasPrefix(e, "HOARD_SERVER=") &&
			!strings.HasPrefix(e, "HOARD_CACHE=") && !strings.HasPrefix(e, "HOME=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// mountEntry is the mount at dir as /proc/self/mountinfo shows it: its
// file system type and its mount options ("" if nothing is mounted there).
func mountEntry(t *testing.T, dir string) (fstype, opts string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		mine, theirs, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(mine), strings.Fields(theirs)
		if ok && len(f) >= 6 && len(g) >= 1 && f[4] == dir {
			fstype, opts = g[0], f[5] // the last mount there is on top
		}
	}
	return fstype, opts
}

// cleanMount makes sure nothing stays mounted at dir, and that the mount
// daemon whose pid is in cache/mount.pid exits, before the test's
// directories go.
func cleanMount(t *testing.T, dir, cache string) {
	t.Cleanup(func() {
		if m, _ := mount.IsMounted(dir); m {
			mount.Unmount(dir)
		}
		waitDaemonGone(t, cache)
	})
}

// waitDaemonGone waits for the mount daemon whose pid is in
// cache/mount.pid (if any) to exit.
func waitDaemonGone(t *testing.T, cache string) {
	t.Helper()
	for start := time.Now(); time.Since(start) < 20*time.Second; time.Sleep(20 * time.Millisecond) {
		if pid := daemonAlive(cache); pid == 0 {
			return
		}
	}
	t.Errorf("the mount daemon (pid %d) did not exit after its unmount", daemonAlive(cache))
}

// daemonAlive is the pid of the mount daemon of cache, if it runs (0 if
// not).
func daemonAlive(cache string) int {
	b, err := os.ReadFile(filepath.Join(cache, "mount.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil || strings.Contains(string(st), ") Z ") {
		return 0
	}
	return pid
}

// dirInUse reports a process (other than this one) with dir among its
// arguments: a mount daemon left behind.
func dirInUse(dir string) string {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains("\x00"+string(b), "\x00"+dir+"\x00") && filepath.Base(filepath.Dir(p)) != strconv.Itoa(os.Getpid()) {
			return strings.ReplaceAll(string(b), "\x00", " ")
		}
	}
	return ""
}

// TestMountTypeFuseHoard mounts with mount -t fuse.hoard, as root or
// mount -a would: mount(8) runs the helper, which returns once the mount
// is up; umount(8) unmounts it and the daemon exits.
func TestMountTypeFuseHoard(t *testing.T) {
	installHelper(t)
	srv := startServer(t, t.TempDir())
	c := dial(t, srv.addr, "mem", 0)
	want := testkit.Pattern(300<<10, 7)
	testkit.WriteFile(t, c, "/hello", want)

	mnt, cache := t.TempDir(), t.TempDir()
	cleanMount(t, mnt, cache)
	// -o twice, as a user may give it; mount(8) hands the helper both.
	out, code := runMount(t, "mount", "-t", "fuse.hoard", srv.addr, mnt, "-o", "cache="+cache+",nosuid,nodev,_netdev", "-o", secOpts()+",passthrough=false")
	if code != 0 {
		t.Fatalf("mount -t fuse.hoard: status %d\n%s", code, out)
	}
	if out != "" {
		t.Errorf("mount -t fuse.hoard said %q; want nothing, as mount -a would", out)
	}
	if typ, _ := mountEntry(t, mnt); typ != "fuse.hoard" {
		t.Fatalf("mountinfo: %s has type %q, want fuse.hoard", mnt, typ)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "hello"))
	if err != nil || string(got) != string(want) {
		t.Fatalf("reading /hello through the mount: %d bytes, %v; want the %d written", len(got), err, len(want))
	}
	if err := os.WriteFile(filepath.Join(mnt, "back"), []byte("from the mount\n"), 0o644); err != nil {
		t.Fatalf("writing through the mount: %v", err)
	}
	// The cache option took: the daemon's pid and log are in it.
	if _, err := os.Stat(filepath.Join(cache, "mount.pid")); err != nil {
		t.Errorf("cache=%s not used: %v", cache, err)
	}

	// umount(8) runs umount.fuse.hoard, which returns once the daemon
	// stored what it held and exited.
	if out, code := runMount(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: status %d\n%s", code, out)
	}
	if m, _ := mount.IsMounted(mnt); m {
		t.Fatalf("%s still mounted after umount", mnt)
	}
	if pid := daemonAlive(cache); pid != 0 {
		t.Errorf("umount returned with the mount daemon (pid %d) still running", pid)
	}
	if got := testkit.ReadFile(t, dial(t, srv.addr, "mem", 0), "/back"); string(got) != "from the mount\n" {
		t.Errorf("/back read by the library after umount: %q", got)
	}
}

// TestFstabEntry mounts an fstab entry (a scratch fstab, not /etc/fstab)
// with generic options hoard skips (noauto, nofail, x-systemd.*) and
// ones it sets on the mount point (ro, noexec): by its mount point, and
// by mount -a.
func TestFstabEntry(t *testing.T) {
	installHelper(t)
	srv := startServer(t, t.TempDir())
	testkit.WriteFile(t, dial(t, srv.addr, "mem", 0), "/hello", []byte("hello from fstab\n"))

	mnt, cache := t.TempDir(), t.TempDir()
	cleanMount(t, mnt, cache)
	fstab := filepath.Join(t.TempDir(), "fstab")
	entry := srv.addr + "  " + mnt + "  fuse.hoard  cache=" + cache + "," + secOpts() + ",ro,noexec,_netdev,nofail,x-systemd.mount-timeout=30s,comment=test  0  0\n"
	if err := os.WriteFile(fstab, []byte("# a scratch fstab\n"+entry), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(how string) {
		t.Helper()
		typ, opts := mountEntry(t, mnt)
		if typ != "fuse.hoard" {
			t.Fatalf("%s: mountinfo: %s has type %q, want fuse.hoard", how, mnt, typ)
		}
		if o := "," + opts + ","; !strings.Contains(o, ",ro,") || !strings.Contains(o, ",noexec,") || !strings.Contains(o, ",nosuid,") {
			t.Errorf("%s: mount options %q, want ro, noexec and nosuid among them", how, opts)
		}
		if got, err := os.ReadFile(filepath.Join(mnt, "hello")); err != nil || string(got) != "hello from fstab\n" {
			t.Fatalf("%s: reading /hello through the mount: %q, %v", how, got, err)
		}
		if err := os.WriteFile(filepath.Join(mnt, "new"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s: writing through a ro mount: %v, want EROFS", how, err)
		}
		if out, code := runMount(t, "umount", mnt); code != 0 {
			t.Fatalf("%s: umount: status %d\n%s", how, code, out)
		}
		waitDaemonGone(t, cache)
	}

	if out, code := runMount(t, "mount", "--fstab", fstab, mnt); code != 0 {
		t.Fatalf("mount --fstab %s %s: status %d\n%s", fstab, mnt, code, out)
	}
	check("mount --fstab FILE MOUNTPOINT")
	if out, code := runMount(t, "mount", "--fstab", fstab, "-a", "-t", "fuse.hoard"); code != 0 {
		t.Fatalf("mount --fstab %s -a: status %d\n%s", fstab, code, out)
	}
	check("mount -a")
}

// TestMountHelperFailures: a mount that cannot be made fails with the
// helper's one-line reason in mount(8)'s output and leaves nothing
// mounted or running.
func TestMountHelperFailures(t *testing.T) {
	installHelper(t)
	srv := startServer(t, t.TempDir())
	for _, tc := range []struct {
		name, addr, opts, want string
	}{
		{"unknown option", srv.addr, "bogus=1", `hoard: mount option "bogus": unknown (hoard mount --help lists them)`},
		{"option without its value", srv.addr, "cache-size", `hoard: mount option "cache-size": needs a value (cache-size=...)`},
		{"unreachable server", freeAddr(t), "timeout=2s", "hoard: the mount daemon failed: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt, cache := t.TempDir(), t.TempDir()
			cleanMount(t, mnt, cache)
			out, code := runMount(t, "mount", "-t", "fuse.hoard", tc.addr, mnt, "-o", "cache="+cache+","+secOpts()+","+tc.opts)
			if code == 0 {
				t.Fatalf("mount succeeded; want it to fail\n%s", out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("mount: status %d, said:\n%s\nwant a line with %q", code, out, tc.want)
			}
			if m, _ := mount.IsMounted(mnt); m {
				t.Errorf("%s mounted after the failure", mnt)
			}
			if p := dirInUse(mnt); p != "" {
				t.Errorf("left running after the failure: %s", p)
			}
		})
	}
}

// umount(8) of a mount that hoard mount made (not mount(8), which
// records its helper itself) waits too, as hoard umount does, until the
// daemon stored what its write-back held: umount(8) learns the type from
// statfs ("fuse") and runs no helper unless the mount recorded one.
func TestUmountWaitsForHoardMount(t *testing.T) {
	installHelper(t)
	srv := startServer(t, t.TempDir())
	mnt, cache := t.TempDir(), t.TempDir()
	cleanMount(t, mnt, cache)
	if out, code := run(t, "mount", "--server", srv.addr, "--cache", cache, "--ca", filepath.Join(testCell.dir, cell.CAFile),
		"--token", filepath.Join(testCell.dir, cell.AdminTokenFile), "--daemon", mnt); code != 0 {
		t.Fatalf("hoard mount --daemon: %d %s", code, out)
	}
	back := testkit.Pattern(160<<20, 8) // under write-back: the daemon holds it
	if err := os.WriteFile(filepath.Join(mnt, "back"), back, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := runMount(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: status %d\n%s", code, out)
	}
	if pid := daemonAlive(cache); pid != 0 {
		t.Errorf("umount returned with the mount daemon (pid %d) still running", pid)
	}
	if got := testkit.ReadFile(t, dial(t, srv.addr, "mem", 0), "/back"); !bytes.Equal(got, back) {
		t.Errorf("/back read by the library after umount: %d bytes, want %d", len(got), len(back))
	}
}
