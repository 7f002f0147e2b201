package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// A server whose disk fills up answers ENOSPC, commits no partial file,
// and keeps serving what it has.
func TestServerDiskFull(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("SKIP: mounting a small tmpfs for the server's data needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("SKIP: cannot mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	srv := startServer(t, filepath.Join(dir, "data"))
	a := dial(t, srv.addr, "mem", 64<<20)
	b := dial(t, srv.addr, "mem", 64<<20)
	small := testkit.Pattern(1<<20, 1)
	testkit.WriteFile(t, a, "/small", small)
	f, err := a.Create("/huge")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(testkit.Pattern(20<<20, 2))
	// Under a write delegation Close leaves the data to the flusher; fsync
	// is what makes it durable, and what hears that it cannot be.
	err = f.Sync()
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync of a file larger than the disk: %v, want ENOSPC", err)
	}
	if !strings.Contains(err.Error(), "no space") {
		t.Fatalf("the error does not say the disk is full: %v", err)
	}
	st, err := b.Stat("/huge")
	if err != nil || st.Size != 0 {
		t.Fatalf("a partial file was committed: %+v %v", st, err)
	}
	if got := testkit.ReadFile(t, b, "/small"); !bytes.Equal(got, small) {
		t.Fatal("existing data damaged by the full disk")
	}
	// Overwriting in place must not leave a torn file either.
	f, _ = a.Open("/small", os.O_WRONLY, 0)
	f.WriteAt(testkit.Pattern(30<<20, 3), 512<<10)
	if err := f.Sync(); err == nil {
		t.Fatal("a store that cannot fit succeeded")
	}
	f.Close()
	if got := testkit.ReadFile(t, b, "/small"); !bytes.Equal(got, small) {
		t.Fatal("a failed store changed the file")
	}
	// And the server still works once space is back.
	if err := a.Remove("/huge"); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, a, "/after", []byte("fine"))
}

// The server itself refuses bad names and malformed requests, whatever the
// client sends.
func TestServerRefusesBadRequests(t *testing.T) {
	srv := startServer(t, t.TempDir())
	rpc := pb.NewFileServerClient(cellGRPC(t, srv.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vol, err := rpc.GetVolume(ctx, &pb.GetVolumeRequest{Name: "root"})
	if err != nil {
		t.Fatal(err)
	}
	root := vol.Root
	for _, name := range []string{"", ".", "..", "a/b", "/", "a\x00b", strings.Repeat("x", 256), "../../../etc/passwd"} {
		_, err := rpc.Create(ctx, &pb.CreateRequest{Dir: root, Name: name, Type: pb.FileType_FILE_TYPE_FILE})
		if err == nil {
			t.Errorf("server created %q", name)
			continue
		}
		if e := pb.Errno(err); e != syscall.EINVAL && e != syscall.ENAMETOOLONG {
			t.Errorf("create %q: errno %v (%v)", name, e, err)
		}
	}
	bad := []struct {
		what string
		call func() error
		want syscall.Errno
	}{
		{"lookup without a dir", func() error { _, err := rpc.Lookup(ctx, &pb.LookupRequest{Name: "x"}); return err }, syscall.EINVAL},
		{"lookup in a missing volume", func() error {
			_, err := rpc.Lookup(ctx, &pb.LookupRequest{Dir: &pb.FID{Volume: 99, Vnode: 1, Unique: 1}, Name: "x"})
			return err
		}, syscall.ENOENT},
		{"stale fid", func() error {
			_, err := rpc.Lookup(ctx, &pb.LookupRequest{Dir: &pb.FID{Volume: root.Volume, Vnode: 1, Unique: 77}, Name: "x"})
			return err
		}, syscall.ESTALE},
		{"create of unknown type", func() error {
			_, err := rpc.Create(ctx, &pb.CreateRequest{Dir: root, Name: "x", Type: 42})
			return err
		}, syscall.EINVAL},
		{"setattr with no mask", func() error { _, err := rpc.SetAttr(ctx, &pb.SetAttrRequest{Fid: root}); return err }, syscall.EINVAL},
		{"open of no fid", func() error { _, err := rpc.Open(ctx, &pb.OpenRequest{}); return err }, syscall.EINVAL},
		{"return with absurd opens", func() error {
			_, err := rpc.Return(ctx, &pb.ReturnRequest{Fid: root, Readers: 1 << 30})
			return err
		}, syscall.EINVAL},
		{"bulk status of nothing", func() error { _, err := rpc.GetStatus(ctx, &pb.GetStatusRequest{}); return err }, syscall.EINVAL},
		{"volume by name and id", func() error {
			_, err := rpc.GetVolume(ctx, &pb.GetVolumeRequest{Name: "root", Id: 1})
			return err
		}, syscall.EINVAL},
		{"store to a directory", func() error {
			s, err := rpc.Store(ctx)
			if err != nil {
				return err
			}
			s.Send(&pb.StoreRequest{Fid: root, Data: []byte("x")})
			_, err = s.CloseAndRecv()
			return err
		}, syscall.EISDIR},
	}
	for _, b := range bad {
		err := b.call()
		if got := pb.Errno(err); got != b.want {
			t.Errorf("%s: errno %v (%v), want %v", b.what, got, err, b.want)
		}
	}
	// A session the server did not make is refused, not trusted.
	md := metadataCtx(ctx, "999.1.1."+strings.Repeat("0", 32))
	if _, err := rpc.Lookup(md, &pb.LookupRequest{Dir: root, Name: "x"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("forged session: %v, want Unauthenticated", err)
	}
}

func metadataCtx(ctx context.Context, session string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, pb.ClientMetadata, session)
}

// A server that is down for a moment is waited for; one that stays down
// makes Close fail with EIO, and the writes are kept, not dropped. (Close
// stores without delegations; under a write delegation it leaves the data
// to the flusher: TestServerAwayWithWriteBack.)
func TestServerAwayDuringClose(t *testing.T) {
	srv := startServer(t, t.TempDir())
	cacheDir := t.TempDir()
	a, err := cellDial(client.Options{Server: srv.addr, CacheDir: cacheDir, CacheSize: 16 << 20, RPCTimeout: 3 * time.Second, NoDelegations: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Down for a moment: Close waits and succeeds. The server comes back
	// once the close's store is on its way.
	f, _ := a.Create("/blip")
	f.Write([]byte("survives a restart"))
	srv.kill9()
	stores := a.Client().Stats().Stores
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	poll.Wait(t, 10*time.Second, "the close's store on its way", func() bool { return a.Client().Stats().Stores > stores })
	srv.restart()
	if err := <-closed; err != nil {
		t.Fatalf("close across a short outage: %v", err)
	}
	if got := testkit.ReadFile(t, a, "/blip"); string(got) != "survives a restart" {
		t.Fatalf("read %q", got)
	}
	// Down for good: EIO after the timeout, data kept under lost/. A
	// flush is under way when the file is closed (as when a forked child
	// closes a copy of the descriptor): both report the loss.
	g, _ := a.Create("/doomed")
	g.Write([]byte("precious bytes"))
	srv.kill9()
	start := time.Now()
	stores = a.Client().Stats().Stores
	flushed := make(chan error, 1)
	go func() { flushed <- g.Flush() }()
	poll.Wait(t, 10*time.Second, "the flush's store on its way", func() bool { return a.Client().Stats().Stores > stores })
	err = g.Close()
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("close with the server gone: %v, want EIO", err)
	}
	if err := <-flushed; !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush with the server gone: %v, want EIO", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("close took %v with a 3s RPC timeout", took)
	}
	kept, err := lost.List(cacheDir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/doomed" {
		t.Fatalf("lost writes: %+v %v", kept, err)
	}
	if b, _ := os.ReadFile(kept[0].Data); !bytes.Equal(b, []byte("precious bytes")) {
		t.Fatalf("kept data %q", b)
	}
	out, code := run(t, "cache", "lost", "--cache", cacheDir)
	if code != 0 || !strings.Contains(out, "/doomed") {
		t.Fatalf("hoard cache lost: %d %q", code, out)
	}
}

// A server run without the data channel still serves everything over
// gRPC (the client negotiates from the Welcome), and the real data channel
// answers a malformed request with an error and closes, serving on.
func TestDataChannel(t *testing.T) {
	plain := startServer(t, t.TempDir(), "--data-listen", "none")
	if strings.Contains(plain.logs.String(), "data channel") {
		t.Fatalf("--data-listen none still opened a channel: %s", plain.logs)
	}
	a := dial(t, plain.addr, t.TempDir(), 16<<20)
	b := dial(t, plain.addr, t.TempDir(), 16<<20)
	content := testkit.Pattern(1<<20, 5)
	testkit.WriteFile(t, a, "/f", content)
	if got := testkit.ReadFile(t, b, "/f"); !bytes.Equal(got, content) {
		t.Fatal("read over gRPC differs")
	}

	srv := startServer(t, t.TempDir())
	m := regexp.MustCompile(`data channel ([^ ,)]+)`).FindStringSubmatch(srv.logs.String())
	if m == nil {
		t.Fatalf("no data channel advertised: %s", srv.logs)
	}
	conn := dialFrom(t, "127.0.0.1", m[1])
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	conn.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	rep, err := datapath.ReadReply(bufio.NewReader(conn))
	if err != nil || rep.Errno != datapath.ErrProtocol {
		t.Fatalf("malformed request: %+v %v", rep, err)
	}
	c := dial(t, srv.addr, t.TempDir(), 16<<20)
	testkit.WriteFile(t, c, "/g", content)
	d := dial(t, srv.addr, t.TempDir(), 16<<20)
	if got := testkit.ReadFile(t, d, "/g"); !bytes.Equal(got, content) {
		t.Fatal("read over the data channel differs")
	}
}

// Faults on the data channel, through a relay the server advertises: a
// connection cut mid-chunk, a byte corrupted on its way down (a fetch) or
// up (a store), a channel that refuses every connection. The application
// gets the right bytes every time, and the server stores the right bytes.
func TestDataChannelFaults(t *testing.T) {
	content := testkit.Pattern(6<<20, 7)
	for _, fault := range []testkit.Fault{testkit.FaultCut, testkit.FaultFlipDown, testkit.FaultFlipUp, testkit.FaultRefuse} {
		t.Run(string(fault), func(t *testing.T) {
			dataAddr := freeAddr(t)
			rl := testkit.StartFaultyRelay(t, dataAddr, fault)
			srv := startServer(t, t.TempDir(), "--data-listen", dataAddr, "--data-advertise", rl.Addr())
			if !strings.Contains(srv.logs.String(), "advertised as "+rl.Addr()) {
				t.Fatalf("relay not advertised: %s", srv.logs)
			}
			w := dial(t, srv.addr, "mem", 64<<20)
			testkit.WriteFile(t, w, "/f", content)
			r := dial(t, srv.addr, t.TempDir(), 64<<20)
			if got := testkit.ReadFile(t, r, "/f"); !bytes.Equal(got, content) {
				t.Fatal("read through the faulty channel differs")
			}
			// What the server holds, read over gRPC only.
			plain, err := cellDial(client.Options{Server: srv.addr, NoDataChannel: true, DialTimeout: 5 * time.Second, RPCTimeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			if got := testkit.ReadFile(t, plain, "/f"); !bytes.Equal(got, content) {
				t.Fatal("the server holds different bytes")
			}
			if rl.Faults() == 0 {
				t.Fatalf("the relay never struck (%d connections)", rl.Conns())
			}
		})
	}
}
