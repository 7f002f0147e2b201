package client_test

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/client/user"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server"
)

// One client serving many users (a multi-user mount): each user's requests
// carry that user's token, and what the cache holds is served to a user
// only as the server said that user may.

// usersCell makes a cell and returns its token checker and a maker of its
// users' tokens.
func usersCell(t *testing.T) (*cell.Verifier, func(user string, uid uint32, admin bool) string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "cell")
	testkit.Must(t, cell.Init(dir, cell.InitOptions{Name: "test"}))
	id, err := cell.Load(dir)
	testkit.Must(t, err)
	v, err := cell.NewVerifier(id.CA, nil)
	testkit.Must(t, err)
	iss, err := cell.LoadIssuer(dir)
	testkit.Must(t, err)
	return v, func(user string, uid uint32, admin bool) string {
		tok, _, err := iss.Issue(cell.Claims{User: user, UID: uid, Admin: admin}, time.Hour)
		testkit.Must(t, err)
		return tok
	}
}

// wantEACCES fails unless err stands for EACCES, as the mount answers.
func wantEACCES(t *testing.T, what string, err error) {
	t.Helper()
	if client.Errno(err) != syscall.EACCES {
		t.Fatalf("%s: %v, want EACCES", what, err)
	}
}

func token(tok string) servertest.ClientOpt { return func(o *client.Options) { o.Token = tok } }

// private makes dir, for who alone.
func private(t *testing.T, admin *pathfs.FS, dir, who string) {
	t.Helper()
	testkit.Must(t, admin.Mkdir(dir, 0o777))
	_, err := admin.Admin().SetACL(dir, who, access.All)
	testkit.Must(t, err)
	_, err = admin.Admin().SetACL(dir, access.AuthUser, 0)
	testkit.Must(t, err)
}

// readNode reads file n in dir through k, or fails as k's open does.
func readNode(k *client.Nodes, dir, n *client.Node, name string) ([]byte, error) {
	f, err := k.Open(n, dir, name, name, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

func TestUsersShareTheCacheNotTheRights(t *testing.T) {
	v, issue := usersCell(t)
	adminTok, aliceTok, bobTok := issue("admin", 0, true), issue("alice", 1001, false), issue("bob", 1002, false)
	s := servertest.Start(t, servertest.Secure(v))
	admin := s.Dial(t, servertest.MemCache(), token(adminTok))
	testkit.Must(t, admin.Admin().CreateUser("alice", 1001))
	testkit.Must(t, admin.Admin().CreateUser("bob", 1002))
	private(t, admin, "/bob", "bob")
	secret := []byte("bob's secret")
	testkit.WriteFile(t, s.Dial(t, servertest.MemCache(), token(bobTok)), "/bob/secret", secret)
	// A client of the admin's token, serving bob and alice.
	c := s.Dial(t, token(adminTok))
	bob, alice := c.Client().Nodes().As(user.New(bobTok)), c.Client().Nodes().As(user.New(aliceTok))
	dir, _, err := bob.Lookup(root(t, bob), "bob")
	testkit.Must(t, err)
	n, _, err := bob.Lookup(dir, "secret")
	testkit.Must(t, err)
	if got, err := readNode(bob, dir, n, "secret"); err != nil || string(got) != string(secret) {
		t.Fatalf("bob reads %q, %v", got, err)
	}
	if _, err := bob.ReadDir(dir); err != nil {
		t.Fatal(err)
	}
	// Bob is served from the cache now: no request.
	rpcs := c.Client().Stats().RPCs
	if got, err := readNode(bob, dir, n, "secret"); err != nil || string(got) != string(secret) {
		t.Fatalf("bob reads %q, %v again", got, err)
	}
	if _, err := bob.ReadDir(dir); err != nil {
		t.Fatal(err)
	}
	if got := c.Client().Stats().RPCs - rpcs; got != 0 {
		t.Fatalf("bob's cached read and listing took %d requests", got)
	}
	// Alice is asked about, as herself, and refused all of it.
	_, _, err = alice.Lookup(dir, "secret")
	wantEACCES(t, "alice's lookup", err)
	_, err = alice.Getattr(n)
	wantEACCES(t, "alice's stat", err)
	_, err = readNode(alice, dir, n, "secret")
	wantEACCES(t, "alice's read", err)
	_, err = alice.ReadDir(dir)
	wantEACCES(t, "alice's listing", err)
	_, err = alice.SetAttr(n, client.Attr{Size: new(uint64)})
	wantEACCES(t, "alice's truncation", err)
	wantEACCES(t, "alice's remove", alice.Remove(dir, "secret", false))
	// Her refusals dropped nothing of bob's: still no request for him.
	rpcs = c.Client().Stats().RPCs
	if got, err := readNode(bob, dir, n, "secret"); err != nil || string(got) != string(secret) {
		t.Fatalf("bob reads %q, %v after alice", got, err)
	}
	if got := c.Client().Stats().RPCs - rpcs; got != 0 {
		t.Fatalf("bob's cached read took %d requests after alice's refusals", got)
	}
	// A new token of bob's is asked about again (rights are the token's).
	bob2 := c.Client().Nodes().As(user.New(issue("bob", 1002, false)))
	rpcs = c.Client().Stats().RPCs
	if got, err := readNode(bob2, dir, n, "secret"); err != nil || string(got) != string(secret) {
		t.Fatalf("bob's new token reads %q, %v", got, err)
	}
	if c.Client().Stats().RPCs == rpcs {
		t.Fatal("a new token was served from the cache without asking the server")
	}
	testkit.WantFile(t, admin, "/bob/secret", secret)
}

// Writes kept back under a delegation, and files made under a
// directory's, reach the server later as the user who wrote or made them,
// not as the client's own user: here anonymous, whom the server lets
// write nothing. Files two users made in one directory are each made as
// their maker (and owned by them).
func TestUsersWriteBackAsTheWriter(t *testing.T) {
	v, issue := usersCell(t)
	adminTok, aliceTok, bobTok := issue("admin", 0, true), issue("alice", 1001, false), issue("bob", 1002, false)
	s := servertest.Start(t, servertest.Secure(v), servertest.WithConfig(func(c *server.Config) { c.DirDelegations = server.DirAny }))
	admin := s.Dial(t, servertest.MemCache(), token(adminTok))
	testkit.Must(t, admin.Admin().CreateUser("alice", 1001))
	testkit.Must(t, admin.Admin().CreateUser("bob", 1002))
	_, err := admin.Admin().SetACL("/", access.AnyUser, access.Lookup) // for the anonymous client to start
	testkit.Must(t, err)
	private(t, admin, "/shared", "alice")
	_, err = admin.Admin().SetACL("/shared", "bob", access.All)
	testkit.Must(t, err)
	c := s.Dial(t)
	alice, bob := c.Client().Nodes().As(user.New(aliceTok)), c.Client().Nodes().As(user.New(bobTok))
	files := []struct {
		name string
		k    *client.Nodes
		uid  uint32
	}{{"a1", alice, 1001}, {"b1", bob, 1002}, {"a2", alice, 1001}}
	// Bob first learns his rights there: a user not known to have them
	// makes files at the server instead.
	_, _, err = bob.Lookup(root(t, bob), "shared")
	testkit.Must(t, err)
	for _, f := range files {
		dir, _, err := f.k.Lookup(root(t, f.k), "shared")
		testkit.Must(t, err)
		_, h, err := f.k.CreateOpen(client.Make{Dir: dir, Name: f.name, Mode: 0o644, Who: client.Creator{UID: f.uid, GID: f.uid}}, "/shared/"+f.name, os.O_RDWR|os.O_CREATE)
		testkit.Must(t, err)
		_, err = h.Write([]byte(f.name))
		testkit.Must(t, err)
		testkit.Must(t, h.Close())
	}
	if st := c.Client().Stats(); st.DirtyBytes == 0 || st.MadeHere != int64(len(files)) {
		t.Fatalf("not kept back: %d bytes dirty, %d of %d files made here", st.DirtyBytes, st.MadeHere, len(files))
	}
	testkit.Must(t, c.Close()) // stores it all, or says what it lost
	for _, f := range files {
		testkit.WantFile(t, admin, "/shared/"+f.name, []byte(f.name))
		if st, err := admin.Stat("/shared/" + f.name); err != nil || st.UID != f.uid || st.Type != node.TypeFile {
			t.Fatalf("/shared/%s: %+v, %v: want it uid %d's", f.name, st, err, f.uid)
		}
	}
}
