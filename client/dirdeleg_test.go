package client_test

import (
	"bytes"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
	"github.com/hoardfs/hoard/server"
)

// Files made in a directory under its delegation cost no RPC each; another
// client's listing recalls the delegation, which creates them all at the
// server first: it sees every one, with its data.
func TestDirDelegationMany(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour })
	b := s.Dial(t, servertest.MemCache())
	testkit.Must(t, a.Mkdir("/d", 0o755))
	const n = 100
	var want []string
	before := a.Client().Stats()
	for i := range n {
		name := fmt.Sprintf("f%03d", i)
		testkit.WriteFile(t, a, "/d/"+name, []byte(name))
		want = append(want, name)
	}
	st := a.Client().Stats()
	if made := st.MadeHere - before.MadeHere; made != n {
		t.Fatalf("%d of %d files made here", made, n)
	}
	if rpcs := st.RPCs - before.RPCs; rpcs > 10 {
		t.Fatalf("%d RPCs for %d files made under a directory delegation", rpcs, n)
	}
	if got := testkit.Names(t, a, "/d"); !slices.Equal(got, want) {
		t.Fatalf("the maker lists %d names", len(got))
	}
	if got := testkit.Names(t, b, "/d"); !slices.Equal(got, want) {
		t.Fatalf("another client lists %d names, want %d", len(got), n)
	}
	if st := a.Client().Stats(); st.Settled != n {
		t.Fatalf("%d files settled, want %d", st.Settled, n)
	}
	for _, i := range []int{0, 42, n - 1} {
		name := fmt.Sprintf("f%03d", i)
		testkit.WantFile(t, b, "/d/"+name, []byte(name))
	}
	// b has the directory cached now: a's next create asks the server.
	made := a.Client().Stats().MadeHere
	testkit.WriteFile(t, a, "/d/late", []byte("late"))
	if a.Client().Stats().MadeHere != made {
		t.Fatal("a file was made here in a directory another client has cached")
	}
	testkit.WantFile(t, b, "/d/late", []byte("late"))
}

// A file made, written and removed under a directory delegation never
// reaches the server, nor stays in the cache or in lost/.
func TestDirDelegationChurn(t *testing.T) {
	s := servertest.Start(t)
	dir := t.TempDir()
	a := s.Dial(t, servertest.InDir(dir))
	testkit.Must(t, a.Mkdir("/d", 0o755))
	before := a.Client().Stats()
	for i := range 20 {
		name := fmt.Sprintf("/d/f%02d", i)
		testkit.WriteFile(t, a, name, testkit.Pattern(64<<10, byte(i)))
		testkit.Must(t, a.Remove(name))
	}
	st := a.Client().Stats()
	if st.MadeHere-before.MadeHere != 20 || st.MadeDropped-before.MadeDropped != 20 || st.Settled != 0 || st.Stores != 0 {
		t.Fatalf("made %d, dropped %d, settled %d, stored %d: want 20 made and dropped, nothing sent",
			st.MadeHere-before.MadeHere, st.MadeDropped-before.MadeDropped, st.Settled, st.Stores)
	}
	if st.DirtyBytes != 0 || st.BytesCached != 0 {
		t.Fatalf("the cache keeps %d dirty, %d cached bytes of removed files", st.DirtyBytes, st.BytesCached)
	}
	// One removed while open: its close does not fail, and leaves
	// nothing (TestRemovedOpenFile: it cannot be read meanwhile).
	open := testkit.Create(t, a, "/d/open", []byte("written before the remove"))
	testkit.Must(t, a.Remove("/d/open"))
	testkit.Must(t, open.Close())
	if st := a.Client().Stats(); st.DirtyBytes != 0 || st.BytesCached != 0 || st.MadeDropped-before.MadeDropped != 21 {
		t.Fatalf("after the close of a file removed while open: %+v", st)
	}
	testkit.Must(t, a.Close())
	a2 := s.Dial(t, servertest.InDir(dir))
	if kept, err := lost.List(dir); err != nil || len(kept) != 0 {
		t.Fatalf("a restart kept writes to removed files as lost: %d, %v", len(kept), err)
	}
	if got := testkit.Names(t, a2, "/d"); len(got) != 0 {
		t.Fatalf("the directory holds %v", got)
	}
}

// A file the server knows, removed under a directory delegation, is
// removed there at the next settle, with no request of its own.
func TestDirDelegationRemoveLater(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour })
	b := s.Dial(t, servertest.MemCache())
	testkit.Must(t, a.Mkdir("/d", 0o755))
	for i := range 6 {
		f := testkit.Create(t, a, fmt.Sprintf("/d/f%d", i), testkit.Pattern(3000, byte(i)))
		testkit.Must(t, f.Sync()) // created and stored at the server
		testkit.Must(t, f.Close())
	}
	before := a.Client().Stats()
	if before.Settled != 6 {
		t.Fatalf("%d files created at the server by their fsyncs, want 6", before.Settled)
	}
	for i := range 4 {
		testkit.Must(t, a.Remove(fmt.Sprintf("/d/f%d", i)))
	}
	testkit.WriteFile(t, a, "/d/f0", []byte("again")) // a name removed here, made again
	_, err := a.Stat("/d/f1")
	testkit.WantErrno(t, "stat of a file removed here", err, syscall.ENOENT)
	st := a.Client().Stats()
	if removed, rpcs := st.RemovedHere-before.RemovedHere, st.RPCs-before.RPCs; removed != 4 || rpcs != 0 {
		t.Fatalf("%d files removed here with %d RPCs, want 4 with none", removed, rpcs)
	}
	if got := testkit.Names(t, b, "/d"); fmt.Sprint(got) != "[f0 f4 f5]" {
		t.Fatalf("another client lists %v, want [f0 f4 f5]", got)
	}
	testkit.WantFile(t, b, "/d/f0", []byte("again"))
	testkit.WantFile(t, b, "/d/f4", testkit.Pattern(3000, 4))
}

// Renames and removes of files made here stay here; the directory's
// times move with each change; a directory with files made in it is not
// empty, to rmdir or to a rename over it.
func TestDirDelegationPOSIX(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour })
	testkit.Must(t, a.Mkdir("/p", 0o755))
	testkit.Must(t, a.Mkdir("/q", 0o755))
	changed := func(what string, change func()) {
		t.Helper()
		before, err := a.Stat("/p")
		testkit.Must(t, err)
		waitFor(t, time.Second, func() bool { return time.Since(before.Mtime) > time.Millisecond }, func() string { return "clock" })
		change()
		after, err := a.Stat("/p")
		testkit.Must(t, err)
		if !after.Mtime.After(before.Mtime) || !after.Ctime.After(before.Ctime) {
			t.Fatalf("%s: the directory's mtime %v -> %v, ctime %v -> %v; want both later", what, before.Mtime, after.Mtime, before.Ctime, after.Ctime)
		}
	}
	made := a.Client().Stats().MadeHere
	changed("a create", func() { testkit.WriteFile(t, a, "/p/x", []byte("x")) })
	changed("a create", func() { testkit.WriteFile(t, a, "/p/y", []byte("y")) })
	changed("a rename", func() { testkit.Must(t, a.Rename("/p/y", "/p/z")) })
	changed("a remove", func() { testkit.Must(t, a.Remove("/p/z")) })
	if st := a.Client().Stats(); st.MadeHere-made != 2 || st.Settled != 0 {
		t.Fatalf("made %d, settled %d: the test wants both files made here, unsent", st.MadeHere-made, st.Settled)
	}
	if got := testkit.Names(t, a, "/p"); fmt.Sprint(got) != "[x]" {
		t.Fatalf("the maker lists %v", got)
	}
	testkit.WantErrno(t, "rmdir of a directory with a file made in it", a.Remove("/p"), syscall.ENOTEMPTY)
	if err := a.Rename("/q", "/p"); errnoOf(err) != syscall.ENOTEMPTY && errnoOf(err) != syscall.EEXIST {
		t.Fatalf("rename over a directory with a file made in it: %v, want ENOTEMPTY or EEXIST", err)
	}
	// A rename out of the directory, a link, a chmod: each settles first.
	testkit.WriteFile(t, a, "/p/m", []byte("moved"))
	testkit.Must(t, a.Rename("/p/m", "/q/m"))
	testkit.WriteFile(t, a, "/p/l", []byte("linked"))
	testkit.Must(t, a.Link("/p/l", "/q/l"))
	testkit.WriteFile(t, a, "/p/c", []byte("chmod"))
	testkit.Must(t, a.Chmod("/p/c", 0o600))
	testkit.WriteFile(t, a, "/p/t", []byte("truncated"))
	testkit.Must(t, a.Chtimes("/p/t", time.Unix(1e9, 0), time.Unix(1e9, 0)))
	b := s.Dial(t, servertest.MemCache())
	testkit.WantFile(t, b, "/p/x", []byte("x"))
	testkit.WantFile(t, b, "/q/m", []byte("moved"))
	testkit.WantFile(t, b, "/q/l", []byte("linked"))
	if st, err := b.Stat("/p/c"); err != nil || st.Mode&0o777 != 0o600 {
		t.Fatalf("chmod of a file made here: %+v %v", st, err)
	}
	if st, err := b.Stat("/p/t"); err != nil || st.Mtime.Unix() != 1e9 {
		t.Fatalf("chtimes of a file made here: %+v %v", st, err)
	}
	if got := testkit.Names(t, b, "/p"); fmt.Sprint(got) != "[c l t x]" {
		t.Fatalf("another client lists %v", got)
	}
}

// Exclusive creates and opens of existing names under a directory
// delegation answer as the server would.
func TestDirDelegationExisting(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t)
	testkit.Must(t, a.Mkdir("/d", 0o755))
	testkit.WriteFile(t, a, "/d/f", []byte("first"))
	testkit.Must(t, a.Mkdir("/d/sub", 0o755))
	_, err := a.Open("/d/f", 0x2|0x40|0x80, 0o644) // O_RDWR|O_CREATE|O_EXCL
	testkit.WantErrno(t, "O_EXCL of a file made here", err, syscall.EEXIST)
	f, err := a.Open("/d/f", 0x2|0x40, 0o644) // O_RDWR|O_CREATE
	testkit.Must(t, err)
	p := make([]byte, 5)
	if _, err := f.ReadAt(p, 0); err != nil || string(p) != "first" {
		t.Fatalf("O_CREATE of a file made here read %q %v", p, err)
	}
	testkit.Must(t, f.Close())
	_, err = a.Open("/d/sub", 0x1|0x40, 0o644) // O_WRONLY|O_CREATE
	testkit.WantErrno(t, "O_CREATE of a directory", err, syscall.EISDIR)
	if st := a.Client().Stats(); st.MadeHere == 0 {
		t.Fatal("nothing made here")
	}
}

// With DirAny the server delegates a directory another client has
// cached, breaking its promise; with DirNone never; with
// NoDirDelegations the client never asks.
func TestDirDelegationPolicies(t *testing.T) {
	for _, tc := range []struct {
		policy   string
		noAsk    bool
		wantMade bool
	}{
		{server.DirAny, false, true},
		{server.DirNone, false, false},
		{server.DirPrivate, true, false},
	} {
		t.Run(fmt.Sprintf("%s-noask=%v", tc.policy, tc.noAsk), func(t *testing.T) {
			s := servertest.Start(t, servertest.WithConfig(func(c *server.Config) { c.DirDelegations = tc.policy }))
			a := s.Dial(t, func(o *client.Options) { o.NoDirDelegations = tc.noAsk })
			b := s.Dial(t, servertest.MemCache())
			testkit.Must(t, a.Mkdir("/d", 0o755))
			if tc.policy == server.DirAny {
				testkit.Names(t, b, "/d") // b caches it; DirAny delegates anyway
			}
			for i := range 5 {
				testkit.WriteFile(t, a, fmt.Sprintf("/d/f%d", i), []byte{byte(i)})
			}
			if made := a.Client().Stats().MadeHere > 0; made != tc.wantMade {
				t.Fatalf("files made here: %v, want %v", made, tc.wantMade)
			}
			if got := testkit.Names(t, b, "/d"); len(got) != 5 {
				t.Fatalf("another client lists %v", got)
			}
			testkit.WantFile(t, b, "/d/f3", []byte{3})
		})
	}
}

// Two clients making files in one directory in turn: each recalls the
// other's delegation, and nothing made by either is lost; a client that
// had its delegation recalled waits before asking again.
func TestDirDelegationTwoMakers(t *testing.T) {
	s := servertest.Start(t, servertest.WithConfig(func(c *server.Config) { c.DirDelegations = server.DirAny }))
	a := s.Dial(t, func(o *client.Options) { o.DirBackoff = 50 * time.Millisecond })
	b := s.Dial(t, func(o *client.Options) { o.DirBackoff = 50 * time.Millisecond })
	testkit.Must(t, a.Mkdir("/d", 0o755))
	var want []string
	for i := range 10 {
		c := a
		if i%2 == 1 {
			c = b
		}
		name := fmt.Sprintf("f%02d", i)
		testkit.WriteFile(t, c, "/d/"+name, []byte(name))
		want = append(want, name)
	}
	for _, c := range []*pathfs.FS{a, b} {
		if got := testkit.Names(t, c, "/d"); !slices.Equal(got, want) {
			t.Fatalf("lists %v, want %v", got, want)
		}
		for _, name := range want {
			testkit.WantFile(t, c, "/d/"+name, []byte(name))
		}
	}
}

// Many files made here, then a listing elsewhere: a settle of more than
// one request's worth.
func TestDirDelegationLargeSettle(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	s := servertest.Start(t)
	a := s.Dial(t, servertest.MemCache(), func(o *client.Options) { o.FlushAge = time.Hour })
	testkit.Must(t, a.Mkdir("/big", 0o755))
	const n = 1100
	for i := range n {
		f, err := a.Create(fmt.Sprintf("/big/%04d", i))
		testkit.Must(t, err)
		testkit.Must(t, f.Close())
	}
	if made := a.Client().Stats().MadeHere; made != n {
		t.Fatalf("%d made here, want %d", made, n)
	}
	b := s.Dial(t, servertest.MemCache())
	if got := testkit.Names(t, b, "/big"); len(got) != n {
		t.Fatalf("another client lists %d files, want %d", len(got), n)
	}
	if st := a.Client().Stats(); st.Settled != n {
		t.Fatalf("%d settled, want %d", st.Settled, n)
	}
	if !bytes.Equal(testkit.ReadFile(t, b, "/big/1099"), nil) {
		t.Fatal("an empty file made here has data")
	}
}

// BUG (library API): a file this client removes while it has it open can
// no longer be read or written through the open File: ReadAt and WriteAt
// fail with ESTALE, in every mode (made here under a directory
// delegation, created at the server, with and without delegations,
// synced or not). Node.files says "writes this client made to a file it
// removed stay readable through them until the last is closed", and
// POSIX lets an unlinked open file be used; the FUSE mount gets that by
// renaming such a file to a hidden name (silly rename, mount/fs.go), but
// a program using the library's path API directly does not.
func TestRemovedOpenFile(t *testing.T) {
	t.Skip("BUG: an open File whose name this client removed fails with ESTALE (read and write); see the comment")
	for _, noDir := range []bool{false, true} {
		s := servertest.Start(t)
		a := s.Dial(t, func(o *client.Options) { o.NoDirDelegations = noDir })
		testkit.Must(t, a.Mkdir("/d", 0o755))
		f := testkit.Create(t, a, "/d/open", []byte("still readable"))
		testkit.Must(t, a.Remove("/d/open"))
		p := make([]byte, 14)
		if n, err := f.ReadAt(p, 0); err != nil || string(p[:n]) != "still readable" {
			t.Fatalf("NoDirDelegations %v: read of an open file removed here: %q %v", noDir, p[:n], err)
		}
		if _, err := f.WriteAt([]byte("S"), 0); err != nil {
			t.Fatalf("NoDirDelegations %v: write to an open file removed here: %v", noDir, err)
		}
		testkit.Must(t, f.Close())
	}
}
