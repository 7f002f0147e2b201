package integration

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/testkit"
)

// Three library clients of one server: a write closed on A is read on B
// and C; B's cached copy is dropped by the break, while a file nobody
// changed is served from B's cache without fetching a byte.
func TestCloseToOpenAndBreaks(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, t.TempDir(), 64<<20)
	b := dial(t, srv.addr, t.TempDir(), 64<<20)
	c := dial(t, srv.addr, "mem", 64<<20)

	v1 := testkit.Pattern(1<<20+123, 1)
	testkit.WriteFile(t, a, "/shared", v1)
	testkit.WriteFile(t, a, "/quiet", testkit.Pattern(300<<10, 2))
	if got := testkit.ReadFile(t, b, "/shared"); !bytes.Equal(got, v1) {
		t.Fatal("B read wrong bytes")
	}
	testkit.ReadFile(t, b, "/quiet")
	if got := testkit.ReadFile(t, c, "/shared"); !bytes.Equal(got, v1) {
		t.Fatal("C read wrong bytes")
	}

	before := b.Client().Stats()
	if got := testkit.ReadFile(t, b, "/shared"); !bytes.Equal(got, v1) {
		t.Fatal("B re-read wrong bytes")
	}
	after := b.Client().Stats()
	if d := after.BytesFetched - before.BytesFetched; d != 0 {
		t.Fatalf("a cached re-read fetched %d bytes", d)
	}
	if after.RPCs != before.RPCs {
		t.Fatalf("a cached re-read under a valid promise cost %d RPCs", after.RPCs-before.RPCs)
	}

	v2 := testkit.Pattern(1<<20+77, 3)
	breaks := b.Client().Stats().Breaks
	testkit.WriteFile(t, a, "/shared", v2)
	// The break reached B before A's Close returned.
	if b.Client().Stats().Breaks <= breaks {
		t.Fatal("B received no break before A's close returned")
	}
	before = b.Client().Stats()
	if got := testkit.ReadFile(t, b, "/shared"); !bytes.Equal(got, v2) {
		t.Fatal("B read stale bytes after A's close")
	}
	if got := testkit.ReadFile(t, c, "/shared"); !bytes.Equal(got, v2) {
		t.Fatal("C read stale bytes after A's close")
	}
	testkit.ReadFile(t, b, "/quiet")
	after = b.Client().Stats()
	if d := after.BytesFetched - before.BytesFetched; d != int64(len(v2)) {
		t.Fatalf("B fetched %d bytes after the change, want exactly the changed file's %d", d, len(v2))
	}

	// Directory changes reach cached listings too.
	if _, err := b.ReadDir("/"); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, a, "/new", []byte("x"))
	ents, err := b.ReadDir("/")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range ents {
		found = found || e.Name == "new"
	}
	if !found {
		t.Fatal("B's listing does not show A's new file")
	}
	if err := a.Rename("/new", "/renamed"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Stat("/new"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("B still sees the old name: %v", err)
	}
	if _, err := b.Stat("/renamed"); err != nil {
		t.Fatalf("B does not see the new name: %v", err)
	}
}

// A client that stops answering (SIGSTOP) holds up a writer for no longer
// than the break timeout; a killed one not at all.
func TestDeadClientDoesNotBlockWriter(t *testing.T) {
	const bound = 1 * time.Second
	srv := startServer(t, t.TempDir(), "--break-timeout", bound.String())
	a := dial(t, srv.addr, "mem", 16<<20)
	testkit.WriteFile(t, a, "/f", []byte("v1"))

	for _, how := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGKILL} {
		t.Run(how.String(), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "HOARD_TEST_HELPER=1", "HOARD_TEST_SERVER="+srv.addr, "HOARD_TEST_FILE=/f")
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || strings.TrimSpace(line) != "ready" {
				t.Fatalf("helper: %q %v", line, err)
			}
			cmd.Process.Signal(how)
			if how == syscall.SIGKILL {
				cmd.Wait()
			}
			start := time.Now()
			testkit.WriteFile(t, a, "/f", []byte("v2-"+how.String()))
			took := time.Since(start)
			if took > bound+time.Second {
				t.Fatalf("writer blocked %v by a %v client (bound %v)", took, how, bound)
			}
			if how == syscall.SIGKILL && took > bound/2 {
				t.Fatalf("a killed client held the writer %v", took)
			}
			t.Logf("writer took %v with a %v client", took, how)
		})
	}
}

// kill -9 of the server after acknowledged writes: everything acknowledged
// is there after the restart, and the same clients carry on.
func TestServerCrashKeepsAcknowledgedData(t *testing.T) {
	data := t.TempDir()
	srv := startServer(t, data)
	a := dial(t, srv.addr, t.TempDir(), 64<<20)
	b := dial(t, srv.addr, t.TempDir(), 64<<20)
	files := map[string][]byte{}
	if err := a.Mkdir("/dir", 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("/dir/f%02d", i)
		files[name] = testkit.Pattern(1000+i*40000, byte(i))
		testkit.WriteFile(t, a, name, files[name])
	}
	// An fsync'd but not closed file is acknowledged too.
	f, err := a.Create("/synced")
	if err != nil {
		t.Fatal(err)
	}
	files["/synced"] = testkit.Pattern(200000, 99)
	f.Write(files["/synced"])
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := a.Rename("/dir/f00", "/dir/moved"); err != nil {
		t.Fatal(err)
	}
	files["/dir/moved"] = files["/dir/f00"]
	delete(files, "/dir/f00")
	if err := a.Remove("/dir/f01"); err != nil {
		t.Fatal(err)
	}
	delete(files, "/dir/f01")
	unchanged := testkit.ReadFile(t, b, "/dir/f05")

	srv.kill9()
	srv.restart()

	// Revalidation keeps B's unchanged data: reading it fetches nothing.
	before := b.Client().Stats().BytesFetched
	if got := testkit.ReadFile(t, b, "/dir/f05"); !bytes.Equal(got, unchanged) {
		t.Fatal("f05 changed")
	}
	if d := b.Client().Stats().BytesFetched - before; d != 0 {
		t.Fatalf("revalidation after the restart refetched %d bytes of an unchanged file", d)
	}
	for name, want := range files {
		got, err := testkit.TryRead(b, name)
		if err != nil {
			t.Fatalf("%s after restart: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s differs after restart", name)
		}
	}
	for _, gone := range []string{"/dir/f00", "/dir/f01"} {
		if _, err := b.Stat(gone); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("%s: %v, want ENOENT", gone, err)
		}
	}
	// The writer's open handle carries on too.
	f.Write([]byte("more"))
	if err := f.Close(); err != nil {
		t.Fatalf("close across a server restart: %v", err)
	}
	if got := testkit.ReadFile(t, b, "/synced"); !bytes.Equal(got, append(files["/synced"], "more"...)) {
		t.Fatal("write after restart lost")
	}
}

// After a server restart, one status RPC per cached file: unchanged data
// is kept, changed data dropped.
func TestEpochRevalidation(t *testing.T) {
	data := t.TempDir()
	srv := startServer(t, data)
	a := dial(t, srv.addr, "mem", 64<<20)
	b := dial(t, srv.addr, t.TempDir(), 64<<20)
	testkit.WriteFile(t, a, "/same", testkit.Pattern(500000, 1))
	testkit.WriteFile(t, a, "/changes", testkit.Pattern(500000, 2))
	testkit.ReadFile(t, b, "/same")
	testkit.ReadFile(t, b, "/changes")

	srv.stop()
	srv.restart()
	newer := testkit.Pattern(400000, 3)
	// A writes through its new session; B, holding no valid promise, must
	// notice by DataVersion.
	testkit.WriteFile(t, a, "/changes", newer)
	before := b.Client().Stats()
	if got := testkit.ReadFile(t, b, "/changes"); !bytes.Equal(got, newer) {
		t.Fatal("B served stale data after the server restart")
	}
	testkit.ReadFile(t, b, "/same")
	after := b.Client().Stats()
	if d := after.BytesFetched - before.BytesFetched; d != int64(len(newer)) {
		t.Fatalf("fetched %d bytes, want only the changed file's %d", d, len(newer))
	}
	if d := after.Dropped - before.Dropped; d != 1 {
		t.Fatalf("%d files' cached data dropped, want exactly the changed one", d)
	}
}

// A client restarted on the same cache directory reuses its cache.
func TestClientRestartReusesCache(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 64<<20)
	var want [][]byte
	for i := 0; i < 5; i++ {
		want = append(want, testkit.Pattern(700000+i, byte(i)))
		testkit.WriteFile(t, a, fmt.Sprintf("/f%d", i), want[i])
	}
	dir := t.TempDir()
	b := dial(t, srv.addr, dir, 64<<20)
	for i := range want {
		testkit.ReadFile(t, b, fmt.Sprintf("/f%d", i))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := dial(t, srv.addr, dir, 64<<20)
	before := b2.Client().Stats().BytesFetched
	for i := range want {
		if got := testkit.ReadFile(t, b2, fmt.Sprintf("/f%d", i)); !bytes.Equal(got, want[i]) {
			t.Fatalf("f%d differs", i)
		}
	}
	if d := b2.Client().Stats().BytesFetched - before; d != 0 {
		t.Fatalf("restarted client fetched %d bytes of unchanged files", d)
	}
}

// Under a small cache the limit holds, chunks are evicted, and every read
// is still right.
func TestEvictionUnderSmallCache(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 64<<20)
	const limit = 2 << 20
	dir := t.TempDir()
	b := dial(t, srv.addr, dir, limit)
	var want [][]byte
	for i := 0; i < 6; i++ {
		want = append(want, testkit.Pattern(1<<20+i*1000, byte(10+i)))
		testkit.WriteFile(t, a, fmt.Sprintf("/big%d", i), want[i])
	}
	for round := 0; round < 2; round++ {
		for i := range want {
			if got := testkit.ReadFile(t, b, fmt.Sprintf("/big%d", i)); !bytes.Equal(got, want[i]) {
				t.Fatalf("big%d differs", i)
			}
			if st := b.Client().Stats(); st.BytesCached > limit {
				t.Fatalf("cache holds %d bytes, limit %d", st.BytesCached, limit)
			}
		}
	}
	st := b.Client().Stats()
	if st.Evictions == 0 {
		t.Fatal("no evictions under a cache smaller than the data")
	}
	// The disk agrees with the accounting.
	var used int64
	filepath.Walk(filepath.Join(dir, "files"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			used += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	if used > limit {
		t.Fatalf("cache files use %d bytes on disk, limit %d", used, limit)
	}
}

// The server is unreachable: a clear error naming the address, in bounded time.
func TestUnreachableServer(t *testing.T) {
	addr := freeAddr(t)
	start := time.Now()
	out, code := run(t, "ls", "/", "--server", addr, "--cache", "", "--timeout", "1s")
	if code == 0 || !strings.Contains(out, addr) {
		t.Fatalf("exit %d, output %q", code, out)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %v to give up", took)
	}
	if n := strings.Count(strings.TrimSpace(out), "\n"); n != 0 {
		t.Fatalf("error is not one line: %q", out)
	}
	// In a person's words, without gRPC's layers.
	if want := "hoard: server " + addr + " unreachable: connection refused\n"; out != want {
		t.Fatalf("unreachable server: %q, want %q", out, want)
	}
	out, code = run(t, "ls", "/", "--server", "nohost.invalid:7100", "--cache", "", "--timeout", "1s")
	if code != 1 || !strings.HasPrefix(out, "hoard: server nohost.invalid:7100 unreachable: cannot resolve nohost.invalid") || strings.Contains(out, "desc =") {
		t.Fatalf("unresolvable server: exit %d: %q", code, out)
	}
}
