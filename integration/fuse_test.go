package integration

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/mount"
)

// needFuse skips (or, under HOARD_REQUIRE_FUSE=1, fails) when FUSE cannot
// be used here, saying why.
func needFuse(t *testing.T) {
	t.Helper()
	why := ""
	if err := mount.CheckFuse(); err != nil {
		why = err.Error()
	} else if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			why = "not root and no fusermount3"
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("HOARD_REQUIRE_FUSE") == "1" {
		t.Fatalf("FUSE required (HOARD_REQUIRE_FUSE=1) but unusable: %s", why)
	}
	t.Skipf("SKIP: FUSE unusable: %s", why)
}

// mountProc is a running `hoard mount` in the foreground.
type mountProc struct {
	t     testing.TB
	cmd   *exec.Cmd
	dir   string
	cache string
	args  []string
	logs  *logBuf
}

func startMount(t *testing.T, srv *serverProc, cacheDir string, extra ...string) *mountProc {
	t.Helper()
	needFuse(t)
	m := &mountProc{t: t, dir: t.TempDir(), cache: cacheDir, args: extra}
	m.start(srv)
	t.Cleanup(func() { m.stop() })
	return m
}

func (m *mountProc) start(srv *serverProc) {
	m.t.Helper()
	args := append([]string{"mount", "--server", srv.addr, "--cache", m.cache, "--log-level", logLevel(), m.dir}, m.args...)
	m.cmd = exec.Command(hoardBin, args...)
	m.logs = &logBuf{}
	stderr, _ := m.cmd.StderrPipe()
	if err := m.cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			m.logs.WriteString(sc.Text() + "\n")
			if !sent && strings.Contains(sc.Text(), "mounted at") {
				sent = true
				ready <- true
			}
		}
		if !sent {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			m.cmd.Wait()
			m.t.Fatalf("mount failed: %s", m.logs)
		}
	case <-time.After(15 * time.Second):
		m.t.Fatalf("mount did not come up: %s", m.logs)
	}
}

func (m *mountProc) stop() {
	if m.cmd == nil {
		return
	}
	m.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { m.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		m.cmd.Process.Kill()
		<-done
	}
	m.cmd = nil
	if m.t.Failed() {
		m.t.Logf("mount log:\n%s", m.logs)
	}
	if mounted, _ := mount.IsMounted(m.dir); mounted {
		mount.Unmount(m.dir)
	}
}

func (m *mountProc) path(p string) string { return filepath.Join(m.dir, p) }

// sh runs a shell command in dir and fails the test on error.
func sh(t *testing.T, dir, script string) string {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t",
		"GIT_AUTHOR_DATE=2020-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2020-01-01T00:00:00Z", "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s\n%v\n%s", dir, script, err, out)
	}
	return string(out)
}

// makeTree builds a small source tree with symlinks and hard links.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	for i := 0; i < 40; i++ {
		p := filepath.Join(dir, fmt.Sprintf("pkg%d/sub%d/file%d.txt", i%5, i%3, i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, testkit.Pattern(100+i*997, byte(i)), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "big.bin"), testkit.Pattern(3<<20+17, 99), 0o600)
	os.Symlink("pkg0/sub0/file0.txt", filepath.Join(dir, "rel-link"))
	os.Symlink("/etc/hostname", filepath.Join(dir, "abs-link"))
	os.Link(filepath.Join(dir, "big.bin"), filepath.Join(dir, "big.hard"))
	os.Chmod(filepath.Join(dir, "pkg1"), 0o750)
}

// Real tools on the mount, each compared with the same run on a local
// directory.
func TestFuseRealTools(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	realTools(t, startMount(t, srv, t.TempDir()))
}

// realTools runs tar, cp -a, rsync, git and make on m, each against the
// same done on the local disk.
func realTools(t *testing.T, m *mountProc) {
	src := t.TempDir()
	makeTree(t, src)
	local := t.TempDir()

	t.Run("tar", func(t *testing.T) {
		tarball := filepath.Join(t.TempDir(), "src.tar")
		sh(t, src, "tar cf "+tarball+" .")
		os.MkdirAll(m.path("tar"), 0o755)
		sh(t, m.path("tar"), "tar xf "+tarball)
		sh(t, src, "diff -r . "+m.path("tar"))
		if fi, _ := os.Lstat(m.path("tar/rel-link")); fi.Mode()&os.ModeSymlink == 0 {
			t.Fatal("symlink lost in tar x")
		}
	})
	t.Run("cp -a", func(t *testing.T) {
		sh(t, src, "cp -a . "+m.path("cpa"))
		sh(t, src, "cp -a . "+filepath.Join(local, "cpa"))
		sh(t, local, "diff -r cpa "+m.path("cpa"))
		var a, b syscall.Stat_t
		syscall.Stat(m.path("cpa/big.bin"), &a)
		syscall.Stat(m.path("cpa/big.hard"), &b)
		if a.Ino != b.Ino || a.Nlink != 2 {
			t.Fatalf("hard link not kept by cp -a: inodes %d %d nlink %d", a.Ino, b.Ino, a.Nlink)
		}
		want, _ := os.Stat(filepath.Join(local, "cpa/pkg1"))
		got, _ := os.Stat(m.path("cpa/pkg1"))
		if want.Mode() != got.Mode() {
			t.Fatalf("mode %v, local %v", got.Mode(), want.Mode())
		}
	})
	t.Run("rsync", func(t *testing.T) {
		if _, err := exec.LookPath("rsync"); err != nil {
			t.Skip("SKIP: rsync not installed (.ci/run installs it)")
		}
		sh(t, src, "rsync -a ./ "+m.path("rs")+"/")
		sh(t, m.path("rs"), "rsync -a ./ "+filepath.Join(local, "rsback")+"/")
		sh(t, src, "diff -r . "+filepath.Join(local, "rsback"))
		// A second rsync finds nothing to do: sizes and times match.
		out := sh(t, src, "rsync -a --itemize-changes ./ "+m.path("rs")+"/")
		if strings.TrimSpace(out) != "" {
			t.Fatalf("second rsync still changed:\n%s", out)
		}
	})
	t.Run("git", func(t *testing.T) {
		script := `git init -q r && cd r && cp -r ` + src + `/pkg0 . && git add . && git commit -qm first &&
			echo more >> pkg0/sub0/file0.txt && git commit -qam second && git mv pkg0 moved && git commit -qm third &&
			git log --format='%s %T' && git fsck --no-progress 2>&1 && git status --porcelain`
		got := sh(t, m.dir, script)
		want := sh(t, local, script)
		if got != want {
			t.Fatalf("git on the mount:\n%s\nlocally:\n%s", got, want)
		}
	})
	t.Run("make", func(t *testing.T) {
		if _, err := exec.LookPath("cc"); err != nil {
			t.Skip("SKIP: no C compiler (.ci/run installs gcc)")
		}
		script := `mkdir -p prog && cd prog
cat > main.c <<'END'
#include <stdio.h>
int add(int, int);
int main(void) { printf("%d\n", add(2, 3)); return 0; }
END
cat > add.c <<'END'
int add(int a, int b) { return a + b; }
END
printf 'prog: main.o add.o\n\tcc -o prog main.o add.o\n%%.o: %%.c\n\tcc -c $<\n' > Makefile
make -s && ./prog && touch add.c && make -s && ./prog`
		got := sh(t, m.dir, script)
		if want := sh(t, local, script); got != want || !strings.Contains(got, "5") {
			t.Fatalf("make on the mount: %q, locally %q", got, want)
		}
	})
	t.Run("errors", func(t *testing.T) {
		f := m.path("errs")
		os.WriteFile(f, []byte("x"), 0o644)
		if err := os.Link(m.path("tar"), m.path("dirlink")); err == nil {
			t.Fatal("hard link to a directory succeeded")
		}
		if err := syscall.Mknod(m.path("fifo"), syscall.S_IFIFO|0o644, 0); err != nil {
			t.Fatalf("mkfifo: %v", err)
		}
		if fi, err := os.Lstat(m.path("fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
			t.Fatalf("fifo reads back as %v, %v", fi.Mode(), err)
		}
		if err := syscall.Setxattr(f, "trusted.x", []byte("y"), 0); err != syscall.ENOTSUP && err != syscall.EPERM {
			t.Fatalf("setxattr outside the user namespace: %v, want ENOTSUP", err)
		}
		if _, err := os.Stat(m.path("no/such")); !os.IsNotExist(err) {
			t.Fatalf("stat of a missing path: %v", err)
		}
	})
}

// Two mounts of one server: each sees the other's closed writes and
// renames at once, the kernel's cached copies included.
// Two mounts of one server, and, through a proxy: one mount of the
// origin, one of a proxy of it, whose changes reach each other's kernels.
func TestFuseTwoMounts(t *testing.T) {
	needFuse(t)
	for _, mode := range []string{"direct", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			srv := startServer(t, t.TempDir())
			a := startMount(t, srv, t.TempDir())
			to := srv
			if mode == "proxy" {
				to = startProxy(t, srv, t.TempDir())
			}
			twoMounts(t, a, startMount(t, to, t.TempDir()))
		})
	}
}

func twoMounts(t *testing.T, a, b *mountProc) {
	for i := 0; i < 5; i++ {
		v := []byte(fmt.Sprintf("version %d of the shared file", i))
		if err := os.WriteFile(a.path("shared"), v, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(b.path("shared"))
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("round %d: B read %q (%v), want %q", i, got, err, v)
		}
		// Read it twice on B: the second read is from B's caches and must
		// still be the new version.
		if got, _ := os.ReadFile(b.path("shared")); !bytes.Equal(got, v) {
			t.Fatalf("round %d: B's cached copy is stale: %q", i, got)
		}
	}
	// A long-lived open on B sees A's later close after reopening.
	os.WriteFile(a.path("f"), []byte("one"), 0o644)
	if got, _ := os.ReadFile(b.path("f")); string(got) != "one" {
		t.Fatalf("B read %q", got)
	}
	os.WriteFile(a.path("f"), []byte("two!"), 0o644)
	if got, _ := os.ReadFile(b.path("f")); string(got) != "two!" {
		t.Fatalf("B read %q after A's second write", got)
	}
	st, _ := os.Stat(b.path("f"))
	if st.Size() != 4 {
		t.Fatalf("B's cached attributes are stale: size %d", st.Size())
	}
	// Renames and removals.
	os.Mkdir(a.path("dir"), 0o755)
	os.WriteFile(a.path("dir/old"), []byte("content"), 0o644)
	if _, err := os.Stat(b.path("dir/old")); err != nil {
		t.Fatal(err)
	}
	b.listNames(t, "dir")
	if err := os.Rename(a.path("dir/old"), a.path("dir/new")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.path("dir/old")); !os.IsNotExist(err) {
		t.Fatalf("B still sees the old name: %v", err)
	}
	if got, err := os.ReadFile(b.path("dir/new")); err != nil || string(got) != "content" {
		t.Fatalf("B reads the new name: %q %v", got, err)
	}
	if names := b.listNames(t, "dir"); names != "new" {
		t.Fatalf("B lists %q", names)
	}
	os.Remove(a.path("dir/new"))
	if names := b.listNames(t, "dir"); names != "" {
		t.Fatalf("B lists %q after the remove", names)
	}
	// A file open on B that A removes stays readable and stat-able on B,
	// unlinked, as POSIX has it.
	os.WriteFile(a.path("held"), []byte("held open"), 0o644)
	held, err := os.Open(b.path("held"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := os.Remove(a.path("held")); err != nil {
		t.Fatal(err)
	}
	if fi, err := held.Stat(); err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 0 {
		t.Fatalf("fstat on B of a file A removed: %v, %+v; want nlink 0", err, fi)
	}
	// The kernel forgetting its inodes (the client then drops its nodes)
	// changes nothing visible.
	if os.Geteuid() == 0 {
		os.WriteFile("/proc/sys/vm/drop_caches", []byte("2\n"), 0o644)
	}
	os.WriteFile(a.path("f"), []byte("three"), 0o644)
	if got, _ := os.ReadFile(b.path("f")); string(got) != "three" {
		t.Fatalf("B read %q after the kernel forgot its inodes", got)
	}
}

func (m *mountProc) listNames(t *testing.T, dir string) string {
	ents, err := os.ReadDir(m.path(dir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return strings.Join(names, ",")
}

// Invalidation storms against concurrent readers must not hang: writers on
// A change files as fast as they can while readers on B read them.
func TestFuseInvalidationStorm(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	a := startMount(t, srv, t.TempDir())
	b := startMount(t, srv, t.TempDir())
	const files = 4
	for i := 0; i < files; i++ {
		os.WriteFile(a.path(fmt.Sprintf("s%d", i)), testkit.Pattern(300<<10, byte(i)), 0o644)
	}
	stop := make(chan struct{})
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	var steps []*atomic.Int64
	// loop runs step until stop, counting steps and reporting its first
	// error.
	loop := func(step func(n int) error) {
		done := new(atomic.Int64)
		steps = append(steps, done)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := step(n); err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		}()
	}
	for r := 0; r < 4; r++ {
		loop(func(n int) error {
			_, err := os.ReadFile(b.path(fmt.Sprintf("s%d", (r+n)%files)))
			os.ReadDir(b.dir)
			if os.IsNotExist(err) {
				err = nil // caught mid-rename
			}
			return err
		})
	}
	for w := 0; w < 2; w++ {
		loop(func(n int) error {
			name := a.path(fmt.Sprintf("s%d", (w+n)%files))
			if err := os.WriteFile(name, testkit.Pattern(100<<10+n, byte(n)), 0o644); err != nil {
				return err
			}
			os.Rename(name, name+".tmp")
			os.Rename(name+".tmp", name)
			return nil
		})
	}
	// The storm lasts until each reader and writer has done its share of
	// steps (a writer's, each a recall, are the slow ones), or one of them
	// fails.
	const share = 20
	var failed error
	stormed := poll.Until(60*time.Second, func() bool {
		select {
		case failed = <-errs:
			return true
		default:
		}
		for _, n := range steps {
			if n.Load() < share {
				return false
			}
		}
		return true
	})
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("readers or writers hung under an invalidation storm")
	}
	if failed != nil {
		t.Fatal(failed)
	}
	if !stormed {
		t.Fatalf("readers and writers did not all make %d steps in 60 s", share)
	}
	// Afterwards B sees A's last version of each file.
	for i := 0; i < files; i++ {
		want, _ := os.ReadFile(a.path(fmt.Sprintf("s%d", i)))
		got, _ := os.ReadFile(b.path(fmt.Sprintf("s%d", i)))
		if !bytes.Equal(got, want) {
			t.Fatalf("s%d differs between the mounts after the storm", i)
		}
	}
}

// A daemon killed with -9 leaves a dead mount; hoard umount clears it and a
// new mount reuses the cache.
func TestFuseKilledDaemonRemount(t *testing.T) {
	needFuse(t)
	// The dead daemon's write delegation holds up the new one for a lease.
	srv := startServer(t, t.TempDir(), "--lease", "2s")
	cacheDir := t.TempDir()
	m := startMount(t, srv, cacheDir)
	content := testkit.Pattern(2<<20, 7)
	writeSynced(t, m.path("keep"), content)
	os.ReadFile(m.path("keep"))
	// Closed but not stored (write-back): the next daemon keeps it in lost/
	// under the path it had.
	if err := os.Mkdir(m.path("sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.path("sub/unsynced"), []byte("closed, not stored"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The next daemon finds what the cache index held at the crash (a
	// younger change is fetched again, never served wrong): crash once it
	// holds these changes.
	waitIndexed(t, cacheDir, time.Now())
	m.cmd.Process.Kill()
	m.cmd.Wait()
	m.cmd = nil
	if _, err := os.Stat(m.path("keep")); err == nil {
		t.Fatal("the mount still answers after its daemon died")
	}
	out, code := run(t, "mount", "--server", srv.addr, "--cache", cacheDir, m.dir)
	if code != 2 || !strings.Contains(out, "umount") {
		t.Fatalf("mount over a dead mount: exit %d %q", code, out)
	}
	if out, code := run(t, "umount", m.dir); code != 0 {
		t.Fatalf("umount of a dead mount: %d %q", code, out)
	}
	m.start(srv)
	got, err := os.ReadFile(m.path("keep"))
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("read after remount: %v", err)
	}
	kept, err := lost.List(cacheDir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/sub/unsynced" {
		t.Fatalf("writes the dead daemon closed but did not store: %+v %v", kept, err)
	}
	m.stop()
	// The file was written through this cache and never fetched: the
	// counter, kept across both daemons, must still be zero.
	if d := readStats(t, cacheDir).BytesFetched; d != 0 {
		t.Fatalf("the remounted cache fetched %d bytes of an unchanged file", d)
	}
}

func readStats(t *testing.T, dir string) cache.Stats {
	t.Helper()
	s, err := cache.ReadStats(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Wholly cached files are read by passthrough, and hoard cache stats says so.
func TestFusePassthrough(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	cacheDir := t.TempDir()
	m := startMount(t, srv, cacheDir)
	if !strings.Contains(m.logs.String(), "passthrough") {
		t.Fatalf("the mount did not say which read path it uses: %s", m.logs)
	}
	if !strings.Contains(m.logs.String(), "cached reads by FUSE passthrough") {
		t.Skipf("SKIP: passthrough unavailable here: %s", m.logs)
	}
	content := testkit.Pattern(1<<20, 3)
	os.WriteFile(m.path("p"), content, 0o644)
	for i := 0; i < 3; i++ {
		if got, _ := os.ReadFile(m.path("p")); !bytes.Equal(got, content) {
			t.Fatal("read differs")
		}
	}
	// A writer while passthrough readers are open must not get ETXTBSY.
	r, err := os.Open(m.path("p"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.WriteFile(m.path("p"), []byte("new"), 0o644); err != nil {
		t.Fatalf("write while a passthrough reader is open: %v", err)
	}
	if got, _ := os.ReadFile(m.path("p")); string(got) != "new" {
		t.Fatalf("read after the write: %q", got)
	}
	poll.Wait(t, 10*time.Second, "passthrough opens counted in stats.json", func() bool {
		s, err := cache.ReadStats(cacheDir)
		return err == nil && s.Gauges["passthrough_opens"] > 0
	})
	out, _ := run(t, "cache", "stats", "--cache", cacheDir)
	if !strings.Contains(out, "passthrough opens:") {
		t.Fatalf("cache stats does not report passthrough opens: %q", out)
	}
}

// Bad mountpoints get a clear error and exit 2.
func TestFuseBadMountpoint(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	m := startMount(t, srv, t.TempDir())
	for _, c := range []struct{ dir, want string }{
		{filepath.Join(t.TempDir(), "missing"), "no such file"},
		{file, "not a directory"},
		{m.dir, "already a mount"},
	} {
		out, code := run(t, "mount", "--server", srv.addr, "--cache", "", c.dir)
		if code != 2 || !strings.Contains(out, c.want) || !strings.Contains(out, c.dir) {
			t.Errorf("mount %s: exit %d %q, want exit 2 and %q", c.dir, code, out, c.want)
		}
	}
	if out, code := run(t, "umount", t.TempDir()); code != 2 || !strings.Contains(out, "not mounted") {
		t.Errorf("umount of a plain directory: %d %q", code, out)
	}
}

// With the server gone, cached and still promised files stay readable,
// other operations fail within the mount's timeout, and all recovers when
// the server is back.
func TestFuseServerAway(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	m := startMount(t, srv, t.TempDir(), "--timeout", "2s")
	content := testkit.Pattern(700<<10, 4)
	os.WriteFile(m.path("cached"), content, 0o644)
	if got, _ := os.ReadFile(m.path("cached")); !bytes.Equal(got, content) {
		t.Fatal("read differs")
	}
	srv.kill9()
	for i := 0; i < 3; i++ {
		got, err := os.ReadFile(m.path("cached"))
		if err != nil || !bytes.Equal(got, content) {
			t.Fatalf("cached read with the server gone: %v", err)
		}
	}
	// The cached reads above may be the kernel's alone (the file was made
	// here): a mkdir goes to the server, and so the mount finds it gone.
	start := time.Now()
	err := os.Mkdir(m.path("newdir"), 0o755)
	if !errors.Is(err, syscall.EIO) && !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("mkdir with the server gone: %v, want EIO or ETIMEDOUT", err)
	}
	if took := time.Since(start); took > 6*time.Second {
		t.Fatalf("mkdir took %v to fail with a 2s timeout", took)
	}
	// A create is not made locally under the root's delegation either:
	// the server may never take it.
	start = time.Now()
	err = os.WriteFile(m.path("new"), []byte("x"), 0o644)
	took := time.Since(start)
	if err == nil {
		t.Fatal("a create succeeded with the server gone")
	}
	if !errors.Is(err, syscall.EIO) && !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("create with the server gone: %v, want EIO or ETIMEDOUT", err)
	}
	if took > 6*time.Second {
		t.Fatalf("create took %v to fail with a 2s timeout", took)
	}
	srv.restart()
	if !poll.Until(10*time.Second, func() bool {
		err = os.WriteFile(m.path("after"), []byte("back"), 0o644)
		return err == nil
	}) {
		t.Fatalf("the mount did not recover: %v", err)
	}
	if got, _ := os.ReadFile(m.path("after")); string(got) != "back" {
		t.Fatalf("read after recovery: %q", got)
	}
}

// writeSynced writes a file through a mount and fsyncs it: under a write
// delegation, close alone leaves the data in the client's cache.
func writeSynced(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// A mount that looks a file up under its new name while another client
// renames it still drops the old name when the rename returns. go-fuse
// builds a second inode for the second name and drops it for the one it
// has; invalidations once went to the dropped one, so the kernel kept the
// old name for as long as the file's promise lasted.
func TestFuseRenameSeenUnderBothNames(t *testing.T) {
	srv := startServer(t, t.TempDir())
	lib := dialCons(t, srv, t.Name()+"-lib", false)
	if err := lib.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, srv, t.TempDir())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if f, err := os.Open(m.path("d/new")); err == nil {
				f.Close()
			}
		}
	})
	stale := 0
	for range 200 {
		if err := os.WriteFile(m.path("d/old"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := lib.Rename("/d/old", "/d/new"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(m.path("d/old")); !errors.Is(err, fs.ErrNotExist) {
			stale++
		}
		if err := lib.Remove("/d/new"); err != nil {
			t.Fatal(err)
		}
	}
	if stale > 0 {
		t.Fatalf("the mount still had the old name after %d of 200 renames", stale)
	}
}

// Files the kernel forgot are dropped from the mount's memory a little
// later, and what the kernel looks up again afterwards is still kept
// coherent by breaks.
func TestFuseForgottenNodesReleased(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	cacheDir := t.TempDir()
	m := startMount(t, srv, cacheDir)
	lib := dial(t, srv.addr, "mem", 16<<20)
	if err := lib.Mkdir("/many", 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		testkit.WriteFile(t, lib, fmt.Sprintf("/many/f%d", i), []byte("old"))
	}
	for i := range 200 {
		if got, err := os.ReadFile(m.path(fmt.Sprintf("many/f%d", i))); err != nil || string(got) != "old" {
			t.Fatalf("f%d through the mount: %q, %v", i, got, err)
		}
	}
	// stats.json is written once a second, the first time a second after
	// the mount started: wait for it to show cond.
	nodes := func(cond func(int64) bool) int64 {
		var n int64
		poll.Until(15*time.Second, func() bool {
			s, err := cache.ReadStats(cacheDir)
			n = s.Gauges["nodes"]
			return err == nil && cond(n)
		})
		return n
	}
	// The kernel may forget a few of them on its own.
	if n := nodes(func(n int64) bool { return n >= 100 }); n < 100 {
		t.Fatalf("%d nodes in memory after 200 files were read", n)
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Skipf("SKIP: cannot make the kernel forget its inodes: %v", err)
	}
	if n := nodes(func(n int64) bool { return n < 50 }); n >= 50 {
		t.Fatalf("%d nodes still in memory after the kernel forgot the files", n)
	}
	testkit.WriteFile(t, lib, "/many/f7", []byte("new"))
	if got, err := os.ReadFile(m.path("many/f7")); err != nil || string(got) != "new" {
		t.Fatalf("after another client's write: %q, %v", got, err)
	}
	if err := lib.Rename("/many/f8", "/many/f9"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.path("many/f8")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a name renamed away by another client: %v", err)
	}
}

// A mount whose own request holds a directory's kernel lock (here a
// rename out of it, held at the server by a silent client) acknowledges a
// break of that directory before the kernel could drop its names: waiting
// longer could deadlock, when that request waits for this very break.
// Until the kernel has dropped them, a name the break voided must not
// lead to the file it used to name.
func TestFuseBreakPastKernelLock(t *testing.T) {
	_, lib, a, renamed := heldRename(t, "6s", map[string]string{"f0": "old", "x": "x"})
	if err := lib.Rename("/d/f0", "/d/f2"); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, lib, "/d/f0", []byte("new"))
	select {
	case err := <-renamed:
		t.Fatalf("a's rename returned (%v) before the silent mount's break timed out: the directory was not locked", err)
	default:
	}
	got, err := os.ReadFile(a.path("d/f0"))
	if err != nil || string(got) != "new" {
		t.Fatalf("a read d/f0 as %q (%v) after it was renamed away and made again: want \"new\"", got, err)
	}
	if err := <-renamed; err != nil {
		t.Fatal(err)
	}
}

// The same lock, held by the mount's own rename while another client
// renames the file on from the name that rename gave it: the break's
// invalidation was sent before the kernel filed the file under that
// name, and did not drop it; the name must not lead to the file once
// the rename returned.
func TestFuseRenamedOnDuringRename(t *testing.T) {
	srv, lib, a, renamed := heldRename(t, "3s", map[string]string{"x": "x"})
	// Applied at once, and also held by the silent mount.
	onward := make(chan error, 1)
	go func() { onward <- lib.Rename("/e/x", "/e/z") }()
	reached(t, dial(t, srv.addr, "mem", 16<<20), "/e/z")
	if err := <-renamed; err != nil {
		t.Fatal(err)
	}
	// At once: the kernel has just filed the file under e/x.
	if got, err := os.ReadFile(a.path("e/x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a read e/x as %q (%v) after another client renamed it to e/z", got, err)
	}
	if err := <-onward; err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(a.path("e/z")); err != nil || string(got) != "x" {
		t.Fatalf("a read e/z as %q (%v)", got, err)
	}
}

// A break whose invalidation the kernel cannot take in time (its
// directory's lock is held) leaves the kernel's names in place, and the
// files they lead to distrusted. Finding such a file under its new name,
// in another directory, must not let the old name lead to it: FUSE's
// OPEN does not say which name it came through.
func TestFuseStaleNameAfterLookupElsewhere(t *testing.T) {
	_, lib, a, renamed := heldRename(t, "3s", map[string]string{"x": "x", "f1": "one"})
	// a's kernel holds d's lock until its rename returns.
	if err := lib.Rename("/d/f1", "/g/f0"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(a.path("g/f0")); err != nil || string(got) != "one" {
		t.Fatalf("a read g/f0 as %q (%v)", got, err)
	}
	if got, err := os.ReadFile(a.path("d/f1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a read d/f1 as %q (%v) after another client renamed it to g/f0", got, err)
	}
	if err := <-renamed; err != nil {
		t.Fatal(err)
	}
}

// heldRename sets up mount a's rename of d/x to e/x, applied at the
// server at once while its reply waits for a stopped mount that has e
// cached: meanwhile a's kernel holds the locks of d and e. files (x
// among them) are made in d and read through a first; g is another
// directory, not held. It returns once
// the rename reached the server, with a library client and the rename's
// outcome to come.
func heldRename(t *testing.T, breakTimeout string, files map[string]string) (srv *serverProc, lib *pathfs.FS, a *mountProc, renamed <-chan error) {
	t.Helper()
	srv = startServer(t, t.TempDir(), "--break-timeout", breakTimeout)
	lib = dialCons(t, srv, t.Name()+"-lib", true)
	for _, d := range []string{"/d", "/e", "/g"} {
		if err := lib.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range files {
		testkit.WriteFile(t, lib, "/d/"+name, []byte(data))
	}
	a = startMount(t, srv, t.TempDir())
	silent := startMount(t, srv, t.TempDir())
	if _, err := os.ReadDir(silent.path("e")); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if got, err := os.ReadFile(a.path("d/" + name)); err != nil || string(got) != data {
			t.Fatalf("a read d/%s as %q (%v)", name, got, err)
		}
	}
	os.ReadDir(a.path("e"))
	silent.cmd.Process.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { silent.cmd.Process.Signal(syscall.SIGCONT) })
	out := make(chan error, 1)
	go func() { out <- os.Rename(a.path("d/x"), a.path("e/x")) }()
	reached(t, lib, "/e/x")
	return srv, lib, a, out
}

// reached waits until c finds name at the server.
func reached(t *testing.T, c *pathfs.FS, name string) {
	t.Helper()
	var err error
	if !poll.Until(5*time.Second, func() bool { _, err = c.Stat(name); return err == nil }) {
		t.Fatalf("%s never reached the server: %v", name, err)
	}
}

// hoard umount returns once the mount's daemon has stored what its
// write-back held and exited: a script that unmounts and then stops the
// server (make run does) loses nothing; the files are at the server, and
// survive its kill -9, when umount returns.
func TestFuseUmountStoresFirst(t *testing.T) {
	srv := startServer(t, t.TempDir())
	m := startMount(t, srv, t.TempDir())
	if err := os.Mkdir(m.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		if err := os.WriteFile(m.path(fmt.Sprintf("d/f%d", i)), testkit.Pattern(5000, byte(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, code := run(t, "umount", m.dir); code != 0 {
		t.Fatalf("umount: %d %s", code, out)
	}
	if mounted, _ := mount.IsMounted(m.dir); mounted {
		t.Fatal("still mounted")
	}
	if state, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.cmd.Process.Pid)); err == nil && !bytes.Contains(state, []byte(") Z ")) {
		t.Fatalf("umount returned with the daemon still running: %s", state)
	}
	srv.kill9()
	srv.restart()
	c := dial(t, srv.addr, "mem", 64<<20)
	for i := range n {
		if got := testkit.ReadFile(t, c, fmt.Sprintf("/d/f%d", i)); !bytes.Equal(got, testkit.Pattern(5000, byte(i))) {
			t.Fatalf("/d/f%d after umount and the server's kill -9: %d bytes", i, len(got))
		}
	}
}

// A file unlinked while open is hidden under a .hoard-unlinked name until
// its last close; rm -rf of its directory meanwhile removes that name too,
// and then the directory: it used to find it not empty (the second unlink
// hid the file again), and left it behind. The open file then answers
// ESTALE, as an NFS client's does once its .nfs file is removed.
func TestFuseRmdirAfterHiddenNameRemoved(t *testing.T) {
	srv := startServer(t, t.TempDir())
	m := startMount(t, srv, t.TempDir())
	d := m.path("d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "f"), []byte("still readable"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(d, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Remove(filepath.Join(d, "f")); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(d)
	if err != nil || len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), ".hoard-unlinked-") {
		t.Fatalf("after unlinking an open file: %v %v", ents, err)
	}
	if err := os.RemoveAll(d); err != nil {
		t.Fatalf("rm -rf of the directory: %v", err)
	}
	if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the directory is still there: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 64), 0); !errors.Is(err, syscall.ESTALE) {
		t.Fatalf("a read of the open file whose last name went: %v, want ESTALE", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// A file open on this mount that a rename replaces stays readable and
// writable through its opens until the last close, as on a local file
// system: the mount hides it first, as it hides an unlinked open file.
// It used to be gone at the server, and the open answered ESTALE.
func TestFuseRenameOverOpenFile(t *testing.T) {
	srv := startServer(t, t.TempDir())
	m := startMount(t, srv, t.TempDir())
	if err := os.WriteFile(m.path("victim"), []byte("old contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.path("new"), []byte("new contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(m.path("victim"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.path("new"), m.path("victim")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("OLD"), 0); err != nil {
		t.Fatalf("a write to the replaced open file: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync of the replaced open file: %v", err)
	}
	p := make([]byte, 12)
	if _, err := f.ReadAt(p, 0); err != nil || string(p) != "OLD contents" {
		t.Fatalf("a read of the replaced open file: %q %v", p, err)
	}
	if got, err := os.ReadFile(m.path("victim")); err != nil || string(got) != "new contents" {
		t.Fatalf("the name now: %q %v", got, err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".hoard-unlinked-") {
			t.Fatalf("%s left after the last close", e.Name())
		}
	}
}

// A rename over a file this mount has open that fails leaves the file
// under its name: hiding it and the rename are one change at the server.
// The mount used to hide it first, so a rename that then failed (here,
// from another volume; in the consistency checker, of a source another
// client had just renamed away) took the file's name with it.
func TestFuseFailedRenameOverOpenFile(t *testing.T) {
	srv := startServer(t, t.TempDir())
	lib := dial(t, srv.addr, "mem", 16<<20)
	if _, err := lib.Admin().CreateVolume("proj"); err != nil {
		t.Fatal(err)
	}
	if err := lib.Admin().MountVolume("/proj", "proj"); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, srv, t.TempDir())
	for name, data := range map[string]string{"victim": "old contents", "proj/other": "other volume"} {
		if err := os.WriteFile(m.path(name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(m.path("victim"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Rename(m.path("proj/other"), m.path("victim")); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename from another volume: %v, want EXDEV", err)
	}
	if got, err := os.ReadFile(m.path("victim")); err != nil || string(got) != "old contents" {
		t.Fatalf("the open file after the failed rename: %q %v", got, err)
	}
	if st, err := lib.Stat("/victim"); err != nil || st.Size != uint64(len("old contents")) {
		t.Fatalf("the open file at the server after the failed rename: %+v %v", st, err)
	}
	names, err := os.ReadDir(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range names {
		if strings.HasPrefix(e.Name(), ".hoard-unlinked-") {
			t.Fatalf("%s made by the failed rename", e.Name())
		}
	}
}

// TestFuseListingKeptByKernel: a directory listed again under its promise
// is listed from the kernel's copy, with no request to the mount; another
// mount's change to it is listed at once all the same.
func TestFuseListingKeptByKernel(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	a := startMount(t, srv, t.TempDir(), "--debug")
	b := startMount(t, srv, t.TempDir())
	if err := os.Mkdir(a.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if err := os.WriteFile(a.path(fmt.Sprintf("d/f%03d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	marks := 0
	// mark has a's kernel send a LOOKUP of a new name and waits for the
	// mount's trace to show it: what the trace holds before it, the mount
	// was sent before.
	mark := func() int {
		marks++
		name := fmt.Sprintf("mark-%d", marks)
		os.Stat(a.path(name))
		var at int
		poll.Wait(t, 5*time.Second, "the mount's trace of "+name, func() bool {
			at = strings.Index(a.logs.String(), `"`+name+`"`)
			return at >= 0
		})
		return at
	}
	// listings is how many READDIR(PLUS) requests listing d cost.
	listings := func(want int) int {
		from := mark()
		if names := strings.Split(a.listNames(t, "d"), ","); len(names) != want {
			t.Fatalf("listed %d names, want %d", len(names), want)
		}
		to := mark()
		return strings.Count(a.logs.String()[from:to], ": READDIR")
	}
	listings(300)
	listings(300)
	if n := listings(300); n != 0 {
		t.Fatalf("a warm listing cost %d READDIR requests", n)
	}
	if err := os.WriteFile(b.path("d/new"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if n := listings(301); n == 0 {
		t.Fatal("the listing after another mount's create was served from the kernel's old copy")
	}
	// A file removed while open lives on under a hidden name, which the
	// mount itself removes at the last close: the kernel's listing must
	// lose it, in a directory only this mount uses (its delegation's,
	// whose version the removal does not change).
	if err := os.Mkdir(a.path("e"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"e/f", "e/g"} {
		if err := os.WriteFile(a.path(name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	held, err := os.Open(a.path("e/f"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(a.path("e/f")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if names := a.listNames(t, "e"); !strings.Contains(names, ".hoard-unlinked") {
			t.Fatalf("the open removed file is not listed under a hidden name: %q", names)
		}
	}
	held.Close()
	poll.Wait(t, 5*time.Second, "the hidden name gone from the listing", func() bool {
		return a.listNames(t, "e") == "g"
	})
}
