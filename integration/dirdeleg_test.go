package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// Under a delegation on a directory a client makes (and renames) files
// without asking the server; files made and removed meanwhile never reach
// it. Another
// client's listing recalls the delegation: it sees exactly the files left,
// with every byte written to them, and the holder's next creates there go
// to the server (it backs off a directory another client uses).
func TestDirDelegation(t *testing.T) {
	tmp := t.TempDir()
	srv := startServer(t, filepath.Join(tmp, "srv"))
	a := dial(t, srv.addr, filepath.Join(tmp, "a"), 64<<20)
	b := dial(t, srv.addr, "mem", 64<<20)
	if err := a.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	before := a.Client().Stats()
	var want []string
	for i := range 20 {
		name := fmt.Sprintf("/d/f%02d", i)
		testkit.WriteFile(t, a, name, testkit.Pattern(1000+i, byte(i)))
		if i%2 == 1 {
			if err := a.Remove(name); err != nil {
				t.Fatal(err)
			}
		} else {
			want = append(want, fmt.Sprintf("f%02d", i))
		}
	}
	// A made file renamed to a free name stays made here, under its new name.
	if err := a.Rename("/d/f00", "/d/g00"); err != nil {
		t.Fatal(err)
	}
	want = append(want[1:], "g00")
	// O_EXCL on a name made here fails as at the server.
	if _, err := a.Open("/d/f02", syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL, 0o644); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("exclusive create of a name made here: %v", err)
	}
	st := a.Client().Stats()
	if made, dropped, settled := st.MadeHere-before.MadeHere, st.MadeDropped-before.MadeDropped, st.Settled-before.Settled; made != 20 || dropped != 10 || settled != 0 {
		t.Fatalf("made %d, dropped %d, settled %d: want 20 made here, 10 removed before the server knew them, none sent", made, dropped, settled)
	}
	if rpcs := st.RPCs - before.RPCs; rpcs > 10 {
		t.Fatalf("%d RPCs for 20 creates, 10 removes and a rename under a directory delegation", rpcs)
	}
	if got := testkit.Names(t, b, "/d"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("another client lists %v, want %v", got, want)
	}
	for _, name := range want {
		i := 0
		fmt.Sscanf(name[1:], "%d", &i)
		if data := testkit.ReadFile(t, b, "/d/"+name); !bytes.Equal(data, testkit.Pattern(1000+i, byte(i))) {
			t.Fatalf("%s: another client read %d bytes, not what was written", name, len(data))
		}
	}
	if st := a.Client().Stats(); st.Settled-before.Settled != 10 {
		t.Fatalf("%d files created at the server, want the 10 left", st.Settled-before.Settled)
	}
	// Recalled: the next create asks the server, which b sees at once.
	testkit.WriteFile(t, a, "/d/late", []byte("late"))
	if st := a.Client().Stats(); st.MadeHere-before.MadeHere != 20 {
		t.Fatalf("a made a file in a directory just recalled from it")
	}
	if got := string(testkit.ReadFile(t, b, "/d/late")); got != "late" {
		t.Fatalf("read %q", got)
	}
	// A directory another client has cached is not delegated (hoard
	// server --dir-delegations private, the default).
	if err := a.Mkdir("/e", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadDir("/e"); err != nil {
		t.Fatal(err)
	}
	made := a.Client().Stats().MadeHere
	testkit.WriteFile(t, a, "/e/x", []byte("x"))
	if a.Client().Stats().MadeHere != made {
		t.Fatal("a made a file in a directory another client has cached")
	}
}

// Files made under a directory delegation are durable once fsync returns,
// and the others are reclaimed after a server restart, in the grace
// period: both are there for another client afterwards.
func TestDirDelegationRestart(t *testing.T) {
	tmp := t.TempDir()
	srv := startServer(t, filepath.Join(tmp, "srv"))
	a := dial(t, srv.addr, filepath.Join(tmp, "a"), 64<<20)
	if err := a.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, a, "/d/closed", []byte("closed only"))
	f, err := a.Create("/d/synced")
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("synced"))
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if st := a.Client().Stats(); st.MadeHere != 2 || st.Settled != 2 {
		t.Fatalf("made %d, settled %d: fsync must create the file and its directory's earlier ones", st.MadeHere, st.Settled)
	}
	f.Close()
	testkit.WriteFile(t, a, "/d/after", []byte("made after the fsync"))
	srv.kill9()
	srv.restart()
	b := dial(t, srv.addr, "mem", 64<<20)
	for name, want := range map[string]string{"closed": "closed only", "synced": "synced", "after": "made after the fsync"} {
		if got := string(testkit.ReadFile(t, b, "/d/"+name)); got != want {
			t.Fatalf("after the restart %s holds %q, want %q", name, got, want)
		}
	}
}

// A holder cut off for longer than its lease loses the directory's
// delegation: the other client goes on without its files, and the files'
// writes are kept in lost/ with their paths, fsync saying EIO.
func TestDirDelegationLost(t *testing.T) {
	const lease = 2 * time.Second
	hc := cutOffHolder(t, lease)
	a, b, link, cacheDir, f := hc.a, hc.b, hc.link, hc.cacheDir, hc.f
	defer f.Close()
	if st := a.Client().Stats(); st.MadeHere != 1 || st.Settled != 0 {
		t.Fatalf("made %d, settled %d", st.MadeHere, st.Settled)
	}
	link.Pause(true)
	start := time.Now()
	testkit.WriteFile(t, b, "/d/y", []byte("y"))
	// The recall waits out the lease, then the break of the holder's
	// promise on the directory the server's break timeout (2 s).
	if took := time.Since(start); took > lease+4*time.Second {
		t.Fatalf("b waited %v for a cut-off holder (lease %v)", took, lease)
	}
	t.Logf("b waited %v", time.Since(start))
	link.Pause(false)
	t.Logf("unpaused")
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync of a file made under a lost directory delegation: %v, want EIO", err)
	}
	kept, err := lost.List(cacheDir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/d/x" || kept[0].Size != 5000 {
		t.Fatalf("lost data: %+v %v", kept, err)
	}
	ents, err := b.ReadDir("/d")
	if err != nil || len(ents) != 1 || ents[0].Name != "y" {
		t.Fatalf("listing after the holder lost its delegation: %v %v", ents, err)
	}
	if _, err := a.Stat("/d/x"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the holder still finds the file it lost: %v", err)
	}
	t.Logf("end")
}

// What POSIX says of a directory holds for one whose files are made
// here: making, renaming and removing them moves its mtime and ctime,
// and a directory with files made in it is not empty, to rmdir or to a
// rename over it (pjdfstest found each).
func TestDirDelegationPOSIX(t *testing.T) {
	tmp := t.TempDir()
	srv := startServer(t, filepath.Join(tmp, "srv"))
	a := dial(t, srv.addr, filepath.Join(tmp, "a"), 64<<20)
	for _, d := range []string{"/p", "/q"} {
		if err := a.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	changed := func(what string, change func()) {
		t.Helper()
		before, err := a.Stat("/p")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		change()
		after, err := a.Stat("/p")
		if err != nil {
			t.Fatal(err)
		}
		if !after.Mtime.After(before.Mtime) || !after.Ctime.After(before.Ctime) {
			t.Fatalf("%s: the directory's mtime %v -> %v, ctime %v -> %v; want both later", what, before.Mtime, after.Mtime, before.Ctime, after.Ctime)
		}
	}
	made := a.Client().Stats().MadeHere
	changed("a create", func() { testkit.WriteFile(t, a, "/p/x", []byte("x")) })
	changed("a create", func() { testkit.WriteFile(t, a, "/p/y", []byte("y")) })
	changed("a rename", func() {
		if err := a.Rename("/p/y", "/p/z"); err != nil {
			t.Fatal(err)
		}
	})
	changed("a remove", func() {
		if err := a.Remove("/p/z"); err != nil {
			t.Fatal(err)
		}
	})
	if st := a.Client().Stats(); st.MadeHere-made != 2 || st.Settled != 0 {
		t.Fatalf("made %d, settled %d: the test wants both files made here, unsent", st.MadeHere-made, st.Settled)
	}
	if err := a.Remove("/p"); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("rmdir of a directory with a file made in it: %v, want ENOTEMPTY", err)
	}
	if err := a.Rename("/q", "/p"); !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("rename over a directory with a file made in it: %v, want ENOTEMPTY or EEXIST", err)
	}
	b := dial(t, srv.addr, "mem", 64<<20)
	if got := string(testkit.ReadFile(t, b, "/p/x")); got != "x" {
		t.Fatalf("another client reads %q", got)
	}
}

// A settle sent while the server is down goes through once it is back,
// in a new session: the grants of its reply come from before that
// session and are returned, so the made files' writes, which nothing
// covers then, are stored at once. They were left for the flusher's age
// bound, and another client read the files empty meanwhile.
func TestDirDelegationSettleAcrossRestart(t *testing.T) {
	srv, a := madeHere(t)
	srv.kill9()
	stores := a.Client().Stats().Stores
	calling := make(chan struct{})
	made := make(chan error, 1)
	go func() {
		close(calling)
		made <- a.Mkdir("/d/sub", 0o755) // settles /d first
	}()
	// The settle is under way before the restart begins: from the call
	// to its request nothing waits but for the server. (No counter shows
	// a call waiting for the server; one would prove it.)
	<-calling
	srv.restart()
	if err := <-made; err != nil {
		t.Fatal(err)
	}
	// Nothing covers the made file's writes after the restart: they are
	// stored at once, not left to the flusher.
	if st := a.Client().Stats(); st.Settled != 1 || st.DirtyBytes != 0 || st.Stores != stores+1 {
		t.Fatalf("%d files settled (want 1), then %d dirty bytes and %d stores (want 0 and 1)", st.Settled, st.DirtyBytes, st.Stores-stores)
	}
	b := dial(t, srv.addr, "mem", 64<<20)
	if got := string(testkit.ReadFile(t, b, "/d/x")); got != "made here" {
		t.Fatalf("another client reads %q after the settle across the restart", got)
	}
}

// A file made, written and removed under a directory delegation leaves
// nothing behind: not in the cache (its space is free at once), and not
// in lost/ after a restart of the client. Nor does one removed while open,
// once it is closed.
func TestDirDelegationChurnLeavesNothing(t *testing.T) {
	tmp := t.TempDir()
	srv := startServer(t, filepath.Join(tmp, "srv"))
	cacheDir := filepath.Join(tmp, "a")
	a := dial(t, srv.addr, cacheDir, 64<<20)
	if err := a.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	var base int64
	for i := range 30 {
		name := fmt.Sprintf("/d/f%02d", i)
		testkit.WriteFile(t, a, name, testkit.Pattern(64<<10, byte(i)))
		if err := a.Remove(name); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			base = a.Client().Stats().Files // the directory's, with its delegation
		}
	}
	open, err := a.Create("/d/open")
	if err != nil {
		t.Fatal(err)
	}
	open.Write(testkit.Pattern(10000, 7))
	if err := a.Remove("/d/open"); err != nil {
		t.Fatal(err)
	}
	if st := a.Client().Stats(); st.Files != base+1 {
		t.Fatalf("the cache holds %d files more with one removed while open, want that one", st.Files-base)
	}
	if err := open.Close(); err != nil {
		t.Fatal(err)
	}
	st := a.Client().Stats()
	if st.MadeHere != 31 || st.MadeDropped != 31 || st.Settled != 0 {
		t.Fatalf("made %d, dropped %d, settled %d: want 31 files made and removed here, none sent", st.MadeHere, st.MadeDropped, st.Settled)
	}
	if st.Files != base || st.BytesCached != 0 {
		t.Fatalf("the cache still holds %d files, %d bytes of files removed here", st.Files-base, st.BytesCached)
	}
	a.Close()
	dial(t, srv.addr, cacheDir, 64<<20)
	if kept, err := lost.List(cacheDir); err != nil || len(kept) != 0 {
		t.Fatalf("a restart kept writes to removed files as lost: %d entries, %v", len(kept), err)
	}
}

// A kernel may cache a file made here (its attributes, its pages) for as
// long as its directory's promise lasts: nobody else can reach the file
// before a settle hands it to the server. Each open, read and stat of
// such a file through a mount asked the mount again (PromiseLeft was 0).
func TestDirDelegationMadeFileCached(t *testing.T) {
	srv, a := madeHere(t)
	st, err := a.Stat("/d/x")
	if err != nil {
		t.Fatal(err)
	}
	dst, err := a.Stat("/d")
	if err != nil {
		t.Fatal(err)
	}
	n, dir := a.Client().FIDs().Node(st.FID), a.Client().FIDs().Node(dst.FID)
	dirLeft := a.Client().FIDs().PromiseLeft(dir)
	if left := a.Client().FIDs().PromiseLeft(n); !n.Valid() || left < time.Minute || left > dirLeft {
		t.Fatalf("a file made here: valid %v, cachable for %v; want valid, for its directory's %v", n.Valid(), left, dirLeft)
	}
	b := dial(t, srv.addr, "mem", 64<<20)
	testkit.WriteFile(t, b, "/d/x", []byte("changed by b"))
	if n.Valid() || a.Client().FIDs().PromiseLeft(n) > 0 {
		t.Fatal("the maker still caches a file another client changed since")
	}
	if got := string(testkit.ReadFile(t, a, "/d/x")); got != "changed by b" {
		t.Fatalf("the maker reads %q after another client changed the file", got)
	}
}

// madeHere starts a server, and a client with a disk cache that makes
// /d/x ("made here") in its new directory /d without telling the server.
func madeHere(t *testing.T) (*serverProc, *pathfs.FS) {
	t.Helper()
	tmp := t.TempDir()
	srv := startServer(t, filepath.Join(tmp, "srv"))
	a := dial(t, srv.addr, filepath.Join(tmp, "a"), 64<<20)
	if err := a.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, a, "/d/x", []byte("made here"))
	if st := a.Client().Stats(); st.MadeHere != 1 || st.Settled != 0 {
		t.Fatalf("made %d, settled %d: the test wants the file made here, unsent", st.MadeHere, st.Settled)
	}
	return srv, a
}

// A file the server knows, removed under a directory delegation, goes
// there at the next settle, with the files made meanwhile, in one request:
// no Remove of its own. Nobody finds it after the remove returned: not
// another client listing the directory (which recalls the directory's
// delegation), nor one asking for the file by FID (which recalls the
// file's, and that settles first).
func TestDirDelegationRemoveLater(t *testing.T) {
	tmp := t.TempDir()
	srv := startServer(t, filepath.Join(tmp, "srv"))
	a := dial(t, srv.addr, filepath.Join(tmp, "a"), 64<<20)
	b := dial(t, srv.addr, "mem", 64<<20)
	if err := a.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	fids := map[string]node.FID{}
	for i := range 6 {
		name := fmt.Sprintf("/d/f%d", i)
		f, err := a.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(testkit.Pattern(3000, byte(i)))
		if err := f.Sync(); err != nil { // created and stored at the server
			t.Fatal(err)
		}
		fids[name] = f.FID()
		f.Close()
	}
	before := a.Client().Stats()
	if before.Settled != 6 {
		t.Fatalf("%d files created at the server by their fsyncs, want 6", before.Settled)
	}
	for i := range 4 {
		if err := a.Remove(fmt.Sprintf("/d/f%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WriteFile(t, a, "/d/f0", []byte("again")) // a name removed here, made again
	if _, err := a.Stat("/d/f1"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat of a file removed here: %v", err)
	}
	st := a.Client().Stats()
	if removed, rpcs := st.RemovedHere-before.RemovedHere, st.RPCs-before.RPCs; removed != 4 || rpcs != 0 {
		t.Fatalf("%d files removed here with %d RPCs, want 4 with none", removed, rpcs)
	}
	if _, err := b.Client().FIDs().Status(b.Client().FIDs().Node(fids["/d/f1"])); !errors.Is(err, syscall.ESTALE) && !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("another client asking for a file removed here by FID: %v, want it gone", err)
	}
	// That settle also made f0 again and removed the others.
	if got := testkit.Names(t, b, "/d"); fmt.Sprint(got) != "[f0 f4 f5]" {
		t.Fatalf("another client lists %v, want [f0 f4 f5]", got)
	}
	if data := string(testkit.ReadFile(t, b, "/d/f0")); data != "again" {
		t.Fatalf("f0 made again reads %q", data)
	}
	if data := testkit.ReadFile(t, b, "/d/f4"); !bytes.Equal(data, testkit.Pattern(3000, 4)) {
		t.Fatal("f4 lost its data")
	}
	if st := a.Client().Stats(); st.Settled-before.Settled != 1 || st.Files > before.Files-3 {
		t.Fatalf("%d created at the server, %d files cached (from %d): want 1, and the removed ones gone from the cache",
			st.Settled-before.Settled, st.Files, before.Files)
	}
}

// A file removed under a directory delegation that the server revoked
// before it heard of the remove (its holder cut off past the lease) stays
// at the server, whole: another client reads it, the holder finds it
// again once it hears of the revocation, and nothing of it is kept as
// lost.
func TestDirDelegationRemoveLaterLost(t *testing.T) {
	hc := cutOffHolder(t, 2*time.Second)
	a, b, link, cacheDir, f := hc.a, hc.b, hc.link, hc.cacheDir, hc.f
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := a.Remove("/d/x"); err != nil {
		t.Fatal(err)
	}
	if st := a.Client().Stats(); st.RemovedHere != 1 {
		t.Fatalf("%d files removed here, want 1", st.RemovedHere)
	}
	link.Pause(true)
	if data := testkit.ReadFile(t, b, "/d/x"); !bytes.Equal(data, testkit.Pattern(5000, 1)) {
		t.Fatalf("another client read %d bytes of a file whose remove never reached the server", len(data))
	}
	link.Pause(false)
	var st node.Status
	var err error
	if !poll.Until(20*time.Second, func() bool {
		st, err = a.Stat("/d/x")
		return err == nil && st.Size == 5000
	}) {
		t.Fatalf("the holder does not find the file again after the revocation: %+v %v", st, err)
	}
	if data := testkit.ReadFile(t, a, "/d/x"); !bytes.Equal(data, testkit.Pattern(5000, 1)) {
		t.Fatalf("the holder reads %d bytes of the file back at the server", len(data))
	}
	if kept, err := lost.List(cacheDir); err != nil || len(kept) != 0 {
		t.Fatalf("lost data: %+v %v", kept, err)
	}
}

// holderCase is a client (a) that reaches the server through a relay
// (link) the test can cut, with /d/x made and 5,000 bytes written to it
// under a directory delegation (f, open), and another client (b).
type holderCase struct {
	a, b     *pathfs.FS
	link     *testkit.Relay
	cacheDir string
	f        *client.File
}

func cutOffHolder(t *testing.T, lease time.Duration) holderCase {
	t.Helper()
	tmp := t.TempDir()
	srv := startServer(t, filepath.Join(tmp, "srv"), "--lease", lease.String())
	hc := holderCase{link: testkit.StartRelay(t, srv.addr), cacheDir: filepath.Join(tmp, "a")}
	a, err := cellDial(client.Options{Server: hc.link.Addr(), CacheDir: hc.cacheDir, CacheSize: 64 << 20, NoDataChannel: true, RPCTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	hc.a, hc.b = a, dial(t, srv.addr, "mem", 64<<20)
	if err := a.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if hc.f, err = a.Create("/d/x"); err != nil {
		t.Fatal(err)
	}
	hc.f.Write(testkit.Pattern(5000, 1))
	return hc
}

// FIDs a client reserved are pruned at the server's second start after:
// a client that kept them through two restarts made files with them that
// the settle then refused, and their data went to lost/ (seen in a soak:
// its own open of a file it had just closed found nothing). A client
// forgets its reservations when the server restarts.
func TestDirDelegationAfterTwoRestarts(t *testing.T) {
	tmp := t.TempDir()
	srv := startServer(t, filepath.Join(tmp, "srv"))
	cache := filepath.Join(tmp, "a")
	a := dial(t, srv.addr, cache, 64<<20)
	if err := a.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, a, "/d/first", []byte("first")) // reserves a batch, uses one
	for range 2 {
		srv.kill9()
		srv.restart()
		// Wait for the client's reconnection: a listing succeeds.
		if _, err := a.ReadDir("/"); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WriteFile(t, a, "/d/later", []byte("made after two restarts"))
	b := dial(t, srv.addr, "mem", 64<<20)
	if got := string(testkit.ReadFile(t, b, "/d/later")); got != "made after two restarts" {
		t.Fatalf("the other client read %q", got)
	}
	if got := string(testkit.ReadFile(t, a, "/d/later")); got != "made after two restarts" {
		t.Fatalf("the maker read %q", got)
	}
	if kept, _ := lost.List(cache); len(kept) != 0 {
		t.Fatalf("%d files in lost/: %+v", len(kept), kept)
	}
}
