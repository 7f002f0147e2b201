package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server/stage"
	"github.com/hoardfs/hoard/vnode"
)

// ctxStream is a Store stream with a client's context.
type ctxStream struct {
	fakeStream
	ctx   context.Context
	reply *pb.StoreReply
}

func (c *ctxStream) Context() context.Context { return c.ctx }
func (c *ctxStream) SendAndClose(r *pb.StoreReply) error {
	c.reply = r
	return nil
}

// stageServer is a server on a fresh store holding file "f" of old
// bytes, with two sessions; dir is the store's directory.
func stageServer(t *testing.T, old []byte) (s *Server, as func(callback.ClientID) context.Context, a, b callback.ClientID, f node.FID, dir string) {
	dir = t.TempDir()
	store, err := vnode.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, _ := store.VolumeByName(node.RootVolume)
	st, _, _, err := store.Create(v.Root, "f", node.TypeFile, node.Attr{Mode: 0o644}, "", true, "")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := store.BeginUpdate(st.FID)
	u.WriteAt(old, 0)
	if _, err := u.Commit(false, time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	s, as, a, b = twoClients(t, Local(store), store.Epoch())
	return s, as, a, b, st.FID, dir
}

func storeAs(t *testing.T, s *Server, ctx context.Context, req *pb.StoreRequest) (*pb.Status, error) {
	t.Helper()
	st := &ctxStream{fakeStream: fakeStream{in: []*pb.StoreRequest{req}}, ctx: ctx}
	if err := s.Store(st); err != nil {
		return nil, err
	}
	return st.reply.Status, nil
}

func content(t *testing.T, s *Server, f node.FID) []byte {
	t.Helper()
	st, err := s.store.GetStatus(f)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, st.Size)
	if st.Size > 0 {
		if _, _, err := s.store.ReadAt(f, p, 0, ""); err != nil && err != io.EOF {
			t.Fatal(err)
		}
	}
	return p
}

// A stage's stores are seen by nobody until the one that publishes it,
// which makes them all, and the truncation the first carried, one
// version; publishing again (a reply lost) makes nothing new.
func TestStagePublishedAtOnce(t *testing.T) {
	old := bytes.Repeat([]byte("old!"), 50000) // 200 kB: a data file
	s, as, a, _, f, _ := stageServer(t, old)
	before, _ := s.store.GetStatus(f)
	piece := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 100000) }
	for i := 0; i < 3; i++ {
		req := &pb.StoreRequest{Fid: pb.FromFID(f), Stage: "s1", Offset: uint64(i * 100000), Data: piece(i), Op: fmt.Sprintf("op%d", i)}
		if i == 0 {
			req.HasTruncate = true
		}
		st, err := storeAs(t, s, as(a), req)
		if err != nil {
			t.Fatal(err)
		}
		if st.DataVersion != before.DataVersion {
			t.Fatalf("store %d of a stage made version %d (was %d)", i, st.DataVersion, before.DataVersion)
		}
		if got := content(t, s, f); !bytes.Equal(got, old) {
			t.Fatalf("after store %d of a stage the file is no longer the old one (%d bytes)", i, len(got))
		}
	}
	pub := &pb.StoreRequest{Fid: pb.FromFID(f), Stage: "s1", Publish: true, Sync: true, Offset: 300000, Data: []byte("end"), Op: "publish1"}
	st, err := storeAs(t, s, as(a), pub)
	if err != nil {
		t.Fatal(err)
	}
	want := append(append(append(piece(0), piece(1)...), piece(2)...), "end"...)
	if got := content(t, s, f); !bytes.Equal(got, want) || st.DataVersion != before.DataVersion+1 {
		t.Fatalf("published: %d bytes at version %d, want %d at %d", len(got), st.DataVersion, len(want), before.DataVersion+1)
	}
	if n := s.stages.Len(); n != 0 {
		t.Fatalf("%d stages open after the publication", n)
	}
	// The same publication again (its reply lost): answered, not made again.
	pub.Data = []byte("XXX")
	st, err = storeAs(t, s, as(a), pub)
	if err != nil || st.DataVersion != before.DataVersion+1 {
		t.Fatalf("publication sent again: %v, version %v", err, st)
	}
	// A publication of a stage nobody began is refused: its writes are gone.
	_, err = storeAs(t, s, as(a), &pb.StoreRequest{Fid: pb.FromFID(f), Stage: "never", Publish: true, Offset: 0, Data: []byte("x"), Op: "publish2"})
	if pb.Errno(err) != syscall.EIO {
		t.Fatalf("publication of an unknown stage: %v, want EIO", err)
	}
	if got := content(t, s, f); !bytes.Equal(got, want) {
		t.Fatal("a refused publication changed the file")
	}
}

// A session keeps at most stage.MaxPerSession stages; one more is
// refused with RESOURCE_EXHAUSTED (EAGAIN), until one is published.
func TestStageBounds(t *testing.T) {
	s, as, a, b, f, _ := stageServer(t, []byte("old"))
	begin := func(id callback.ClientID, name string) error {
		_, err := storeAs(t, s, as(id), &pb.StoreRequest{Fid: pb.FromFID(f), Stage: name, Data: []byte("x")})
		return err
	}
	for i := 0; i < stage.MaxPerSession; i++ {
		if err := begin(a, fmt.Sprint("s", i)); err != nil {
			t.Fatal(err)
		}
	}
	err := begin(a, "one-more")
	if status.Code(err) != codes.ResourceExhausted || pb.Errno(err) != syscall.EAGAIN {
		t.Fatalf("stage %d of a session: %v, want RESOURCE_EXHAUSTED", stage.MaxPerSession+1, err)
	}
	if err := begin(a, "s3"); err != nil {
		t.Fatalf("a store of a stage already begun: %v", err)
	}
	if err := begin(b, "other"); err != nil {
		t.Fatalf("another session's stage: %v", err)
	}
	if _, err := storeAs(t, s, as(a), &pb.StoreRequest{Fid: pb.FromFID(f), Stage: "s0", Publish: true}); err != nil {
		t.Fatal(err)
	}
	if err := begin(a, "one-more"); err != nil {
		t.Fatalf("after a publication: %v", err)
	}
	// The server's bound, over many sessions.
	ids := sessions(s, stage.MaxPerServer/stage.MaxPerSession+1)
	refused := 0
	for _, id := range ids {
		for i := 0; i < stage.MaxPerSession; i++ {
			if err := begin(id, fmt.Sprint("s", i)); status.Code(err) == codes.ResourceExhausted {
				refused++
			} else if err != nil {
				t.Fatal(err)
			}
		}
	}
	if open := s.stages.Len(); open != stage.MaxPerServer || refused == 0 {
		t.Fatalf("%d stages open, %d refused; want at most %d", open, refused, stage.MaxPerServer)
	}
}

// A stage goes with its session: its staging file is removed, and the
// file stays as it was.
func TestStageDroppedAtSessionEnd(t *testing.T) {
	old := []byte("old contents")
	s, as, a, _, f, dir := stageServer(t, old)
	big := bytes.Repeat([]byte("n"), 1<<20) // past inline: a staging file
	if _, err := storeAs(t, s, as(a), &pb.StoreRequest{Fid: pb.FromFID(f), Stage: "s", HasTruncate: true, Data: big}); err != nil {
		t.Fatal(err)
	}
	staging := func() int {
		ents, _ := os.ReadDir(filepath.Join(dir, "staging"))
		return len(ents)
	}
	if staging() == 0 || s.stages.Len() != 1 {
		t.Fatalf("%d staging files, %d stages, want the stage's", staging(), s.stages.Len())
	}
	s.ended(a, s.conns[a], "")
	if n := staging(); n > 0 || s.stages.Len() > 0 {
		t.Fatalf("session ended: %d staging files, %d stages left", n, s.stages.Len())
	}
	if got := content(t, s, f); !bytes.Equal(got, old) {
		t.Fatalf("the file is %q, want the old one", got)
	}
}

// One user's stages are bounded across their sessions, so that a user
// holding the most they may leaves room for others' (a user once held
// every stage of the server, and another's bypassed write failed).
func TestStagesBoundedPerUser(t *testing.T) {
	s, f := newFuzzServer(t)
	ids := sessions(s, stage.MaxPerUser/stage.MaxPerSession+1)
	as := func(id callback.ClientID, user string) context.Context { return asIn(s, id, user) }
	begin := func(id callback.ClientID, user, name string) error {
		_, err := storeAs(t, s, as(id, user), &pb.StoreRequest{Fid: pb.FromFID(f), Stage: name, Data: []byte("x")})
		return err
	}
	held := 0
	for _, id := range ids[:len(ids)-1] {
		for i := range stage.MaxPerSession {
			if err := begin(id, "alice", fmt.Sprint("s", i)); err != nil {
				t.Fatal(err)
			}
			held++
		}
	}
	if held != stage.MaxPerUser {
		t.Fatalf("alice holds %d stages, want %d", held, stage.MaxPerUser)
	}
	err := begin(ids[len(ids)-1], "alice", "one-more")
	if status.Code(err) != codes.ResourceExhausted || pb.Errno(err) != syscall.EAGAIN {
		t.Fatalf("alice's stage past her bound, in a new session: %v", err)
	}
	if err := begin(ids[len(ids)-1], "admin", "theirs"); err != nil {
		t.Fatalf("another user's stage: %v", err)
	}
}
