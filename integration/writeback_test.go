package integration

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// Under a write delegation, opens and closes cost no RPC and the writes
// and truncations stay in the cache; another client's open recalls the delegation and sees
// every byte, and the writer's next change is seen by the reader's next
// open (close-to-open holds with write-back).
func TestWriteBackAndRecall(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, t.TempDir(), 64<<20)
	b := dial(t, srv.addr, "mem", 64<<20)
	v1 := testkit.Pattern(3<<20+5, 1)
	testkit.WriteFile(t, a, "/f", v1)
	if st := a.Client().Stats(); st.WriteDelegations != 1 || st.DirtyBytes != int64(len(v1)) || st.Stores != 0 {
		t.Fatalf("after a close under a write delegation: %d write delegations, %d dirty bytes, %d stores", st.WriteDelegations, st.DirtyBytes, st.Stores)
	}
	before := a.Client().Stats()
	f, err := a.Open("/f", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("XYZ"), 10)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	after := a.Client().Stats()
	if after.RPCs != before.RPCs || after.LocalOpens != before.LocalOpens+1 || after.LocalCloses != before.LocalCloses+1 {
		t.Fatalf("open, write, close under the delegation: %d RPCs, %d local opens, %d local closes",
			after.RPCs-before.RPCs, after.LocalOpens-before.LocalOpens, after.LocalCloses-before.LocalCloses)
	}
	// A truncation by name (how the kernel sends open(O_TRUNC)) stays
	// local too.
	before = a.Client().Stats()
	if err := a.Truncate("/f", 2<<20); err != nil {
		t.Fatal(err)
	}
	if after := a.Client().Stats(); after.RPCs != before.RPCs {
		t.Fatalf("truncate under the delegation: %d RPCs", after.RPCs-before.RPCs)
	}
	want := append([]byte(nil), v1[:2<<20]...)
	copy(want[10:], "XYZ")
	if got := testkit.ReadFile(t, b, "/f"); !bytes.Equal(got, want) {
		t.Fatal("the reader did not see the writer's closed data")
	}
	if st := a.Client().Stats(); st.Recalls < 1 || st.DirtyBytes != 0 || st.WriteDelegations != 0 {
		t.Fatalf("after the recall: %d recalls, %d dirty bytes, %d write delegations", st.Recalls, st.DirtyBytes, st.WriteDelegations)
	}
	testkit.WriteFile(t, a, "/f", []byte("v2"))
	if got := testkit.ReadFile(t, b, "/f"); string(got) != "v2" {
		t.Fatalf("the reader's next open: %q", got)
	}
}

// A file created, written and removed under a write delegation never
// reaches the server's data store; without delegations every one does.
func TestShortLivedFiles(t *testing.T) {
	srv := startServer(t, t.TempDir())
	for _, deleg := range []bool{true, false} {
		c, err := cellDial(client.Options{Server: srv.addr, NoDelegations: !deleg})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		before := c.Client().Stats().Stores
		for i := 0; i < 20; i++ {
			name := fmt.Sprintf("/tmp-%v-%d", deleg, i)
			testkit.WriteFile(t, c, name, testkit.Pattern(100<<10, byte(i)))
			if err := c.Remove(name); err != nil {
				t.Fatal(err)
			}
		}
		stores := c.Client().Stats().Stores - before
		if deleg && (stores != 0 || c.Client().Stats().DirtyBytes != 0) {
			t.Fatalf("with delegations: %d stores, %d dirty bytes left for 20 short-lived files", stores, c.Client().Stats().DirtyBytes)
		}
		if !deleg && (stores != 20 || c.Client().Stats().LocalOpens != 0) {
			t.Fatalf("with --no-delegations: %d stores (want 20), %d local opens", stores, c.Client().Stats().LocalOpens)
		}
	}
}

// The flusher stores on its own: above (hidirty+lodirty)/2 dirty bytes it
// stores until under lodirty (and no further), and data older than the
// age bound is stored whatever the count.
func TestFlusher(t *testing.T) {
	srv := startServer(t, t.TempDir())
	// 16 MiB with 256 KiB chunks: hidirty 4 MiB + 20 chunks (36 chunks),
	// lodirty 18 chunks, start at 27.
	a, err := cellDial(client.Options{Server: srv.addr, CacheDir: t.TempDir(), CacheSize: 16 << 20, FlushAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for i := 0; i < 10; i++ {
		testkit.WriteFile(t, a, fmt.Sprintf("/t%d", i), testkit.Pattern(1<<20, byte(i)))
	}
	// Passing the start it stored down to lodirty, and then stays between
	// lodirty and the start until more is written. It is done when each
	// store it began has ended: a store is of one whole 1 MiB file,
	// counted in Stores as it begins and in Flushed once it ended.
	const start = 27 << 18
	var st client.Stats
	poll.Until(10*time.Second, func() bool {
		st = a.Client().Stats()
		return st.DirtyBytes <= start && st.DirtyBytes+st.Flushed == 10<<20 && st.Stores<<20 == st.Flushed
	})
	if st.DirtyBytes > start || st.DirtyBytes == 0 || st.Flushed == 0 || st.DirtyBytes+st.Flushed != 10<<20 || st.Stores<<20 != st.Flushed {
		t.Fatalf("after 10 MiB written: %d dirty bytes (want 1..%d), %d flushed, %d stores", st.DirtyBytes, start, st.Flushed, st.Stores)
	}
	// Below the start its passes, once a second, store nothing more. A
	// pass that stores nothing leaves no trace (the client counts no
	// passes), so only time tells that one came: a second and a half.
	poll.Holds(t, 1500*time.Millisecond, fmt.Sprintf("the flusher stays below the start threshold at %d dirty bytes", st.DirtyBytes),
		func() bool { return a.Client().Stats().DirtyBytes == st.DirtyBytes })

	b, err := cellDial(client.Options{Server: srv.addr, CacheDir: t.TempDir(), FlushAge: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	testkit.WriteFile(t, b, "/aged", testkit.Pattern(1<<20, 1))
	if b.Client().Stats().DirtyBytes == 0 {
		t.Fatal("close stored the data under a write delegation")
	}
	poll.Until(5*time.Second, func() bool { return b.Client().Stats().Flushed == 1<<20 })
	if st := b.Client().Stats(); st.DirtyBytes != 0 || st.Flushed != 1<<20 {
		t.Fatalf("1 s age bound: %d dirty bytes, %d flushed after 5 s", st.DirtyBytes, st.Flushed)
	}
}

// A cache full of dirty data does not fail the writer while the server is
// there (the flusher drains it); with the server gone, the writer gets
// ENOSPC.
func TestDirtyCacheFull(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a, err := cellDial(client.Options{Server: srv.addr, CacheDir: t.TempDir(), CacheSize: 4 << 20, FlushAge: time.Hour, RPCTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := dial(t, srv.addr, "mem", 64<<20)
	for i := 0; i < 24; i++ {
		testkit.WriteFile(t, a, fmt.Sprintf("/full%d", i), testkit.Pattern(1<<20, byte(i)))
	}
	for i := 0; i < 24; i++ {
		if got := testkit.ReadFile(t, b, fmt.Sprintf("/full%d", i)); !bytes.Equal(got, testkit.Pattern(1<<20, byte(i))) {
			t.Fatalf("/full%d differs", i)
		}
	}
	f, err := a.Create("/big")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(testkit.Pattern(1<<20, 1)); err != nil {
		t.Fatal(err)
	}
	srv.kill9()
	for i := 0; ; i++ {
		_, err := f.Write(testkit.Pattern(1<<20, 2))
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil || i == 8 {
			t.Fatalf("write %d MiB past a 4 MiB cache with the server gone: %v, want ENOSPC", i+2, err)
		}
	}
}

// startWriter starts a helper process that writes n bytes to name under a
// write delegation and keeps them in its cache at cacheDir.
func startWriter(t *testing.T, addr, name, cacheDir string, n int) (*exec.Cmd, io.Writer, *bufio.Scanner) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HOARD_TEST_HELPER=1", "HOARD_TEST_SERVER="+addr, "HOARD_TEST_FILE="+name,
		"HOARD_TEST_CACHE="+cacheDir, fmt.Sprintf("HOARD_TEST_WRITE=%d", n))
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("writer: %q", sc.Text())
	}
	return cmd, in, sc
}

// stopped reports whether process pid is stopped by a signal (state T in
// /proc/PID/stat, after the command's parenthesised name).
func stopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}

// A holder that stops answering loses its write delegation after the lease
// and the conflicting opener goes on; when it wakes, its late store is
// refused, fsync says EIO, and the data is kept in lost/ with its path.
// One that dies leaves its data in its cache, kept in lost/ at the next
// start. (The reader has the root cached, so the holder's create goes to
// the server: TestDirDelegationLost is the case of a file made under a
// directory delegation.)
func TestLostLeaseKeepsData(t *testing.T) {
	const lease = 2 * time.Second
	srv := startServer(t, t.TempDir(), "--lease", lease.String())
	b := dial(t, srv.addr, "mem", 64<<20)
	for _, how := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGKILL} {
		t.Run(how.String(), func(t *testing.T) {
			cacheDir := t.TempDir()
			name := "/w-" + strings.Fields(how.String())[0]
			cmd, in, out := startWriter(t, srv.addr, name, cacheDir, 1<<20)
			if how == syscall.SIGKILL {
				// Killed before its cache index holds the dirty data,
				// the writer would leave nothing to keep.
				waitIndexed(t, cacheDir, time.Now())
			}
			cmd.Process.Signal(how)
			// A signal takes effect a moment after it is sent: a holder
			// still running would answer the reader's recall.
			if how == syscall.SIGKILL {
				cmd.Wait()
			} else {
				poll.Wait(t, 5*time.Second, "the writer stopped", func() bool { return stopped(cmd.Process.Pid) })
			}
			start := time.Now()
			if got := testkit.ReadFile(t, b, name); len(got) != 0 {
				t.Fatalf("the reader saw %d bytes the holder never stored", len(got))
			}
			if took := time.Since(start); took > lease+2*time.Second {
				t.Fatalf("the reader waited %v for a silent holder (lease %v)", took, lease)
			}
			if how == syscall.SIGKILL {
				c := dial(t, srv.addr, cacheDir, 64<<20) // the next start keeps it in lost/
				c.Close()
			} else {
				cmd.Process.Signal(syscall.SIGCONT)
				fmt.Fprintln(in, "sync")
				if !out.Scan() || !strings.HasPrefix(out.Text(), "sync:") || !strings.Contains(out.Text(), "input/output error") {
					t.Fatalf("fsync after the lease was lost: %q, want EIO", out.Text())
				}
				t.Logf("the woken holder's fsync: %s", out.Text())
			}
			kept, err := lost.List(cacheDir)
			if err != nil || len(kept) != 1 || kept[0].Path != name || kept[0].Size != 1<<20 {
				t.Fatalf("lost data: %+v %v", kept, err)
			}
			data, _ := os.ReadFile(kept[0].Data)
			if !bytes.Equal(data, testkit.Pattern(1<<20, 9)) {
				t.Fatal("the kept data differs from what was written")
			}
		})
	}
}

// A server restart while a write delegation is out: the holder reclaims it
// during the grace period and its data reaches a client that opens the
// file afterwards. Delegations from before the restart are not trusted.
func TestServerRestartWithDelegations(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, t.TempDir(), 64<<20)
	c := dial(t, srv.addr, "mem", 64<<20)
	v1 := testkit.Pattern(2<<20, 4)
	testkit.WriteFile(t, a, "/r", v1)
	testkit.WriteFile(t, a, "/g", []byte("g1"))
	if got := testkit.ReadFile(t, c, "/g"); string(got) != "g1" {
		t.Fatalf("before the restart: %q", got)
	}
	srv.kill9()
	srv.restart()
	b := dial(t, srv.addr, "mem", 64<<20)
	if got := testkit.ReadFile(t, b, "/r"); !bytes.Equal(got, v1) {
		t.Fatalf("after the restart the reader saw %d bytes, not the holder's %d", len(got), len(v1))
	}
	if a.Client().Stats().Reclaimed < 1 {
		t.Fatal("no delegation was reclaimed")
	}
	testkit.WriteFile(t, b, "/g", []byte("g2"))
	if got := testkit.ReadFile(t, c, "/g"); string(got) != "g2" {
		t.Fatalf("a read delegation from before the restart served %q", got)
	}
}

// A holder's own rename over its delegated, unstored file does not keep
// the delegation from being reclaimed after a server restart: until the
// rename lands, which the grace period holds back, another client may
// open the file and must read those writes.
func TestReclaimDuringOwnRenameOver(t *testing.T) {
	srv := startServer(t, t.TempDir(), "--grace", "2s")
	a := dial(t, srv.addr, t.TempDir(), 64<<20)
	testkit.WriteFile(t, dialCons(t, srv, t.Name()+"-stored", true), "/f3", []byte("three"))
	testkit.WriteFile(t, a, "/f1", []byte("one"))
	srv.kill9()
	renamed := make(chan error, 1)
	go func() { renamed <- a.Rename("/f3", "/f1") }()
	srv.restart()
	poll.Wait(t, 10*time.Second, "a delegation reclaimed", func() bool {
		select {
		case err := <-renamed:
			t.Fatalf("the rename returned (%v) before the delegation on the file it replaces was reclaimed", err)
		default:
		}
		return a.Client().Stats().Reclaimed > 0
	})
	if err := <-renamed; err != nil {
		t.Fatal(err)
	}
	b := dial(t, srv.addr, "mem", 64<<20)
	if got := testkit.ReadFile(t, b, "/f1"); string(got) != "three" {
		t.Fatalf("f1 after the rename: %q", got)
	}
}

// A recall that arrives while the holder is storing waits for that store
// and returns the delegation after; the opener sees every byte. A relay
// on the data channel holds the store on its way until the recall came.
func TestRecallDuringFlush(t *testing.T) {
	dataAddr := freeAddr(t)
	rl := testkit.StartRelay(t, dataAddr)
	srv := startServer(t, t.TempDir(), "--data-listen", dataAddr, "--data-advertise", rl.Addr())
	a := dial(t, srv.addr, t.TempDir(), 64<<20)
	b := dial(t, srv.addr, "mem", 64<<20)
	v := testkit.Pattern(4<<20, 5)
	f, err := a.Create("/m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(v); err != nil {
		t.Fatal(err)
	}
	rl.Pause(true)
	before := a.Client().Stats()
	synced := make(chan error, 1)
	go func() { synced <- f.Sync() }()
	poll.Wait(t, 10*time.Second, "the holder's store on its way", func() bool { return a.Client().Stats().Stores > before.Stores })
	read := make(chan error, 1)
	var got []byte
	go func() {
		var err error
		got, err = testkit.TryRead(b, "/m")
		read <- err
	}()
	poll.Wait(t, 10*time.Second, "the recall at the holder", func() bool { return a.Client().Stats().Recalls > before.Recalls })
	select {
	case err := <-synced:
		t.Fatalf("the store ended (%v) while the relay held it: the test proves nothing", err)
	case err := <-read:
		t.Fatalf("the opener's read ended (%v) while the holder's store was held", err)
	default:
	}
	rl.Pause(false)
	if err := <-read; err != nil || !bytes.Equal(got, v) {
		t.Fatalf("read during the holder's store: %d bytes, %v", len(got), err)
	}
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// Writes go on while the writer's delegation is recalled: the opener sees
// at least every write acknowledged before its open began, and the rest
// after the writer's close.
func TestWriteWhileRecalled(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, t.TempDir(), 64<<20)
	b := dial(t, srv.addr, "mem", 64<<20)
	const block, blocks = 64 << 10, 200
	want := testkit.Pattern(block*blocks, 6)
	f, err := a.Create("/w")
	if err != nil {
		t.Fatal(err)
	}
	var done atomic.Int64
	wrote := make(chan error, 1)
	go func() {
		for i := 0; i < blocks; i++ {
			if _, err := f.WriteAt(want[i*block:(i+1)*block], int64(i*block)); err != nil {
				wrote <- err
				return
			}
			done.Store(int64(i + 1))
			time.Sleep(time.Millisecond)
		}
		wrote <- nil
	}()
	// The open comes once the writer is under way, and before it is done.
	poll.Wait(t, 10*time.Second, "the writer under way", func() bool { return done.Load() >= 10 })
	k := int(done.Load())
	got := testkit.ReadFile(t, b, "/w")
	if k == blocks {
		t.Fatal("the writer was done before the open: the test proves nothing")
	}
	if len(got) < k*block || !bytes.Equal(got[:k*block], want[:k*block]) {
		t.Fatalf("the opener saw %d bytes; %d were written before it opened", len(got), k*block)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testkit.ReadFile(t, b, "/w"); !bytes.Equal(got, want) {
		t.Fatal("after the writer's close the reader does not see every byte")
	}
}

// With the server gone, fsync of data under a write delegation fails with
// EIO and the data stays in the cache; when the server is back (a restart)
// the holder reclaims its delegation and the data reaches other clients.
func TestServerAwayWithWriteBack(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a, err := cellDial(client.Options{Server: srv.addr, CacheDir: t.TempDir(), RPCTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	testkit.WriteFile(t, a, "/wb", []byte("kept through the outage"))
	srv.kill9()
	f, err := a.Open("/wb", os.O_WRONLY, 0) // local, under the delegation
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) && !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("fsync with the server gone: %v, want EIO", err)
	}
	f.Close()
	if a.Client().Stats().DirtyBytes == 0 {
		t.Fatal("the undelivered data left the cache")
	}
	srv.restart()
	b := dial(t, srv.addr, "mem", 16<<20)
	if got, err := testkit.TryRead(b, "/wb"); err != nil || string(got) != "kept through the outage" {
		t.Fatalf("after the server came back: %q %v", got, err)
	}
}

// A client closed while the server is unreachable says that writes under
// its write delegations were not stored, and keeps them in lost/.
func TestCloseReportsUnstored(t *testing.T) {
	srv := startServer(t, t.TempDir())
	cacheDir := t.TempDir()
	a, err := cellDial(client.Options{Server: srv.addr, CacheDir: cacheDir, RPCTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, a, "/unstored", []byte("still here"))
	srv.kill9()
	if err := a.Close(); err == nil || !strings.Contains(err.Error(), "/unstored") {
		t.Fatalf("close of a client with unstored writes: %v", err)
	}
	kept, err := lost.List(cacheDir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/unstored" {
		t.Fatalf("lost: %+v %v", kept, err)
	}
}

// Writes to a file this client removed while they were unstored are gone
// with the file, as on a local disk: a store that finds the file gone
// keeps nothing in lost/ and reports nothing.
func TestRemovedWhileDirty(t *testing.T) {
	srv := startServer(t, t.TempDir())
	cacheDir := t.TempDir()
	a, err := cellDial(client.Options{Server: srv.addr, CacheDir: cacheDir})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	f, err := a.Open("/doomed", os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(bytes.Repeat([]byte("x"), 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := a.Remove("/doomed"); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync of a file removed here: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close of a file removed here: %v", err)
	}
	if kept, err := lost.List(cacheDir); err != nil || len(kept) != 0 {
		t.Fatalf("lost: %+v %v", kept, err)
	}
}

// A client that removes a file whose writes it is storing at that moment
// drops those writes: the store that would reach the server after the
// remove (the data channel is slower here, held by a relay) would fail
// with ESTALE, and must not be taken for a loss. The remove waits for the
// store instead.
func TestRemoveWhileStoring(t *testing.T) {
	dataAddr := freeAddr(t)
	rl := testkit.StartRelay(t, dataAddr)
	srv := startServer(t, t.TempDir(), "--data-listen", dataAddr, "--data-advertise", rl.Addr())
	cache := t.TempDir()
	c, err := cellDial(client.Options{Server: srv.addr, CacheDir: cache, CacheSize: 64 << 20, NoDirDelegations: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.Create("/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(testkit.Pattern(3000, 1)); err != nil {
		t.Fatal(err)
	}
	rl.Pause(true)
	stores := c.Client().Stats().Stores
	synced := make(chan error, 1)
	go func() { synced <- f.Sync() }()
	poll.Wait(t, 10*time.Second, "the store on its way", func() bool { return c.Client().Stats().Stores > stores })
	removed := make(chan error, 1)
	go func() { removed <- c.Remove("/f") }()
	select {
	case err := <-removed:
		t.Errorf("the remove returned (%v) while a store of the file was under way", err)
	case <-time.After(300 * time.Millisecond):
	}
	rl.Pause(false)
	if err := <-synced; err != nil {
		t.Fatalf("sync: %v", err)
	}
	if err := <-removed; err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	f.Close()
	if kept, err := lost.List(cache); err != nil || len(kept) != 0 {
		t.Fatalf("%d writes kept as lost (%v) for a file this client removed", len(kept), err)
	}
}
