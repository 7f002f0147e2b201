package datachan

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/vnode"
)

// tcpPair is a connected pair of loopback TCP connections with small
// buffers, so that a sender blocks soon when the other end does not read.
func tcpPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		got <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := (<-got).(*net.TCPConn)
	client = c.(*net.TCPConn)
	sc.SetWriteBuffer(64 << 10)
	client.SetReadBuffer(64 << 10)
	t.Cleanup(func() { sc.Close(); client.Close() })
	return sc, client
}

// arrived waits until bytes sent to c have reached it, reading none: the
// send to c is under way.
func arrived(t *testing.T, c *net.TCPConn) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	err = raw.Read(func(fd uintptr) bool {
		n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		return err != nil || n > 0
	})
	if err != nil {
		t.Fatalf("nothing sent reached the client: %v", err)
	}
}

// storeFetch is a fetch of a file of a vnode store, as a file server
// would begin it, without a promise.
type storeFetch struct {
	st *vnode.Store
	f  node.FID
}

func (s storeFetch) Status(st node.Status) *pb.Status { return pb.FromStatus(st, 0) }

func (s storeFetch) ReadAt(p []byte, off int64) (int, node.Status, error) {
	return s.st.ReadAt(s.f, p, off)
}

// pinning is a channel sending from the files of a fresh vnode store,
// that store, and its root directory.
func pinning(t *testing.T) (*channel, *vnode.Store, node.FID) {
	st, err := vnode.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	v, err := st.VolumeByName(node.RootVolume)
	if err != nil {
		t.Fatal(err)
	}
	return &channel{cfg: Config{Files: st, Counts: &Counts{}}}, st, v.Root
}

// sending sends the reply to a fetch of f on sc, and says how the send
// ended.
func sending(ch *channel, sc net.Conn, f storeFetch, n int) <-chan error {
	sent := make(chan error, 1)
	go func() {
		sc.SetWriteDeadline(time.Now().Add(time.Minute))
		req := datapath.Request{Op: datapath.OpFetch, FID: f.f, Offset: 0, Length: uint64(n)}
		_, werr, err := ch.sendPinned(sc, f, req)
		if err == nil {
			err = werr
		}
		sent <- err
	}()
	return sent
}

func storeFile(t *testing.T, st *vnode.Store, dir node.FID, name string, data []byte) node.FID {
	t.Helper()
	s, _, _, err := st.Create(dir, name, node.TypeFile, node.Attr{Mode: 0o644}, "", true, "")
	if err != nil {
		t.Fatal(err)
	}
	commit(t, st, s.FID, data)
	return s.FID
}

func commit(t *testing.T, st *vnode.Store, f node.FID, data []byte) node.Status {
	u, err := st.BeginUpdate(f)
	if err != nil {
		t.Error(err)
		return node.Status{}
	}
	u.WriteAt(data, 0)
	s, err := u.Commit(true, time.Time{}, "")
	if err != nil {
		t.Error(err)
	}
	return s
}

// A data-channel fetch whose client does not read its socket holds up no
// commit: not to another file of the same lock shard, not to the file
// itself. Its client, reading at last, gets the whole version it was
// answered with, though the file was replaced meanwhile.
func TestFetchSendHoldsNoLock(t *testing.T) {
	ch, st, root := pinning(t)
	old := bytes.Repeat([]byte("old bytes "), 800_000) // 8 MB: far past the socket buffers
	slow := storeFile(t, st, root, "slow", old)
	var other node.FID
	for i := 0; other.IsZero(); i++ {
		if i > 5000 {
			t.Fatal("no file in the slow file's shard")
		}
		s, _, _, err := st.Create(root, fmt.Sprintf("f%d", i), node.TypeFile, node.Attr{Mode: 0o644}, "", true, "")
		if err != nil {
			t.Fatal(err)
		}
		if st.Shard(s.FID) == st.Shard(slow) {
			other = s.FID
		}
	}

	sc, cc := tcpPair(t)
	sent := sending(ch, sc, storeFetch{st, slow}, len(old))
	// Under way, the send cannot end: its 8 MB are far past the buffers.
	arrived(t, cc)
	select {
	case err := <-sent:
		t.Fatalf("the send ended though nobody reads: %v", err)
	default:
	}

	for _, c := range []struct {
		what string
		f    node.FID
		data []byte
	}{
		{"another file of the shard", other, bytes.Repeat([]byte{'o'}, 1<<20)},
		{"the file being sent, replaced", slow, bytes.Repeat([]byte("NEW BYTES "), 900_000)},
	} {
		done := make(chan struct{})
		go func() { commit(t, st, c.f, c.data); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("a commit to %s waited for a reader that does not read", c.what)
		}
		select {
		case err := <-sent:
			t.Fatalf("the send ended before its client read (%v): the test proves nothing", err)
		default:
		}
	}

	// The client reads at last: header, the old version whole, checksum.
	cc.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(cc)
	rep, err := datapath.ReadReply(br)
	if err != nil || rep.Errno != 0 {
		t.Fatalf("reply: %+v, %v", rep, err)
	}
	var ps pb.Status
	if err := proto.Unmarshal(rep.Status, &ps); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, rep.Length)
	if _, err := io.ReadFull(br, data); err != nil {
		t.Fatal(err)
	}
	crc, err := datapath.ReadCRC(br)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, old) || crc != datapath.Checksum(0, data) {
		t.Fatalf("got %d bytes (crc ok %v), not the %d of the version answered", len(data), crc == datapath.Checksum(0, data), len(old))
	}
	if cur, _ := st.GetStatus(slow); ps.DataVersion >= cur.DataVersion {
		t.Fatalf("answered version %d, current %d: the send was not of the old version", ps.DataVersion, cur.DataVersion)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

// A fetch whose bytes a commit writes over in place while they are being
// sent never reaches its client whole: the connection is cut, and the
// client fetches again.
func TestFetchSpoiledInPlaceIsCut(t *testing.T) {
	ch, st, root := pinning(t)
	data := bytes.Repeat([]byte("0123456789"), 800_000)
	f := storeFile(t, st, root, "f", data)

	sc, cc := tcpPair(t)
	sent := sending(ch, sc, storeFetch{st, f}, len(data))
	arrived(t, cc)
	// A small write at the end, which the send has not reached: copied
	// into the data file in place.
	u, _ := st.BeginUpdate(f)
	u.WriteAt([]byte("written over"), int64(len(data))-100)
	done := make(chan struct{})
	go func() { u.Commit(true, time.Time{}, ""); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("an in-place commit waited for a reader that does not read")
	}
	go io.Copy(io.Discard, cc)
	select {
	case err := <-sent:
		if err != errSpoiled {
			t.Fatalf("send ended with %v, want the connection cut (%v)", err, errSpoiled)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the send did not end")
	}
}
