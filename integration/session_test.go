package integration

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
)

// Sessions cannot be forged or borrowed: a request naming a session that
// the server did not make, or made for another connection, is refused;
// a delegation cannot be returned by anyone but its holder, nor reclaimed
// by another client going by the holder's name, while the holder's next
// session, naming its last one, reclaims it. Data-channel requests need a
// live session.
func TestForgedSessionsRefused(t *testing.T) {
	srv := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	as := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, pb.ClientMetadata, token)
	}
	holder := connectRaw(t, anonRPC(t, srv.addr), "holder", "")
	tok := holder.welcome.Session
	root, err := holder.rpc.GetVolume(as(tok), &pb.GetVolumeRequest{Name: "root"})
	if err != nil {
		t.Fatal(err)
	}
	made, err := holder.rpc.Create(as(tok), &pb.CreateRequest{Dir: root.Root, Name: "f", Type: pb.FileType_FILE_TYPE_FILE, Mode: 0o644, Open: true})
	if err != nil || made.Kind != pb.DelegKind_DELEG_WRITE {
		t.Fatalf("create with open: %+v, %v; want a write delegation", made, err)
	}
	f, state := made.Status.Fid, made.State

	other := anonRPC(t, srv.addr)
	epoch := holder.welcome.Epoch
	for _, forged := range []struct{ what, token string }{
		{"the holder's own token, on another connection", tok},
		{"the old form, epoch and id", fmt.Sprintf("%d.%d", epoch, holder.welcome.ClientId)},
		{"a made-up mac", fmt.Sprintf("%d.%d.%d.%s", epoch, holder.welcome.ClientId, holder.welcome.ClientId, strings.Repeat("0", 32))},
	} {
		r, err := other.Return(as(forged.token), &pb.ReturnRequest{Fid: f, State: state})
		if code := status.Code(err); code != codes.Unauthenticated && code != codes.InvalidArgument || r.GetAccepted() {
			t.Errorf("return with %s: %v, %v; want refused", forged.what, r, err)
		}
	}
	if r, err := other.Return(ctx, &pb.ReturnRequest{Fid: f, State: state}); r.GetAccepted() {
		t.Errorf("return with no session accepted: %v", err)
	}

	// The holder's back channel ends; its write delegation waits for it.
	holder.cancel()
	thief := connectRaw(t, other, "holder", "")
	if r, err := thief.rpc.Open(as(thief.welcome.Session), &pb.OpenRequest{Fid: f, Write: true, Reclaim: state}); err == nil {
		t.Fatalf("a client by the holder's name reclaimed its delegation: %v", r)
	}
	again := connectRaw(t, holder.rpc, "holder", tok)
	r, err := again.rpc.Open(as(again.welcome.Session), &pb.OpenRequest{Fid: f, Write: true, Reclaim: state})
	if err != nil || r.Kind != pb.DelegKind_DELEG_WRITE || r.State != state {
		t.Fatalf("the holder's reclaim: %v, %v", r, err)
	}
	store, err := again.rpc.Store(as(again.welcome.Session))
	if err != nil {
		t.Fatal(err)
	}
	store.Send(&pb.StoreRequest{Fid: f, DelegState: state, Data: []byte("mine"), HasSize: true, Size: 4, Sync: true})
	if _, err := store.CloseAndRecv(); err != nil {
		t.Fatalf("the holder's store under its reclaimed delegation: %v", err)
	}

	// The data channel: nothing for a request without a session, the
	// file for the live one.
	fid := f.ToFID()
	for _, c := range []struct {
		session string
		errno   uint32
	}{{"", datapath.ErrSession}, {again.welcome.Session, 0}} {
		conn := dialFrom(t, "127.0.0.1", again.welcome.DataAddr)
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write(datapath.AppendRequest(nil, datapath.Request{Op: datapath.OpFetch, Session: c.session, User: testCell.admin, FID: fid, Length: 4}))
		rep, err := datapath.ReadReply(bufio.NewReader(conn))
		conn.Close()
		if err != nil || rep.Errno != c.errno {
			t.Errorf("data-channel fetch with session %q: %+v, %v; want errno %d", c.session, rep, err, c.errno)
		}
	}
}
