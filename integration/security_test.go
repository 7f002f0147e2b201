package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// The attacks of docs/security.md: clients with no token, or with one
// that is expired, revoked, forged or tampered with, and users reaching
// for what is another's. Every refusal is checked, and that nothing on
// the server changed.

// issue makes a token of the tests' cell for user.
func issue(t *testing.T, user string, uid int, extra ...string) string {
	t.Helper()
	args := append([]string{"token", "issue", "--cell", testCell.dir, "--user", user, "--uid", fmt.Sprint(uid)}, extra...)
	out, err := exec.Command(hoardBin, args...).Output()
	if err != nil {
		t.Fatalf("hoard %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// dialAs connects a library client that acts for the user of token,
// with no delegations: every change reaches the server before it returns.
func dialAs(t *testing.T, addr, token string) *pathfs.FS {
	t.Helper()
	c, err := cellDial(client.Options{Server: addr, Token: token, CacheSize: 16 << 20, DialTimeout: 5 * time.Second, RPCTimeout: 10 * time.Second,
		NoDelegations: true, NoDirDelegations: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// secureWorld is a server with two users: bob's private directory holds
// a secret, alice has a directory of her own, /pub is readable by every
// user.
type secureWorld struct {
	srv                      *serverProc
	admin, alice, bob        *pathfs.FS
	aliceTok, bobTok         string
	root, bobDir, secret     node.FID
	aliceDir, pubDir, pubDoc node.FID
}

func newSecureWorld(t *testing.T) *secureWorld {
	t.Helper()
	w := &secureWorld{srv: startServer(t, t.TempDir())}
	w.aliceTok, w.bobTok = issue(t, "alice", 1001), issue(t, "bob", 1002)
	w.admin = dialAs(t, w.srv.addr, testCell.admin)
	w.alice, w.bob = dialAs(t, w.srv.addr, w.aliceTok), dialAs(t, w.srv.addr, w.bobTok)
	for _, d := range []struct{ dir, who string }{{"/bob", "bob"}, {"/alice", "alice"}} {
		if err := w.admin.Mkdir(d.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mustACL(t, w.admin, d.dir, d.who, access.All)
		mustACL(t, w.admin, d.dir, access.AuthUser, 0)
	}
	if err := w.admin.Mkdir("/pub", 0o755); err != nil {
		t.Fatal(err)
	}
	writeAs(t, w.bob, "/bob/secret", "bob's secret")
	writeAs(t, w.admin, "/pub/doc", "for everyone")
	w.root, w.bobDir, w.secret = fidOf(t, w.admin, "/"), fidOf(t, w.admin, "/bob"), fidOf(t, w.admin, "/bob/secret")
	w.aliceDir, w.pubDir, w.pubDoc = fidOf(t, w.admin, "/alice"), fidOf(t, w.admin, "/pub"), fidOf(t, w.admin, "/pub/doc")
	return w
}

func mustACL(t *testing.T, c *pathfs.FS, dir, who string, r access.Rights) {
	t.Helper()
	if _, err := c.Admin().SetACL(dir, who, r); err != nil {
		t.Fatal(err)
	}
}

func writeAs(t *testing.T, c *pathfs.FS, name, data string) {
	t.Helper()
	f, err := c.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func fidOf(t *testing.T, c *pathfs.FS, name string) node.FID {
	t.Helper()
	st, err := c.Lstat(name)
	if err != nil {
		t.Fatal(err)
	}
	return st.FID
}

// snapshot is everything a refused request must leave as it was: every
// file's status and bytes, every directory's ACL, the groups, the volumes.
func snapshot(t *testing.T, addr string) string {
	t.Helper()
	c := dialAs(t, addr, testCell.admin)
	defer c.Close()
	var b strings.Builder
	var walk func(dir string)
	walk = func(dir string) {
		a, err := c.Admin().GetACL(dir)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "acl %s %v\n", dir, a.Entries)
		ents, err := c.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			p := path.Join(dir, e.Name)
			st, err := c.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %v %o %d:%d %d dv%d nlink%d\n", p, st.Type, st.Mode, st.UID, st.GID, st.Size, st.DataVersion, st.Nlink)
			switch st.Type {
			case node.TypeDir:
				walk(p)
			case node.TypeFile:
				data := testkit.ReadFile(t, c, p)
				fmt.Fprintf(&b, "  %x\n", sha256.Sum256(data))
			}
		}
	}
	walk("/")
	gs, _, err := c.Admin().Groups()
	if err != nil {
		t.Fatal(err)
	}
	vs, err := c.Admin().Volumes()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "groups %v\nvolumes %d\n", gs, len(vs))
	return b.String()
}

// probe is a bare gRPC client of the server: it sends what it likes,
// with whatever token it has.
type probe struct {
	rpc   pb.FileServerClient
	token string
}

func newProbe(t *testing.T, addr string, tlsc *tls.Config, token string) *probe {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &probe{rpc: pb.NewFileServerClient(cc), token: token}
}

func cellTLS(t *testing.T) *tls.Config {
	t.Helper()
	ca, err := cell.LoadCA(filepath.Join(testCell.dir, cell.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	return cell.UserTLS(ca)
}

func (p *probe) ctx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if p.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, pb.UserMetadata, "Bearer "+p.token)
	}
	return ctx, cancel
}

// attempt is one request a probe makes; it returns the server's answer.
type attempt struct {
	name string
	do   func(ctx context.Context, rpc pb.FileServerClient) error
}

// attacks are requests on what is bob's, or only an admin's to do.
func (w *secureWorld) attacks() []attempt {
	fid, dir, root, alice := pb.FromFID(w.secret), pb.FromFID(w.bobDir), pb.FromFID(w.root), pb.FromFID(w.aliceDir)
	unary := func(name string, f func(ctx context.Context, rpc pb.FileServerClient) (proto.Message, error)) attempt {
		return attempt{name, func(ctx context.Context, rpc pb.FileServerClient) error { _, err := f(ctx, rpc); return err }}
	}
	return []attempt{
		unary("CreateVolume", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.CreateVolume(ctx, &pb.CreateVolumeRequest{Name: "evil"})
		}),
		unary("Lookup", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Lookup(ctx, &pb.LookupRequest{Dir: dir, Name: "secret"})
		}),
		{"GetStatus", func(ctx context.Context, r pb.FileServerClient) error {
			rep, err := r.GetStatus(ctx, &pb.GetStatusRequest{Fids: []*pb.FID{fid, dir}})
			if err != nil {
				return err
			}
			for _, res := range rep.Results {
				if res.Status != nil {
					return fmt.Errorf("a status of %v: %v", res.Status.Fid, res.Status)
				}
				if res.Errno != int32(syscall.EACCES) {
					return fmt.Errorf("errno %d, want EACCES", res.Errno)
				}
			}
			return status.Error(codes.PermissionDenied, "every status refused")
		}},
		unary("ReadDir", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.ReadDir(ctx, &pb.ReadDirRequest{Dir: dir, MaxEntries: 10})
		}),
		unary("Create", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Create(ctx, &pb.CreateRequest{Dir: dir, Name: "planted", Type: pb.FileType_FILE_TYPE_FILE, Mode: 0o644})
		}),
		unary("Link", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Link(ctx, &pb.LinkRequest{Dir: alice, Name: "stolen", Target: fid})
		}),
		unary("Remove", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Remove(ctx, &pb.RemoveRequest{Dir: dir, Name: "secret"})
		}),
		unary("Rename", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Rename(ctx, &pb.RenameRequest{SrcDir: dir, SrcName: "secret", DstDir: alice, DstName: "stolen"})
		}),
		unary("SetAttr mode", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.SetAttr(ctx, &pb.SetAttrRequest{Fid: fid, Mask: 1, Mode: 0o777})
		}),
		unary("SetAttr size", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.SetAttr(ctx, &pb.SetAttrRequest{Fid: fid, Mask: 8, Size: 0})
		}),
		{"Fetch", func(ctx context.Context, r pb.FileServerClient) error {
			s, err := r.Fetch(ctx, &pb.FetchRequest{Fid: fid, Length: 1 << 20})
			if err != nil {
				return err
			}
			rep, err := s.Recv()
			if err == nil {
				return fmt.Errorf("fetched %q", rep.Data)
			}
			return err
		}},
		{"Store", func(ctx context.Context, r pb.FileServerClient) error {
			s, err := r.Store(ctx)
			if err != nil {
				return err
			}
			s.Send(&pb.StoreRequest{Fid: fid, Data: []byte("overwritten"), Size: 11})
			_, err = s.CloseAndRecv()
			return err
		}},
		unary("Open read", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Open(ctx, &pb.OpenRequest{Fid: fid})
		}),
		unary("Open write", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Open(ctx, &pb.OpenRequest{Fid: fid, Write: true})
		}),
		unary("GetACL", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.GetACL(ctx, &pb.GetACLRequest{Fid: fid})
		}),
		unary("SetACL", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.SetACL(ctx, &pb.SetACLRequest{Dir: dir, Who: access.AnyUser, Rights: uint32(access.All)})
		}),
		unary("SetACL root", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.SetACL(ctx, &pb.SetACLRequest{Dir: root, Who: access.AnyUser, Rights: uint32(access.All)})
		}),
		unary("RevokeToken", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.RevokeToken(ctx, &pb.RevokeTokenRequest{Id: "0123456789abcdef0123456789abcdef"})
		}),
		unary("CreateReserved", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.CreateReserved(ctx, &pb.CreateReservedRequest{Dir: dir, State: 1, Files: []*pb.ReservedFile{{Name: "planted", Fid: pb.FromFID(node.FID{Volume: 1, Vnode: 999, Unique: 1})}}})
		}),
	}
}

// everyone's are requests any user may make, refused to a bad token.
func (w *secureWorld) everyones() []attempt {
	unary := func(name string, f func(ctx context.Context, rpc pb.FileServerClient) (proto.Message, error)) attempt {
		return attempt{name, func(ctx context.Context, rpc pb.FileServerClient) error { _, err := f(ctx, rpc); return err }}
	}
	return []attempt{
		unary("GetVolume", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.GetVolume(ctx, &pb.GetVolumeRequest{Name: "root"})
		}),
		unary("StatFS", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.StatFS(ctx, &pb.StatFSRequest{Volume: w.root.Volume})
		}),
		unary("ReadDir root", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.ReadDir(ctx, &pb.ReadDirRequest{Dir: pb.FromFID(w.root), MaxEntries: 10})
		}),
		unary("WhoAmI", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.WhoAmI(ctx, &pb.WhoAmIRequest{})
		}),
		unary("ListGroups", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.ListGroups(ctx, &pb.ListGroupsRequest{})
		}),
		unary("ChangeGroup", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.ChangeGroup(ctx, &pb.ChangeGroupRequest{Change: pb.ChangeGroupRequest_CHANGE_CREATE, Group: "evil"})
		}),
		unary("Reserve", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Reserve(ctx, &pb.ReserveRequest{Volume: w.root.Volume, Count: 4, Dir: pb.FromFID(w.bobDir)})
		}),
		unary("Renew", func(ctx context.Context, r pb.FileServerClient) (proto.Message, error) {
			return r.Renew(ctx, &pb.RenewRequest{})
		}),
		{"Connect", func(ctx context.Context, r pb.FileServerClient) error {
			s, err := r.Connect(ctx)
			if err != nil {
				return err
			}
			if err := s.Send(&pb.ClientMsg{Msg: &pb.ClientMsg_Hello{Hello: &pb.Hello{Version: pb.Version, Name: "probe"}}}); err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}},
	}
}

// refused reports whether err is a refusal: permission denied or
// unauthenticated, nothing else (a crash, a timeout or a success fails).
func refused(err error) bool {
	c := status.Code(err)
	return err != nil && (c == codes.PermissionDenied || c == codes.Unauthenticated)
}

// tamper rewrites a token's claims to make its user an admin, keeping the
// signature.
func tamper(t *testing.T, tok string) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	claims, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	forged := strings.Replace(string(claims), `"adm":false`, `"adm":true`, 1)
	if forged == string(claims) {
		t.Fatalf("no admin claim to rewrite in %s", claims)
	}
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(forged))
	return strings.Join(parts, ".")
}

// badTokens are tokens that must get their bearer nothing: expired,
// revoked, from another cell, and tampered with.
func badTokens(t *testing.T, w *secureWorld) map[string]string {
	t.Helper()
	expired := issue(t, "carol", 1003, "--expires", "1s")
	revoked := issue(t, "dave", 1004)
	if _, err := cellDial(client.Options{Server: w.srv.addr, Token: revoked, DialTimeout: 5 * time.Second}); err != nil {
		t.Fatalf("the token to revoke does not work before: %v", err)
	}
	if out, code := run(t, "token", "revoke", revoked, "--server", w.srv.addr, "--cache", ""); code != 0 {
		t.Fatalf("token revoke: %s", out)
	}
	other := filepath.Join(t.TempDir(), "other")
	if out, err := exec.Command(hoardBin, "cell", "init", "--dir", other, "--name", "test").CombinedOutput(); err != nil {
		t.Fatalf("a second cell: %v: %s", err, out)
	}
	forged, err := os.ReadFile(filepath.Join(other, cell.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	claims, err := cell.Inspect(expired)
	if err != nil {
		t.Fatal(err)
	}
	// The token's expiry is in whole seconds: wait until it is past.
	poll.Wait(t, 5*time.Second, "the token to expire", func() bool { return time.Now().After(claims.Expires.Add(time.Second)) })
	return map[string]string{
		"expired":  expired,
		"revoked":  revoked,
		"forged":   strings.TrimSpace(string(forged)),
		"tampered": tamper(t, w.aliceTok),
		"garbage":  "not.a.token",
	}
}

func TestSecurityBadTokensGetNothing(t *testing.T) {
	w := newSecureWorld(t)
	bad := badTokens(t, w)
	before := snapshot(t, w.srv.addr)
	for what, tok := range bad {
		p := newProbe(t, w.srv.addr, cellTLS(t), tok)
		for _, a := range append(w.attacks(), w.everyones()...) {
			ctx, cancel := p.ctx()
			err := a.do(ctx, p.rpc)
			cancel()
			if !refused(err) {
				t.Errorf("%s token: %s: %v, want it refused", what, a.name, err)
			}
		}
		// The library says so in one line.
		_, err := cellDial(client.Options{Server: w.srv.addr, Token: tok, DialTimeout: 5 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "token refused") {
			t.Errorf("%s token: dial: %v, want the token refused", what, err)
		}
	}
	if after := snapshot(t, w.srv.addr); after != before {
		t.Fatalf("the server changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestSecurityAnonymousGetsOnlyAnyuser(t *testing.T) {
	w := newSecureWorld(t)
	before := snapshot(t, w.srv.addr)
	p := newProbe(t, w.srv.addr, cellTLS(t), "")
	for _, a := range w.attacks() {
		ctx, cancel := p.ctx()
		if err := a.do(ctx, p.rpc); !refused(err) {
			t.Errorf("anonymous: %s: %v, want it refused", a.name, err)
		}
		cancel()
	}
	ctx, cancel := p.ctx()
	defer cancel()
	if _, err := p.rpc.ReadDir(ctx, &pb.ReadDirRequest{Dir: pb.FromFID(w.root), MaxEntries: 10}); !refused(err) {
		t.Errorf("anonymous lists the root: %v", err)
	}
	if vs, err := p.rpc.ListVolumes(ctx, &pb.ListVolumesRequest{}); err != nil || len(vs.Volumes) != 0 {
		t.Errorf("anonymous sees volumes %v (%v), want none", vs, err)
	}
	if who, err := p.rpc.WhoAmI(ctx, &pb.WhoAmIRequest{}); err != nil || who.User != "" {
		t.Errorf("anonymous is told it is %v (%v)", who, err)
	}
	// The cell's volumes and servers are its users' to know.
	if ls, err := p.rpc.ListLocations(ctx, &pb.ListLocationsRequest{}); !refused(err) {
		t.Errorf("anonymous lists the cell's volumes: %v, %v", ls, err)
	}
	if ls, err := p.rpc.ListServers(ctx, &pb.ListServersRequest{}); !refused(err) {
		t.Errorf("anonymous lists the cell's servers: %v, %v", ls, err)
	}
	for _, name := range []string{"root", "no-such-volume"} {
		if l, err := p.rpc.Locate(ctx, &pb.LocateRequest{Name: name}); !refused(err) {
			t.Errorf("anonymous locates volume %s: %v, %v", name, l, err)
		}
	}
	// What system:anyuser is granted, anonymous gets.
	mustACL(t, w.admin, "/pub", access.AnyUser, access.Read|access.Lookup)
	rep, err := p.rpc.Lookup(ctx, &pb.LookupRequest{Dir: pb.FromFID(w.pubDir), Name: "doc"})
	if err != nil {
		t.Fatalf("anonymous cannot look in /pub once system:anyuser may: %v", err)
	}
	if got := access.Rights(rep.Status.Rights) &^ access.Rights(node.RightsKnown); got != access.Read|access.Lookup {
		t.Errorf("anonymous's rights on /pub/doc: %v, want rl", got)
	}
	mustACL(t, w.admin, "/pub", access.AnyUser, 0)
	// A public volume (its root open to system:anyuser) is found.
	mustACL(t, w.admin, "/", access.AnyUser, access.Lookup)
	if l, err := p.rpc.Locate(ctx, &pb.LocateRequest{Name: "root"}); err != nil || l.Name != "root" {
		t.Errorf("anonymous locates a public volume: %v, %v", l, err)
	}
	mustACL(t, w.admin, "/", access.AnyUser, 0)
	if after := snapshot(t, w.srv.addr); after != before {
		t.Fatalf("the server changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestSecurityAliceCannotTouchBobs(t *testing.T) {
	w := newSecureWorld(t)
	writeAs(t, w.alice, "/alice/prog", "#!/bin/sh\n")
	before := snapshot(t, w.srv.addr)
	p := newProbe(t, w.srv.addr, cellTLS(t), w.aliceTok)
	for _, a := range w.attacks() {
		ctx, cancel := p.ctx()
		if err := a.do(ctx, p.rpc); !refused(err) {
			t.Errorf("alice: %s: %v, want it refused", a.name, err)
		}
		cancel()
	}
	// Through the library.
	for what, err := range map[string]error{
		"read":   readErr(testkit.TryRead(w.alice, "/bob/secret")),
		"list":   readErr(w.alice.ReadDir("/bob")),
		"write":  writeErr(w.alice, "/bob/secret"),
		"create": writeErr(w.alice, "/bob/planted"),
		"remove": w.alice.Remove("/bob/secret"),
		"chmod":  w.alice.Chmod("/bob/secret", 0o777),
		"rename": w.alice.Rename("/bob/secret", "/alice/stolen"),
	} {
		if !errors.Is(err, fs.ErrPermission) {
			t.Errorf("alice's library: %s in bob's directory: %v, want permission denied", what, err)
		}
	}
	// Through the CLI.
	for _, args := range [][]string{{"cat", "/bob/secret"}, {"ls", "/bob"}, {"rm", "/bob/secret"}, {"acl", "set", "/bob", "alice", "all"}} {
		cmd := exec.Command(hoardBin, append(args, "--server", w.srv.addr, "--cache", "")...)
		cmd.Env = append(os.Environ(), "HOARD_TOKEN="+w.aliceTok)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "permission denied") || strings.Contains(string(out), "bob's secret") {
			t.Errorf("hoard %s as alice: %v: %s, want permission denied", strings.Join(args, " "), err, out)
		}
	}
	// What only admins do, alice may not, even in her own directory.
	for what, err := range map[string]error{
		"create a volume":  readErr(w.alice.Admin().CreateVolume("alices")),
		"set the setuid":   w.alice.Chmod("/alice/prog", os.ModeSetuid|0o755),
		"give a file away": w.alice.Chown("/alice/prog", 0, 0),
		"mount a volume":   w.alice.Admin().MountVolume("/alice/vol", "root"),
	} {
		if !errors.Is(err, fs.ErrPermission) {
			t.Errorf("alice may %s: %v, want it refused", what, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, pb.UserMetadata, "Bearer "+w.aliceTok)
	for _, req := range []*pb.CreateRequest{
		{Dir: pb.FromFID(w.aliceDir), Name: "dev", Type: pb.FileType_FILE_TYPE_CHARDEV, Mode: 0o666, Rdev: 0x0101},
		{Dir: pb.FromFID(w.aliceDir), Name: "suid", Type: pb.FileType_FILE_TYPE_FILE, Mode: 0o4755},
	} {
		if _, err := p.rpc.Create(ctx, req); status.Code(err) != codes.PermissionDenied {
			t.Errorf("alice makes %s (%v, mode %o): %v, want it refused", req.Name, req.Type, req.Mode, err)
		}
	}
	if st, err := w.admin.Lstat("/alice/prog"); err != nil || st.UID != 1001 {
		t.Errorf("alice's file: %+v, %v: want it hers (uid 1001)", st, err)
	}
	if after := snapshot(t, w.srv.addr); after != before {
		t.Fatalf("the server changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func readErr[T any](_ T, err error) error { return err }

func writeErr(c *pathfs.FS, name string) error {
	f, err := c.Open(name, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	f.Write([]byte("x"))
	return f.Close()
}

// A data-channel request is checked as a gRPC one is: by the user's
// token, whatever session it names, another user's included.
func TestSecurityDataChannel(t *testing.T) {
	w := newSecureWorld(t)
	bad := badTokens(t, w)
	bad["anonymous"] = ""
	bad["alice"] = w.aliceTok
	before := snapshot(t, w.srv.addr)
	// The probe's session, anonymous: the token decides.
	addr, session := dataAddr(t, w)
	for what, tok := range bad {
		for _, op := range []uint8{datapath.OpFetch, datapath.OpStore} {
			errno, msg := dataRequest(t, addr, datapath.Request{Op: op, Session: session, User: tok, FID: w.secret, Length: 12})
			if errno != uint32(syscall.EACCES) {
				t.Errorf("data channel, %s token, op %d: errno %d (%s), want EACCES", what, op, errno, msg)
			}
		}
	}
	if errno, msg := dataRequest(t, addr, datapath.Request{Op: datapath.OpFetch, Session: session, User: w.bobTok, FID: w.secret, Length: 12}); errno != 0 {
		t.Fatalf("bob's own fetch: errno %d: %s", errno, msg)
	}
	if after := snapshot(t, w.srv.addr); after != before {
		t.Fatalf("the server changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// dataAddr is the server's data channel, as a Welcome tells it, and the
// session it welcomed.
func dataAddr(t *testing.T, w *secureWorld) (string, string) {
	t.Helper()
	p := newProbe(t, w.srv.addr, cellTLS(t), "")
	// The session lives as long as its stream: to the test's end.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := p.rpc.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&pb.ClientMsg{Msg: &pb.ClientMsg_Hello{Hello: &pb.Hello{Version: pb.Version, Name: "probe"}}})
	m, err := s.Recv()
	if err != nil || m.GetWelcome().GetDataAddr() == "" {
		t.Fatalf("no data channel in the welcome: %v %v", m, err)
	}
	return m.GetWelcome().DataAddr, m.GetWelcome().Session
}

// dataRequest sends one request on a new TLS data connection and returns
// the errno of the answer.
func dataRequest(t *testing.T, addr string, req datapath.Request) (uint32, string) {
	t.Helper()
	c := cellTLS(t)
	c.NextProtos, c.ServerName = []string{datapath.ALPN}, "127.0.0.1"
	conn, err := tls.Dial("tcp", addr, c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	out := datapath.AppendRequest(nil, req)
	if req.Op == datapath.OpStore {
		hdr, _ := proto.Marshal(&pb.StoreRequest{Size: 12})
		req.Length = uint64(len(hdr))
		out = append(datapath.AppendRequest(nil, req), hdr...)
		p := []byte("overwritten!")
		out = datapath.AppendCRC(append(datapath.AppendPiece(out, 0, len(p)), p...), datapath.Checksum(0, p))
		out = datapath.AppendPiece(out, 0, 0)
	}
	if _, err := conn.Write(out); err != nil {
		t.Fatal(err)
	}
	rep, err := datapath.ReadReply(bufio.NewReader(conn))
	if err != nil && err != io.EOF {
		t.Fatalf("data channel reply: %v", err)
	}
	return rep.Errno, rep.Message
}

// A client that trusts another cell's CA does not talk to this server,
// and a client certificate another cell signed is refused.
func TestSecurityOtherCA(t *testing.T) {
	srv := startServer(t, t.TempDir())
	other := filepath.Join(t.TempDir(), "other")
	if out, err := exec.Command(hoardBin, "cell", "init", "--dir", other, "--name", "elsewhere").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	id, err := cell.Load(other)
	if err != nil {
		t.Fatal(err)
	}
	// Trusting the other CA: this server's certificate is not one.
	p := newProbe(t, srv.addr, cell.UserTLS(id.CA), "")
	ctx, cancel := p.ctx()
	defer cancel()
	if _, err := p.rpc.WhoAmI(ctx, &pb.WhoAmIRequest{}, grpc.WaitForReady(false)); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client of another cell's CA: %v, want a certificate error", err)
	}
	// Trusting this CA, showing the other cell's server certificate.
	// Go's client sends no certificate the server's CAs did not sign:
	// this one insists, as an attacker's would.
	c := cellTLS(t)
	c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &id.Cert, nil }
	p = newProbe(t, srv.addr, c, "")
	if _, err := p.rpc.WhoAmI(ctx, &pb.WhoAmIRequest{}); err == nil {
		t.Errorf("a certificate of another cell was taken")
	}
	// Plain TCP gets nothing either.
	out, code := run(t, "ls", "/", "--insecure", "--server", srv.addr, "--cache", "", "--timeout", "2s")
	if code == 0 {
		t.Errorf("a plain-TCP client listed the root: %s", out)
	}
}

// An ACL change reaches another user's mount before it is acknowledged:
// once SetACL returns, the mount refuses what it served from its cache.
func TestSecurityACLChangeReachesMount(t *testing.T) {
	w := newSecureWorld(t)
	tokFile := filepath.Join(t.TempDir(), "alice.token")
	if err := os.WriteFile(tokFile, []byte(w.aliceTok), 0o600); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, w.srv, t.TempDir(), "--token", tokFile)
	doc := filepath.Join(m.dir, "pub", "doc")
	for i := 0; i < 2; i++ { // the second read is served from the cache
		if got, err := os.ReadFile(doc); err != nil || string(got) != "for everyone" {
			t.Fatalf("alice reads /pub/doc: %q, %v", got, err)
		}
	}
	if _, err := os.ReadFile(filepath.Join(m.dir, "bob", "secret")); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("alice's mount reads bob's secret: %v", err)
	}
	// Take r away, keep l: the status is still hers to see, the bytes not.
	mustACL(t, w.admin, "/pub", access.AuthUser, access.Lookup)
	if _, err := os.ReadFile(doc); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("alice's mount after r was taken away: %v, want permission denied", err)
	}
	if _, err := os.Stat(doc); err != nil {
		t.Fatalf("alice cannot stat /pub/doc with l: %v", err)
	}
	mustACL(t, w.admin, "/pub", access.AuthUser, 0)
	if _, err := os.Stat(doc); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("alice stats /pub/doc with no rights: %v", err)
	}
	names, _ := os.ReadDir(filepath.Join(m.dir, "pub"))
	sort.Slice(names, func(i, j int) bool { return names[i].Name() < names[j].Name() })
	if len(names) != 0 {
		t.Fatalf("alice lists /pub with no rights: %v", names)
	}
}

// A proxy checks its clients as the origin would, against the origin's
// ACLs: what bob's read left in its store, alice does not get.
func TestSecurityThroughProxy(t *testing.T) {
	w := newSecureWorld(t)
	px := startProxy(t, w.srv, filepath.Join(t.TempDir(), "proxy"))
	bob := dialAs(t, px.addr, w.bobTok)
	if got, err := testkit.TryRead(bob, "/bob/secret"); err != nil || string(got) != "bob's secret" {
		t.Fatalf("bob through the proxy: %q, %v", got, err)
	}
	alice := dialAs(t, px.addr, w.aliceTok)
	if _, err := testkit.TryRead(alice, "/bob/secret"); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("alice reads bob's secret from the proxy: %v", err)
	}
	if got, err := testkit.TryRead(alice, "/pub/doc"); err != nil || string(got) != "for everyone" {
		t.Fatalf("alice through the proxy: %q, %v", got, err)
	}
	// An ACL change at the origin reaches the proxy before it returns.
	mustACL(t, w.admin, "/bob", "alice", access.Read|access.Lookup)
	if got, err := testkit.TryRead(alice, "/bob/secret"); err != nil || string(got) != "bob's secret" {
		t.Fatalf("alice, given r and l on /bob, through the proxy: %q, %v", got, err)
	}
	mustACL(t, w.admin, "/bob", "alice", 0)
	if _, err := testkit.TryRead(alice, "/bob/secret"); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("alice reads bob's secret through the proxy after her rights went: %v", err)
	}
	// A revocation at the origin reaches the proxy's clients at once, not
	// after the minute the proxy trusts its origin's word on a token.
	claims, err := cell.Inspect(w.bobTok)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.admin.Admin().RevokeToken(claims.ID, claims.Expires); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 3*time.Second, "bob's revoked token refused through the proxy", func() bool {
		_, err := testkit.TryRead(dialAs(t, px.addr, testCell.admin), "/bob/secret") // the proxy's cache is warm
		if err != nil {
			return false
		}
		_, err = testkit.TryRead(bob, "/bob/secret")
		return errors.Is(err, fs.ErrPermission)
	})
	bad := badTokens(t, w)
	before := snapshot(t, w.srv.addr)
	for what, tok := range map[string]string{"anonymous": "", "forged": bad["forged"], "revoked": bad["revoked"], "alice": w.aliceTok} {
		p := newProbe(t, px.addr, cellTLS(t), tok)
		for _, a := range w.attacks() {
			if a.name == "CreateReserved" {
				continue // a proxy takes no directory delegations at all
			}
			ctx, cancel := p.ctx()
			if err := a.do(ctx, p.rpc); !refused(err) {
				t.Errorf("%s through the proxy: %s: %v, want it refused", what, a.name, err)
			}
			cancel()
		}
	}
	if after := snapshot(t, w.srv.addr); after != before {
		t.Fatalf("the origin changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// An encrypted cache holds nothing a stolen disk could read, and a
// mount started again over it starts empty and reads the files anew.
func TestSecurityEncryptedCache(t *testing.T) {
	w := newSecureWorld(t)
	marker := strings.Repeat("plaintext marker ", 20000)
	writeAs(t, w.admin, "/pub/big", marker)
	cacheDir := t.TempDir()
	m := startMount(t, w.srv, cacheDir, "--cache-encrypt")
	if !strings.Contains(m.logs.String(), "through the kernel page cache") {
		t.Fatalf("an encrypted cache is read by passthrough: %s", m.logs)
	}
	big := filepath.Join(m.dir, "pub", "big")
	for range 2 {
		if got, err := os.ReadFile(big); err != nil || string(got) != marker {
			t.Fatalf("read through the encrypted mount: %d bytes, %v", len(got), err)
		}
	}
	if err := os.WriteFile(filepath.Join(m.dir, "pub", "new"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	// A write the server refuses is kept in lost/: encrypted too.
	if _, err := w.admin.Admin().CreateVolume("tiny"); err != nil {
		t.Fatal(err)
	}
	if err := w.admin.Admin().MountVolume("/pub/tiny", "tiny"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.Admin().SetQuota("tiny", 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.dir, "pub", "tiny", "over"), []byte(marker), 0o644); err == nil {
		t.Fatal("a write past the quota was not refused at close")
	}
	kept, err := lost.List(cacheDir)
	if err != nil || len(kept) != 1 || !kept[0].Sealed {
		t.Fatalf("the refused write's lost record: %+v, %v; want one, sealed", kept, err)
	}
	if out, code := run(t, "cache", "lost", "restore", kept[0].ID, "--cache", cacheDir, "--server", w.srv.addr); code == 0 || !strings.Contains(out, "cannot be read") {
		t.Fatalf("restoring sealed lost writes: exit %d: %s", code, out)
	}
	cached := 0
	filepath.Walk(cacheDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			if bytes.Contains(b, []byte("plaintext marker")) {
				t.Errorf("%s, beside an encrypted cache, holds plaintext", p)
			}
			if strings.HasPrefix(p, filepath.Join(cacheDir, "files")) {
				cached += len(b)
			}
		}
		return nil
	})
	if cached < len(marker) {
		t.Fatalf("%d bytes in the cache's files: the file was not cached", cached)
	}
	if got := testkit.ReadFile(t, w.admin, "/pub/new"); string(got) != marker {
		t.Fatalf("the encrypted mount's write, at the server: %d bytes", len(got))
	}
	m.stop()
	m.start(w.srv)
	if got, err := os.ReadFile(big); err != nil || string(got) != marker {
		t.Fatalf("read after a restart of the encrypted mount: %d bytes, %v", len(got), err)
	}
}
