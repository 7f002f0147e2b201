package integration

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/lograte"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server"
	"github.com/hoardfs/hoard/vnode"
)

// anonRPC is a protocol-level client with no session (the admin's token).
func anonRPC(t *testing.T, addr string) pb.FileServerClient {
	t.Helper()
	return pb.NewFileServerClient(cellGRPC(t, addr))
}

// Sizes the server's disk cannot give a file are refused (EFBIG) before
// anything is published: one such request used to leave a commit that
// failed at every replay, and the server could not start again.
func TestServerRefusesSizesPastItsDisk(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := dial(t, srv.addr, "mem", 16<<20)
	testkit.WriteFile(t, a, "/keep", []byte("kept"))
	testkit.WriteFile(t, a, "/f", []byte("f"))
	// Another client's lookup: the server knows /f (a made it under a
	// directory delegation).
	st, err := dial(t, srv.addr, "mem", 16<<20).Stat("/f")
	if err != nil {
		t.Fatal(err)
	}
	fid := pb.FromFID(st.FID)
	rpc := anonRPC(t, srv.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, size := range []uint64{1 << 44, 1 << 62, 1 << 63, 1<<64 - 1} {
		_, err := rpc.SetAttr(ctx, &pb.SetAttrRequest{Fid: fid, Mask: node.SetSize, Size: size})
		if pb.Errno(err) != syscall.EFBIG {
			t.Errorf("setattr to %d bytes: %v, want EFBIG", size, err)
		}
	}
	stores := []*pb.StoreRequest{
		{Fid: fid, HasSize: true, Size: 1 << 44, Sync: true},
		{Fid: fid, HasTruncate: true, Truncate: 1 << 44, HasSize: true, Size: 1 << 44},
		{Fid: fid, Offset: 1<<44 - 1, Data: []byte("x"), Sync: true},
	}
	for _, req := range stores {
		stream, err := rpc.Store(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(req)
		if _, err := stream.CloseAndRecv(); pb.Errno(err) != syscall.EFBIG {
			t.Errorf("store %v: %v, want EFBIG", req, err)
		}
	}
	a.Close()
	srv.kill9()
	srv.restart()
	b := dial(t, srv.addr, "mem", 16<<20)
	if got := string(testkit.ReadFile(t, b, "/keep")); got != "kept" {
		t.Fatalf("after a restart /keep reads %q", got)
	}
	if got := string(testkit.ReadFile(t, b, "/f")); got != "f" {
		t.Fatalf("after a restart /f reads %q", got)
	}
	testkit.WriteFile(t, b, "/f", []byte("written after"))
	if got := string(testkit.ReadFile(t, b, "/f")); got != "written after" {
		t.Fatalf("/f reads %q", got)
	}
}

// Sessions are bounded, in all and from one address, and so is the name
// a client gives: past a bound a client is refused, saying which, and
// the server serves the others; refused, a thousand names of 1 MiB cost
// it nothing it keeps.
func TestServerBoundsSessions(t *testing.T) {
	srv := startServer(t, t.TempDir(), "--max-sessions-per-peer", "3")
	var cs []*pathfs.FS
	for range 3 {
		c, err := cellDial(client.Options{Server: srv.addr, CacheSize: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	if _, err := cellDial(client.Options{Server: srv.addr, CacheSize: 16 << 20}); err == nil ||
		!strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "--max-sessions-per-peer") {
		t.Fatalf("a fourth client from one address: %v", err)
	}
	testkit.WriteFile(t, cs[1], "/x", []byte("still served"))
	cs[0].Close()
	var in *pathfs.FS
	var err error
	if !poll.Until(10*time.Second, func() bool {
		in, err = cellDial(client.Options{Server: srv.addr, CacheSize: 16 << 20})
		return err == nil
	}) {
		t.Fatalf("no client gets in after one of three left: %v", err)
	}
	defer in.Close()
	cs[1].Close()
	cs[2].Close()

	rpc := anonRPC(t, srv.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := strings.Repeat("n", 1<<20)
	for i := range 1000 {
		stream, err := rpc.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&pb.ClientMsg{Msg: &pb.ClientMsg_Hello{Hello: &pb.Hello{Version: pb.Version, Name: name}}})
		if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("connect %d with a name of 1 MiB: %v, want InvalidArgument", i, err)
		}
	}
	if rss := rssKiB(t, srv.cmd.Process.Pid); rss > 200<<10 {
		t.Fatalf("server RSS %d KiB after refusing 1,000 long names", rss)
	}
	if got := string(testkit.ReadFile(t, dial(t, srv.addr, "mem", 16<<20), "/x")); got != "still served" {
		t.Fatalf("read %q", got)
	}
}

// rssKiB is process pid's resident set.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// A byte flipped in a cache file while no client held the cache is not
// served: the chunk fails its checksum at its first read, is fetched
// again, and counted.
func TestFlippedCacheByteNotServed(t *testing.T) {
	srv := startServer(t, t.TempDir())
	cacheDir := t.TempDir()
	content := testkit.Pattern(3<<20+100, 5)
	local := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(local, content, 0o644); err != nil {
		t.Fatal(err)
	}
	h := func(args ...string) (string, int) {
		return run(t, append(args, "--server", srv.addr, "--cache", cacheDir)...)
	}
	if out, code := h("put", local, "/f"); code != 0 {
		t.Fatalf("put: exit %d: %s", code, out)
	}
	var cached string
	filepath.WalkDir(filepath.Join(cacheDir, "files"), func(p string, d fs.DirEntry, err error) error {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Size() == int64(len(content)) {
			cached = p
		}
		return nil
	})
	if cached == "" {
		t.Fatal("no cache file holds the file put")
	}
	fd, err := os.OpenFile(cached, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fd.WriteAt([]byte{content[2<<20+3] ^ 0x10}, 2<<20+3)
	fd.Close()
	cmd := exec.Command(hoardBin, "cat", "/f", "--server", srv.addr, "--cache", cacheDir)
	out, err := cmd.Output()
	if err != nil || !bytes.Equal(out, content) {
		t.Fatalf("cat after a byte of the cache file flipped: %v, %d bytes, same: %v", err, len(out), bytes.Equal(out, content))
	}
	if st, err := cache.ReadStats(cacheDir); err != nil || st.Corrupt != 1 {
		t.Fatalf("cache stats: %+v %v, want one corrupt chunk", st, err)
	}
}

// A client whose server is gone for good stops within a few seconds, not
// an RPC timeout per file or delegation: what it held unstored is kept in
// lost/, the files it removed here stay at the server, and its log says
// so in a few lines.
func TestCloseWithServerGone(t *testing.T) {
	srv := startServer(t, t.TempDir())
	cacheDir := t.TempDir()
	var logs bytes.Buffer
	lh := lograte.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}), 10*time.Second, 5) // as hoard's commands log
	a, err := cellDial(client.Options{Server: srv.addr, CacheDir: cacheDir, CacheSize: 64 << 20, RPCTimeout: 10 * time.Second, Logger: slog.New(lh)})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	// Stored files under their write delegations, one removed here.
	for i := range 20 {
		f, err := a.Create(fmt.Sprintf("/d/s%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		f.Write([]byte("stored"))
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if err := a.Remove("/d/s00"); err != nil {
		t.Fatal(err)
	}
	// Files written under delegations and not stored yet.
	const unstored = 50
	for i := range unstored {
		testkit.WriteFile(t, a, fmt.Sprintf("/d/u%02d", i), []byte(fmt.Sprintf("unstored %d", i)))
	}
	srv.kill9()
	start := time.Now()
	err = a.Close()
	took := time.Since(start)
	if took > 5*time.Second {
		t.Fatalf("close with the server gone took %v", took)
	}
	if err == nil {
		t.Fatal("close with unstored writes and the server gone said nothing")
	}
	kept, lerr := lost.List(cacheDir)
	if lerr != nil || len(kept) != unstored {
		t.Fatalf("%d files kept in lost/, want %d: %v", len(kept), unstored, lerr)
	}
	lh.Flush()
	if n := strings.Count(logs.String(), "\n"); n > 10 {
		t.Fatalf("%d log lines for one close:\n%s", n, logs.String())
	}
}

// The FIDs one session holds reserved and unused are bounded: past the
// bound Reserve says RESOURCE_EXHAUSTED (the client then creates at the
// server).
func TestReserveBounded(t *testing.T) {
	srv := startServer(t, t.TempDir())
	rc := dialRaw(t, srv.addr)
	vol, err := rc.rpc.GetVolume(rc.ctx, &pb.GetVolumeRequest{Name: "root"})
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for {
		r, err := rc.rpc.Reserve(rc.ctx, &pb.ReserveRequest{Volume: vol.Root.Volume, Count: vnode.MaxReserve, Dir: vol.Root})
		if status.Code(err) == codes.ResourceExhausted {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if got += len(r.Fids); got > server.MaxReservedPerSession {
			t.Fatalf("%d fids reserved by one session, past the bound of %d", got, server.MaxReservedPerSession)
		}
	}
	if got != server.MaxReservedPerSession {
		t.Fatalf("%d fids reserved before the refusal, want %d", got, server.MaxReservedPerSession)
	}
}
