package client_test

import (
	"bytes"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server"
)

// A cached file is read again without the network while its promise
// holds; another client's change breaks the promise, and the next open
// reads the new data (close-to-open).
func TestCallbackBreak(t *testing.T) {
	for _, deleg := range []bool{true, false} {
		name := "delegations"
		if !deleg {
			name = "no-delegations"
		}
		t.Run(name, func(t *testing.T) {
			s := servertest.Start(t)
			var invalidated atomic.Int64
			a := s.Dial(t, func(o *client.Options) {
				o.NoDelegations = !deleg
				o.OnInvalidate = func(fids []node.FID) { invalidated.Add(int64(len(fids))) }
			})
			b := s.Dial(t, servertest.MemCache(), func(o *client.Options) { o.NoDelegations = !deleg })
			v1 := testkit.Pattern(300<<10, 1)
			testkit.WriteFile(t, b, "/f", v1)
			testkit.WantFile(t, a, "/f", v1)
			before := a.Client().Stats()
			testkit.WantFile(t, a, "/f", v1)
			after := a.Client().Stats()
			if after.BytesFetched != before.BytesFetched || after.Revalidations != before.Revalidations {
				t.Fatalf("a re-read under a promise fetched %d bytes, revalidated %d times",
					after.BytesFetched-before.BytesFetched, after.Revalidations-before.Revalidations)
			}
			if after.Promises == 0 {
				t.Fatal("no promise held after reading")
			}
			v2 := testkit.Pattern(200<<10, 2)
			testkit.WriteFile(t, b, "/f", v2)
			testkit.WantFile(t, a, "/f", v2)
			st := a.Client().Stats()
			if st.Breaks+st.Recalls == 0 || invalidated.Load()+st.Recalls == 0 {
				t.Fatalf("the reader saw the new data without a break or recall: %+v", st)
			}
			if st.Dropped == 0 {
				t.Fatal("the old version's chunks were not dropped")
			}
			if !deleg && (st.LocalOpens != 0 || b.Client().Stats().WriteDelegations != 0) {
				t.Fatalf("NoDelegations: %d local opens, %d write delegations", st.LocalOpens, b.Client().Stats().WriteDelegations)
			}
			// An attribute change is seen too.
			testkit.Must(t, b.Chmod("/f", 0o604))
			waitFor(t, 5*time.Second, func() bool {
				st, err := a.Stat("/f")
				return err == nil && st.Mode&0o777 == 0o604
			}, func() string { return "the reader never saw the new mode" })
			// A removal is seen too.
			testkit.Must(t, b.Remove("/f"))
			waitFor(t, 5*time.Second, func() bool {
				_, err := a.Stat("/f")
				return errnoOf(err) == syscall.ENOENT
			}, func() string { return "the reader still finds a removed file" })
		})
	}
}

// Under a write delegation, opens, writes and closes cost no RPC and the
// writes stay in the cache; another client's open recalls the
// delegation and reads every byte; truncation by name stays local too.
func TestWriteBackAndRecall(t *testing.T) {
	s := servertest.Start(t)
	var recalled sync.Map
	a := s.Dial(t, func(o *client.Options) {
		o.FlushAge = time.Hour
		o.OnRecall = func(fid node.FID) { recalled.Store(fid, true) }
	})
	b := s.Dial(t, servertest.MemCache())
	testkit.Must(t, b.Mkdir("/shared", 0o755))
	// b has the directory cached: a's create goes to the server.
	_, err := b.ReadDir("/shared")
	testkit.Must(t, err)
	v1 := testkit.Pattern(1<<20+5, 1)
	testkit.WriteFile(t, a, "/shared/f", v1)
	if st := a.Client().Stats(); st.WriteDelegations < 1 || st.DirtyBytes != int64(len(v1)) || st.Stores != 0 {
		t.Fatalf("after a close under a write delegation: %d write delegations, %d dirty bytes, %d stores", st.WriteDelegations, st.DirtyBytes, st.Stores)
	}
	before := a.Client().Stats()
	f, err := a.Open("/shared/f", os.O_WRONLY, 0)
	testkit.Must(t, err)
	_, err = f.WriteAt([]byte("XYZ"), 10)
	testkit.Must(t, err)
	testkit.Must(t, f.Flush()) // under the delegation: stays in the cache
	testkit.Must(t, f.Close())
	after := a.Client().Stats()
	if after.RPCs != before.RPCs || after.LocalOpens != before.LocalOpens+1 || after.LocalCloses != before.LocalCloses+1 {
		t.Fatalf("open, write, close under the delegation: %d RPCs, %d local opens, %d local closes",
			after.RPCs-before.RPCs, after.LocalOpens-before.LocalOpens, after.LocalCloses-before.LocalCloses)
	}
	before = a.Client().Stats()
	testkit.Must(t, a.Truncate("/shared/f", 512<<10))
	if after := a.Client().Stats(); after.RPCs != before.RPCs {
		t.Fatalf("truncate under the delegation: %d RPCs", after.RPCs-before.RPCs)
	}
	if st, err := a.Stat("/shared/f"); err != nil || st.Size != 512<<10 {
		t.Fatalf("the writer's own stat after truncating: %+v %v", st, err)
	}
	want := slices.Clone(v1[:512<<10])
	copy(want[10:], "XYZ")
	testkit.WantFile(t, b, "/shared/f", want)
	st := a.Client().Stats()
	if st.Recalls < 1 || st.DirtyBytes != 0 || st.Stores == 0 {
		t.Fatalf("after the recall: %d recalls, %d dirty bytes, %d stores", st.Recalls, st.DirtyBytes, st.Stores)
	}
	n := 0
	recalled.Range(func(any, any) bool { n++; return true })
	if n == 0 {
		t.Fatal("OnRecall heard of no recall")
	}
	// The writer's next change is seen by the reader's next open.
	testkit.WriteFile(t, a, "/shared/f", []byte("v2"))
	testkit.WantFile(t, b, "/shared/f", []byte("v2"))
	// And the reader's change by the writer.
	testkit.WriteFile(t, b, "/shared/f", []byte("v3"))
	testkit.WantFile(t, a, "/shared/f", []byte("v3"))
}

// Sync stores at once and makes the data visible; Close without a
// delegation stores too; a client's Close stores what it still holds.
func TestSyncAndCloseStore(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour })
	b := s.Dial(t, servertest.MemCache())
	f := testkit.Create(t, a, "/s", testkit.Pattern(100<<10, 3))
	stores := a.Client().Stats().Stores
	testkit.Must(t, f.Sync())
	if st := a.Client().Stats(); st.Stores != stores+1 || st.DirtyBytes != 0 {
		t.Fatalf("sync: %d stores, %d dirty bytes", st.Stores-stores, st.DirtyBytes)
	}
	if st, err := b.Stat("/s"); err != nil || st.Size != 100<<10 {
		t.Fatalf("another client's stat after sync: %+v %v", st, err)
	}
	_, err := f.Write([]byte("tail"))
	testkit.Must(t, err)
	testkit.Must(t, f.Close())
	testkit.WriteFile(t, a, "/t", []byte("kept until close"))
	if a.Client().Stats().DirtyBytes == 0 {
		t.Fatal("nothing dirty under the write delegation")
	}
	testkit.Must(t, a.Close())
	want := append(testkit.Pattern(100<<10, 3), "tail"...)
	testkit.WantFile(t, b, "/s", want)
	testkit.WantFile(t, b, "/t", []byte("kept until close"))
}

// Without delegations every close stores and no open is local; the data
// of each close is seen by the next open elsewhere.
func TestNoDelegations(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t, func(o *client.Options) { o.NoDelegations = true })
	b := s.Dial(t, servertest.MemCache(), func(o *client.Options) { o.NoDelegations = true })
	for i := range 5 {
		testkit.WriteFile(t, a, "/n", testkit.Pattern(10<<10, byte(i)))
		testkit.WantFile(t, b, "/n", testkit.Pattern(10<<10, byte(i)))
	}
	st := a.Client().Stats()
	if st.Stores != 5 || st.LocalOpens != 0 || st.WriteDelegations != 0 || st.DirtyBytes != 0 {
		t.Fatalf("with NoDelegations: %+v", st)
	}
	// A truncation by name goes to the server at once.
	testkit.Must(t, a.Truncate("/n", 3))
	testkit.WantFile(t, b, "/n", testkit.Pattern(10<<10, 4)[:3])
}

// A server that grants no delegations (lease 0): the client asks for
// none, and everything still works.
func TestServerWithoutLeases(t *testing.T) {
	s := servertest.Start(t, servertest.WithConfig(func(c *server.Config) { c.Lease = 0 }))
	a := s.Dial(t)
	b := s.Dial(t, servertest.MemCache())
	testkit.Must(t, a.Mkdir("/d", 0o755))
	testkit.WriteFile(t, a, "/d/f", []byte("one"))
	testkit.WantFile(t, b, "/d/f", []byte("one"))
	if st := a.Client().Stats(); st.WriteDelegations+st.ReadDelegations != 0 || st.MadeHere != 0 || st.LocalOpens != 0 {
		t.Fatalf("delegations from a server without leases: %+v", st)
	}
}

// Many clients write and read one file in turn: each reads the last
// writer's bytes (delegations recalled from one to the next).
func TestDelegationRoundRobin(t *testing.T) {
	s := servertest.Start(t)
	var cs []*pathfs.FS
	for i := range 3 {
		opts := []servertest.ClientOpt{func(o *client.Options) { o.FlushAge = time.Hour }}
		if i%2 == 1 {
			opts = append(opts, servertest.MemCache())
		}
		cs = append(cs, s.Dial(t, opts...))
	}
	for round := range 6 {
		w := cs[round%len(cs)]
		data := testkit.Pattern(70<<10+round, byte(round))
		testkit.WriteFile(t, w, "/rr", data)
		for _, r := range cs {
			testkit.WantFile(t, r, "/rr", data)
		}
	}
	var recalls int64
	for _, c := range cs {
		recalls += c.Client().Stats().Recalls
	}
	if recalls == 0 {
		t.Fatal("no recalls between the writers")
	}
}

// Two opens of one file in one client share its cached writes; the
// second open is local.
func TestTwoOpensOneClient(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t)
	f, err := a.Create("/two")
	testkit.Must(t, err)
	g, err := a.Open("/two", os.O_RDWR, 0)
	testkit.Must(t, err)
	_, err = f.WriteAt([]byte("from f"), 0)
	testkit.Must(t, err)
	p := make([]byte, 6)
	if n, err := g.ReadAt(p, 0); n != 6 || string(p) != "from f" {
		t.Fatalf("the second open read %q %v", p[:n], err)
	}
	_, err = g.WriteAt([]byte("G"), 5)
	testkit.Must(t, err)
	testkit.Must(t, g.Close())
	testkit.Must(t, f.Close())
	b := s.Dial(t, servertest.MemCache())
	testkit.WantFile(t, b, "/two", []byte("from G"))
}

// A client that does not acknowledge a break in time (its OnInvalidate
// hangs) is reset by the server: its promises and delegations are void,
// and the writes it held under a write delegation are refused, kept in
// lost/, and reported by the file's next Sync: for a file the server
// created, and for one made here under a directory delegation.
func TestResetLosesDelegatedWrites(t *testing.T) {
	for _, made := range []bool{false, true} {
		name := "created-at-server"
		if made {
			name = "made-here"
		}
		t.Run(name, func(t *testing.T) { testResetLoses(t, made) })
	}
}

func testResetLoses(t *testing.T, made bool) {
	s := servertest.Start(t, servertest.WithConfig(func(c *server.Config) { c.BreakTimeout = 300 * time.Millisecond }))
	var hang atomic.Bool
	release := make(chan struct{})
	var once sync.Once
	unhang := func() { once.Do(func() { close(release) }) }
	dir := t.TempDir()
	a := s.Dial(t, servertest.InDir(dir), func(o *client.Options) {
		o.FlushAge = time.Hour
		o.NoDirDelegations = !made
		o.OnInvalidate = func([]node.FID) {
			if hang.Load() {
				<-release
			}
		}
	})
	t.Cleanup(unhang)
	b := s.Dial(t, servertest.MemCache())
	testkit.WriteFile(t, b, "/p", []byte("promised"))
	testkit.WantFile(t, a, "/p", []byte("promised"))
	testkit.Must(t, a.Mkdir("/own", 0o755))
	lostData := testkit.Pattern(40<<10, 9)
	f := testkit.Create(t, a, "/own/w", lostData)
	if st := a.Client().Stats(); st.DirtyBytes == 0 || made != (st.MadeHere > 0) {
		t.Fatalf("before the reset: %d dirty bytes, %d files made here", st.DirtyBytes, st.MadeHere)
	}
	hang.Store(true)
	testkit.WriteFile(t, b, "/p", []byte("changed")) // waits a break timeout for a
	waitFor(t, 10*time.Second, func() bool { return a.Client().Stats().Resets > 0 }, func() string { return "no reset after an unacknowledged break" })
	hang.Store(false)
	unhang()
	if !made {
		// Stored at once with the delegation it was made under: refused.
		waitFor(t, 10*time.Second, func() bool { return a.Client().Stats().DirtyBytes == 0 }, func() string {
			return "the refused writes stayed dirty"
		})
	}
	if err := f.Sync(); errnoOf(err) != syscall.EIO {
		t.Fatalf("sync after the writes were refused: %v, want EIO", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("a second sync: %v (the loss is reported once)", err)
	}
	testkit.Must(t, f.Close())
	kept, err := lost.List(dir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/own/w" || kept[0].Size != int64(len(lostData)) {
		t.Fatalf("kept: %+v %v", kept, err)
	}
	got, err := os.ReadFile(kept[0].Data)
	if err != nil || !bytes.Equal(got, lostData) {
		t.Fatalf("the kept data differs: %d bytes, %v", len(got), err)
	}
	if kept[0].Error == "" || kept[0].FID == "" || kept[0].Time.IsZero() {
		t.Fatalf("lost record: %+v", kept[0])
	}
	// The client goes on: the reader's change is seen, new writes work.
	testkit.WantFile(t, a, "/p", []byte("changed"))
	testkit.WriteFile(t, a, "/own/w2", []byte("after"))
	testkit.WantFile(t, b, "/own/w2", []byte("after"))
	if lost.Dir(dir) == lost.Dir("") {
		t.Fatal("a disk cache's lost directory is the memory cache's")
	}
}
