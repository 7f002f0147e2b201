package server

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/principal"
	"github.com/hoardfs/hoard/server/session"
	"github.com/hoardfs/hoard/vnode"
)

// fakeStream carries one Fetch's replies or one Store's requests without a
// network, so the fuzzer reaches the handlers directly.
type fakeStream struct {
	grpc.ServerStream
	in   []*pb.StoreRequest
	sent int
	ctx  context.Context // nil: the admin's
}

func (f *fakeStream) Context() context.Context {
	if f.ctx == nil {
		return as("admin")
	}
	return f.ctx
}
func (f *fakeStream) Send(*pb.FetchReply) error { f.sent++; return nil }
func (f *fakeStream) SendAndClose(*pb.StoreReply) error {
	f.sent++
	return nil
}
func (f *fakeStream) Recv() (*pb.StoreRequest, error) {
	if len(f.in) == 0 {
		return nil, io.EOF
	}
	m := f.in[0]
	f.in = f.in[1:]
	return m, nil
}

// testStore is a fresh vnode store, closed when t ends, with its root
// volume.
func testStore(t testing.TB) (*vnode.Store, node.Volume) {
	store, err := vnode.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, _ := store.VolumeByName(node.RootVolume)
	return store, v
}

func newFuzzServer(t testing.TB) (*Server, node.FID) {
	store, v := testStore(t)
	st, _, _, err := store.Create(v.Root, "f", node.TypeFile, node.Attr{Mode: 0o644}, "", true, "")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := store.BeginUpdate(st.FID)
	u.WriteAt([]byte("hello fuzz"), 0)
	u.Commit(false, st.Mtime, "")
	store.Create(v.Root, "d", node.TypeDir, node.Attr{Mode: 0o755}, "", true, "")
	// Alice may do all but administer the root; others go by its
	// default ACL.
	reg := principal.New()
	alice, err := reg.Create(context.Background(), "alice", uidOf("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetACL(v.Root, access.DefaultACL().Set(alice.ID, access.All&^access.Administer)); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Users, cfg.Principals = namedUsers{reg}, reg
	s := New(Local(store), cfg)
	t.Cleanup(s.Shutdown)
	return s, st.FID
}

// namedUsers takes a token for the name of its user: "admin" is the
// cell's admin, any other name a user with a uid of its own (uidOf).
type namedUsers struct{ reg *principal.Registry }

func (u namedUsers) Identify(token string) (access.Identity, time.Time, error) {
	id, err := u.reg.Identify(context.Background(), "", token, uidOf(token), token == "admin")
	return id, time.Now().Add(time.Hour), err
}

// uidOf is the uid a test user's name gives it.
func uidOf(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return 1000 + h.Sum32()%60000
}

// sessions connects n sessions to s, as Connect would, with back
// channels nobody reads.
func sessions(s *Server, n int) []callback.ClientID {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []callback.ClientID
	for i := range n {
		id := s.cb.Connect(fmt.Sprint("c", i), 0, time.Now())
		s.conns[id] = &conn{out: make(chan *pb.ServerMsg, 64), cancel: func() {}}
		ids = append(ids, id)
	}
	return ids
}

// asIn is ctx for a request of user's in session id.
func asIn(s *Server, id callback.ClientID, user string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs(pb.ClientMetadata, s.key.Make(session.Token{Epoch: s.store.Epoch(), ID: id, Line: id}), pb.UserMetadata, "Bearer "+user))
}

// as is ctx for a request of user's (none: anonymous).
func as(user string) context.Context {
	ctx := context.Background()
	if user == "" {
		return ctx
	}
	return metadata.NewIncomingContext(ctx, metadata.Pairs(pb.UserMetadata, "Bearer "+user))
}

// A fetch cannot make the server send a reply per few bytes: pieces
// smaller than minPiece are taken as minPiece (a fetch of a large sparse
// file in pieces of 7 bytes hung the fuzzer).
func TestFetchPieceFloor(t *testing.T) {
	s, f := newFuzzServer(t)
	if _, err := s.SetAttr(as("admin"), &pb.SetAttrRequest{Fid: pb.FromFID(f), Mask: node.SetSize, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	stream := &fakeStream{}
	if err := s.Fetch(&pb.FetchRequest{Fid: pb.FromFID(f), Length: 1 << 30, Piece: 7}, stream); err != nil {
		t.Fatal(err)
	}
	if want := (1 << 20) / minPiece; stream.sent != want {
		t.Fatalf("%d replies for 1 MiB in pieces of 7 bytes, want %d", stream.sent, want)
	}
}

// FuzzRequests feeds arbitrary bytes, decoded as each request type, to the
// handlers: malformed or out-of-range requests must give errors, never a
// panic, and never a path outside the data directory (paths are built from
// numbers only, and names are checked by the store).
func FuzzRequests(f *testing.F) {
	s, file := newFuzzServer(f)
	root := pb.FromFID(node.FID{Volume: 1, Vnode: 1, Unique: 1})
	fid := pb.FromFID(file)
	seed := func(kind uint8, m proto.Message) {
		b, _ := proto.Marshal(m)
		f.Add(kind, b)
	}
	seed(0, &pb.LookupRequest{Dir: root, Name: "f"})
	seed(0, &pb.LookupRequest{Dir: root, Name: "../../etc"})
	seed(1, &pb.GetStatusRequest{Fids: []*pb.FID{fid, root}})
	seed(2, &pb.ReadDirRequest{Dir: root, MaxEntries: 1 << 31})
	seed(3, &pb.CreateRequest{Dir: root, Name: "n", Type: pb.FileType_FILE_TYPE_SYMLINK, Target: "/x"})
	seed(3, &pb.CreateRequest{Dir: root, Name: "a/b", Type: pb.FileType_FILE_TYPE_FILE})
	seed(4, &pb.LinkRequest{Dir: root, Name: "l", Target: fid})
	seed(5, &pb.RemoveRequest{Dir: root, Name: "d", DirOnly: true})
	seed(6, &pb.RenameRequest{SrcDir: root, SrcName: "f", DstDir: root, DstName: ".."})
	seed(7, &pb.SetAttrRequest{Fid: fid, Mask: 8, Size: 1 << 50})
	seed(8, &pb.FetchRequest{Fid: fid, Offset: 3, Length: 1 << 40, Piece: 7})
	seed(9, &pb.StoreRequest{Fid: fid, Offset: 1 << 43, Data: []byte("x"), HasTruncate: true})
	seed(10, &pb.GetVolumeRequest{Name: "root", Id: 1})
	seed(11, &pb.CreateVolumeRequest{Name: "v/../x"})
	seed(12, &pb.StatFSRequest{Volume: 99})
	seed(13, &pb.OpenRequest{Fid: fid, Write: true})
	seed(14, &pb.CloseRequest{Fid: root})
	seed(15, &pb.ReturnRequest{Fid: fid, State: 1, Readers: 1 << 30})
	seed(17, &pb.ReserveRequest{Volume: 1, Count: 1 << 20})
	seed(18, &pb.CreateReservedRequest{Dir: root, State: 1, Files: []*pb.ReservedFile{{Name: "..", Fid: fid}}})
	seed(19, &pb.GetACLRequest{Fid: fid})
	seed(20, &pb.SetACLRequest{Dir: root, Who: "system:anyuser", Rights: 0xff})
	seed(20+32, &pb.SetACLRequest{Dir: root, Who: "bob", Rights: 3})
	seed(21, &pb.ChangeGroupRequest{Change: pb.ChangeGroupRequest_CHANGE_ADD, Group: "g", Member: "system:anyuser"})
	seed(22, &pb.RevokeTokenRequest{Id: "x"})
	seed(3+64, &pb.CreateRequest{Dir: root, Name: "dev", Type: pb.FileType_FILE_TYPE_CHARDEV, Mode: 0o4755})
	users := []string{"alice", "admin", "", "bob"}
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		// The kind's top bits pick who asks.
		ctx := as(users[kind>>5%4])
		switch kind & 31 % 23 {
		case 0:
			m := &pb.LookupRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Lookup(ctx, m)
			}
		case 1:
			m := &pb.GetStatusRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.GetStatus(ctx, m)
			}
		case 2:
			m := &pb.ReadDirRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.ReadDir(ctx, m)
			}
		case 3:
			m := &pb.CreateRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Create(ctx, m)
			}
		case 4:
			m := &pb.LinkRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Link(ctx, m)
			}
		case 5:
			m := &pb.RemoveRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Remove(ctx, m)
			}
		case 6:
			m := &pb.RenameRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Rename(ctx, m)
			}
		case 7:
			m := &pb.SetAttrRequest{}
			if proto.Unmarshal(data, m) == nil && m.Size < 1<<30 {
				s.SetAttr(ctx, m)
			}
		case 8:
			m := &pb.FetchRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Fetch(m, &fakeStream{ctx: ctx})
			}
		case 9:
			m := &pb.StoreRequest{}
			if proto.Unmarshal(data, m) == nil && m.Offset < 1<<30 && m.Size < 1<<30 {
				s.Store(&fakeStream{in: []*pb.StoreRequest{m}, ctx: ctx})
			}
		case 10:
			m := &pb.GetVolumeRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.GetVolume(ctx, m)
			}
		case 11:
			m := &pb.CreateVolumeRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.CreateVolume(ctx, m)
			}
		case 12:
			m := &pb.StatFSRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.StatFS(ctx, m)
			}
		case 13:
			m := &pb.OpenRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Open(ctx, m)
			}
		case 14:
			m := &pb.CloseRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Close(ctx, m)
			}
		case 15:
			m := &pb.ReturnRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Return(ctx, m)
			}
		case 16:
			m := &pb.RenewRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Renew(ctx, m)
			}
		case 17:
			m := &pb.ReserveRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.Reserve(ctx, m)
			}
		case 18:
			m := &pb.CreateReservedRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.CreateReserved(ctx, m)
			}
		case 19:
			m := &pb.GetACLRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.GetACL(ctx, m)
			}
		case 20:
			m := &pb.SetACLRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.SetACL(ctx, m)
			}
		case 21:
			m := &pb.ChangeGroupRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.ChangeGroup(ctx, m)
			}
		case 22:
			m := &pb.RevokeTokenRequest{}
			if proto.Unmarshal(data, m) == nil {
				s.RevokeToken(ctx, m)
			}
		}
	})
}
