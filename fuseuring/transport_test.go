package fuseuring

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{"0": {0}, "0-3": {0, 1, 2, 3}, "0-1,4,6-7": {0, 1, 4, 6, 7}} {
		got, err := parseCPUList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "0-"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) took it", bad)
		}
	}
}

// ringMount mounts a loopback of a fresh directory over io_uring, or skips
// saying why this machine cannot. node, when not nil, makes the loopback's
// nodes.
func ringMount(t *testing.T, node func(*fs.LoopbackRoot) fs.InodeEmbedder) (mnt, under string, tr *Transport) {
	t.Helper()
	if os.Geteuid() != 0 {
		skip(t, "FUSE over io_uring here mounts directly, which needs root")
	}
	wasOn, err := Enable()
	if err != nil {
		skip(t, err.Error())
	}
	if !wasOn {
		t.Cleanup(func() { Disable() })
	}
	if err := Check(); err != nil {
		skip(t, err.Error())
	}
	under, mnt = t.TempDir(), t.TempDir()
	var st syscall.Stat_t
	if err := syscall.Stat(under, &st); err != nil {
		t.Fatal(err)
	}
	lr := &fs.LoopbackRoot{Path: under, Dev: uint64(st.Dev)}
	var root fs.InodeEmbedder = &fs.LoopbackNode{RootData: lr}
	if node != nil {
		root = node(lr)
		lr.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder { return node(r) }
	}
	lr.RootNode = root
	opts := &fuse.MountOptions{FsName: "ringtest", Name: "ringtest", MaxWrite: 1 << 20}
	server, tr, err := Mount(mnt, fs.NewNodeFS(root, &fs.Options{}), opts, Config{PerCPU: 2})
	if server == nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Unmount(mnt); err != nil {
			t.Error(err)
		}
		server.Wait()
		if tr != nil {
			tr.Wait()
		}
	})
	if err != nil {
		t.Fatalf("rings not started: %v", err)
	}
	return mnt, under, tr
}

func skip(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("HOARD_REQUIRE_FUSE") != "" {
		t.Fatal(why)
	}
	t.Skip("SKIP: " + why)
}

// TestRingServesFileOps runs the usual operations through a loopback over
// the rings and checks both what they return and that the rings, not
// /dev/fuse, answered them.
func TestRingServesFileOps(t *testing.T) {
	mnt, under, tr := ringMount(t, nil)
	data := bytes.Repeat([]byte("hoard-ring "), 300_000) // 3.3 MB: several 1 MiB writes
	p := filepath.Join(mnt, "d", "f")
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(under, "d", "f"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("under the mount: %d bytes, %v; want %d", len(got), err, len(data))
	}
	got, err = os.ReadFile(p)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes, %v; want %d", len(got), err, len(data))
	}
	if err := os.Rename(p, filepath.Join(mnt, "d", "g")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("g", filepath.Join(mnt, "d", "l")); err != nil {
		t.Fatal(err)
	}
	if dest, err := os.Readlink(filepath.Join(mnt, "d", "l")); err != nil || dest != "g" {
		t.Fatalf("readlink: %q, %v", dest, err)
	}
	names, err := os.ReadDir(filepath.Join(mnt, "d"))
	if err != nil || len(names) != 2 || names[0].Name() != "g" || names[1].Name() != "l" {
		t.Fatalf("readdir: %v, %v", names, err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "d", "f")); !os.IsNotExist(err) {
		t.Fatalf("renamed-away name: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(mnt, "d")); err != nil {
		t.Fatal(err)
	}
	if n := tr.Served(); n < 10 {
		t.Fatalf("the rings answered %d requests", n)
	}
	t.Logf("the rings answered %d requests on %d queues", tr.Served(), tr.Queues())
	if tr.Queues() < 1 {
		t.Fatalf("%d queues", tr.Queues())
	}
}

// TestRingNoPoll: the kernel knows from the mount on that the file system
// does not poll, so a poll (or the Go runtime's epoll registration of a
// file it opens) of a file on the mount sends no request. One that did,
// from the daemon's own process during a garbage collection, waited for
// an answer the stopped daemon could not give: a deadlock.
func TestRingNoPoll(t *testing.T) {
	mnt, under, tr := ringMount(t, nil)
	if err := os.WriteFile(filepath.Join(under, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(filepath.Join(mnt, "f"), unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	before := tr.Served()
	if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0); err != nil {
		t.Fatal(err)
	}
	if n := tr.Served() - before; n != 0 {
		t.Fatalf("a poll of a file on the mount sent %d requests, want none", n)
	}
}

// waitingNode answers a getxattr of "user.wait" only when the kernel
// interrupts it, or after 3 s; entered is closed when it has the request.
type waitingNode struct {
	fs.LoopbackNode
	entered, cancelled chan struct{}
}

func (n *waitingNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr != "user.wait" {
		return n.LoopbackNode.Getxattr(ctx, attr, dest)
	}
	close(n.entered)
	select {
	case <-ctx.Done():
		close(n.cancelled)
		return 0, syscall.EINTR
	case <-time.After(3 * time.Second):
		return 0, syscall.ENODATA
	}
}

// TestRingRequestInterrupted: a signal to a process waiting on a request
// served on a ring reaches the request (the kernel's INTERRUPT comes on
// /dev/fuse), and the call returns EINTR at once. The signals start once
// the daemon has the request: a ring's kernel side (dev_uring.c, 6.18)
// does not pass on a signal that came before it handed the request over,
// as /dev/fuse's read does.
func TestRingRequestInterrupted(t *testing.T) {
	entered, cancelled := make(chan struct{}), make(chan struct{})
	mnt, _, _ := ringMount(t, func(r *fs.LoopbackRoot) fs.InodeEmbedder {
		return &waitingNode{LoopbackNode: fs.LoopbackNode{RootData: r}, entered: entered, cancelled: cancelled}
	})
	tid := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		_, err := unix.Getxattr(mnt, "user.wait", make([]byte, 16))
		done <- err
	}()
	id := <-tid
	<-entered
	start := time.Now()
	var err error
	for waiting := true; waiting; {
		// SIGURG: the Go runtime's own, which it ignores as a signal.
		unix.Tgkill(os.Getpid(), id, unix.SIGURG)
		select {
		case err = <-done:
			waiting = false
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Not interrupted, the handler answers after 3 s.
	if took := time.Since(start); err != unix.EINTR || took > time.Second {
		t.Fatalf("getxattr returned %v after %v; want EINTR at once", err, took)
	}
	select {
	case <-cancelled:
	default:
		t.Fatal("the handler was not cancelled")
	}
}

func TestQueueThreads(t *testing.T) {
	seq := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = i
		}
		return s
	}
	total := func(m map[int]int) (n int) {
		for _, v := range m {
			n += v
		}
		return n
	}
	// This machine's shape: every possible CPU online.
	if got := queueThreads(seq(2), seq(2), 8); got[0] != 8 || got[1] != 8 {
		t.Fatalf("2 CPUs: %v", got)
	}
	// A VM that may hot-plug 240 CPUs and has 4: one thread for each
	// absent one, the asked-for count for the others.
	got := queueThreads(seq(240), seq(4), 8)
	if got[0] != 8 || got[3] != 8 || got[4] != 1 || got[239] != 1 || len(got) != 240 {
		t.Fatalf("240 possible, 4 online: %v", got)
	}
	// Many CPUs: the total stays near the bound, and no queue goes without.
	got = queueThreads(seq(128), seq(128), 8)
	if n := total(got); n > maxThreads+128 || got[127] < 1 {
		t.Fatalf("128 CPUs: %d threads", n)
	}
	if n := total(queueThreads(seq(1024), seq(1024), 8)); n != 1024 {
		t.Fatalf("1024 CPUs: %d threads, want one each", n)
	}
}
