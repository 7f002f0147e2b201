package client_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// restartConfig gives clients time to come back within the grace period.
func restartConfig(c *server.Config) { c.Grace = 1500 * time.Millisecond }

// A server restart while a write delegation holds unstored writes: the
// holder reclaims it in the grace period and its data reaches a client
// that opens the file afterwards. Promises from before the restart are
// not trusted: a change after it is seen.
func TestServerRestartReclaim(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t, servertest.WithConfig(restartConfig))
	var invalidated atomic.Int64
	a := s.Dial(t, func(o *client.Options) {
		o.FlushAge = time.Hour
		o.NoDirDelegations = true
	})
	c := s.Dial(t, servertest.MemCache(), func(o *client.Options) {
		o.OnInvalidate = func(fids []node.FID) { invalidated.Add(int64(len(fids))) }
	})
	v1 := testkit.Pattern(1<<20, 4)
	testkit.WriteFile(t, a, "/r", v1)
	testkit.WriteFile(t, c, "/g", []byte("g1"))
	testkit.WantFile(t, c, "/g", []byte("g1"))
	if a.Client().Stats().DirtyBytes == 0 {
		t.Fatal("nothing dirty before the restart")
	}
	s.Restart()
	b := s.Dial(t, servertest.MemCache())
	testkit.WantFile(t, b, "/r", v1)
	if a.Client().Stats().Reclaimed < 1 {
		t.Fatal("no delegation was reclaimed")
	}
	testkit.WriteFile(t, b, "/g", []byte("g2"))
	testkit.WantFile(t, c, "/g", []byte("g2"))
	if invalidated.Load() == 0 {
		t.Fatal("OnInvalidate heard nothing of the restart")
	}
	// The holder goes on writing after the restart.
	testkit.WriteFile(t, a, "/r", []byte("after"))
	testkit.WantFile(t, b, "/r", []byte("after"))
}

// Files made under a directory delegation, synced or only closed, are
// created at the server after a restart, in the grace period.
func TestServerRestartSettles(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t, servertest.WithConfig(restartConfig))
	a := s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour })
	testkit.Must(t, a.Mkdir("/d", 0o755))
	testkit.WriteFile(t, a, "/d/closed", []byte("closed only"))
	f := testkit.Create(t, a, "/d/synced", []byte("synced"))
	testkit.Must(t, f.Sync())
	if st := a.Client().Stats(); st.MadeHere != 2 || st.Settled != 2 {
		t.Fatalf("made %d, settled %d: fsync must create the file and its directory's earlier ones", st.MadeHere, st.Settled)
	}
	testkit.Must(t, f.Close())
	testkit.WriteFile(t, a, "/d/after", []byte("made after the fsync"))
	s.Restart()
	b := s.Dial(t, servertest.MemCache())
	for name, want := range map[string]string{"closed": "closed only", "synced": "synced", "after": "made after the fsync"} {
		testkit.WantFile(t, b, "/d/"+name, []byte(want))
	}
	// Files made after the restart are made with new reservations.
	testkit.WriteFile(t, a, "/d/later", []byte("later"))
	testkit.WantFile(t, b, "/d/later", []byte("later"))
}

// A server that forgot its session key cannot tell the client's new
// session from a stranger's: the reclaim is refused and the writes made
// under the old delegation are kept in lost/.
func TestServerRestartWithoutKey(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t, servertest.WithConfig(restartConfig))
	dir := t.TempDir()
	a := s.Dial(t, servertest.InDir(dir), func(o *client.Options) {
		o.FlushAge = time.Hour
		o.NoDirDelegations = true
	})
	data := testkit.Pattern(30<<10, 2)
	f := testkit.Create(t, a, "/k", data)
	s.Stop()
	testkit.Must(t, os.Remove(filepath.Join(s.Dir(), "session.key")))
	s.Start()
	var kept []lost.Record
	waitFor(t, 10*time.Second, func() bool {
		kept, _ = lost.List(dir)
		return len(kept) > 0
	}, func() string { return "the unreclaimable writes were not kept in lost/" })
	if len(kept) != 1 || kept[0].Path != "/k" {
		t.Fatalf("lost: %+v", kept)
	}
	if got, _ := os.ReadFile(kept[0].Data); !bytes.Equal(got, data) {
		t.Fatal("the kept data differs from what was written")
	}
	if err := f.Sync(); errnoOf(err) != syscall.EIO {
		t.Fatalf("sync after the reclaim was refused: %v, want EIO", err)
	}
	testkit.Must(t, f.Close())
	if a.Client().Stats().Reclaimed != 0 {
		t.Fatal("a reclaim succeeded without the session key")
	}
	b := s.Dial(t, servertest.MemCache())
	if got := testkit.ReadFile(t, b, "/k"); len(got) != 0 {
		t.Fatalf("another client reads %d bytes that were never stored", len(got))
	}
}

// A request made while the server is down waits for it to come back,
// within the RPC timeout, and then succeeds.
func TestRequestWaitsForServer(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t, servertest.WithConfig(restartConfig))
	a := s.Dial(t)
	b := s.Dial(t, servertest.MemCache())
	testkit.WriteFile(t, b, "/w", []byte("waited for"))
	s.Stop()
	done := make(chan error, 1)
	var got []byte
	go func() {
		var err error
		got, err = testkit.TryRead(a, "/w")
		done <- err
	}()
	s.Start()
	select {
	case err := <-done:
		testkit.Must(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the request never finished")
	}
	if string(got) != "waited for" {
		t.Fatalf("read %q", got)
	}
	// Both clients are back: a change by one reaches the other.
	testkit.WriteFile(t, a, "/w", []byte("after"))
	testkit.WantFile(t, b, "/w", []byte("after"))
}

// File contents travel over the data channel, over gRPC when the server
// has none, and over gRPC when the client is told not to use it; across
// a restart too.
func TestDataPaths(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	cases := []struct {
		name      string
		serverOpt []servertest.Option
		noData    bool
	}{
		{"data-channel", nil, false},
		{"server-without", []servertest.Option{servertest.WithoutDataChannel()}, false},
		{"client-without", nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := servertest.Start(t, append(tc.serverOpt, servertest.WithConfig(restartConfig))...)
			opt := func(o *client.Options) { o.NoDataChannel = tc.noData; o.DataStreams = 2 }
			a := s.Dial(t, opt, func(o *client.Options) { o.NoDelegations = true })
			b := s.Dial(t, opt, servertest.MemCache())
			data := testkit.Pattern(2<<20+100, 3)
			testkit.WriteFile(t, a, "/dp", data)
			testkit.WantFile(t, b, "/dp", data)
			s.Restart()
			data2 := testkit.Pattern(1<<20, 4)
			testkit.WriteFile(t, a, "/dp", data2)
			testkit.WantFile(t, b, "/dp", data2)
		})
	}
}

// holderCase is a client (a) that reaches a server with a short lease
// through a relay (link) the test can pause to cut it off, with its
// cache in dir, file data on the relayed control connection (no data
// channel) and its writes left to the flusher for an hour; and another
// client (b) that reaches the server directly.
type holderCase struct {
	a, b *pathfs.FS
	link *testkit.Relay
	dir  string
}

// cutOffHolder starts a server whose leases last lease, and its holder
// case; opts change the holder's options.
func cutOffHolder(t *testing.T, lease time.Duration, opts ...servertest.ClientOpt) holderCase {
	t.Helper()
	s := servertest.Start(t, servertest.WithConfig(func(c *server.Config) {
		c.Lease = lease
		c.BreakTimeout = 500 * time.Millisecond
	}))
	hc := holderCase{link: testkit.StartRelay(t, s.Addr()), dir: t.TempDir()}
	hc.a = s.Dial(t, append([]servertest.ClientOpt{servertest.InDir(hc.dir), func(o *client.Options) {
		o.Server = hc.link.Addr()
		o.NoDataChannel = true
		o.FlushAge = time.Hour
	}}, opts...)...)
	hc.b = s.Dial(t, servertest.MemCache())
	return hc
}

// A holder cut off from the server for longer than its lease loses its
// write delegation: another client's open goes on after the lease, and
// the holder's writes, refused when it comes back, are kept in lost/.
func TestLeaseLapses(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	const lease = time.Second
	hc := cutOffHolder(t, lease, func(o *client.Options) { o.NoDirDelegations = true })
	f := testkit.Create(t, hc.a, "/lapse", testkit.Pattern(20<<10, 6))
	if hc.a.Client().Stats().WriteDelegations == 0 {
		t.Fatal("no write delegation")
	}
	hc.link.Pause(true)
	start := time.Now()
	if got := testkit.ReadFile(t, hc.b, "/lapse"); len(got) != 0 {
		t.Fatalf("the reader saw %d bytes the holder never stored", len(got))
	}
	if took := time.Since(start); took > lease+5*time.Second {
		t.Fatalf("the reader waited %v for a silent holder (lease %v)", took, lease)
	}
	hc.link.Pause(false)
	if err := f.Sync(); errnoOf(err) != syscall.EIO {
		t.Fatalf("sync after the delegation was revoked: %v, want EIO", err)
	}
	testkit.Must(t, f.Close())
	kept, err := lost.List(hc.dir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/lapse" {
		t.Fatalf("kept: %+v %v", kept, err)
	}
	// The holder works again.
	testkit.WriteFile(t, hc.a, "/lapse", []byte("again"))
	testkit.WantFile(t, hc.b, "/lapse", []byte("again"))
}

// Files made under a directory delegation that the server revoked while
// the holder was cut off are refused when it comes back: fsync says EIO,
// their writes are in lost/, and the other client's listing stands.
func TestDirDelegationLost(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	hc := cutOffHolder(t, time.Second)
	testkit.Must(t, hc.a.Mkdir("/d", 0o755))
	f := testkit.Create(t, hc.a, "/d/x", testkit.Pattern(5000, 1))
	if st := hc.a.Client().Stats(); st.MadeHere != 1 || st.Settled != 0 {
		t.Fatalf("made %d, settled %d", st.MadeHere, st.Settled)
	}
	hc.link.Pause(true)
	testkit.WriteFile(t, hc.b, "/d/y", []byte("y"))
	hc.link.Pause(false)
	if err := f.Sync(); errnoOf(err) != syscall.EIO {
		t.Fatalf("fsync of a file made under a lost directory delegation: %v, want EIO", err)
	}
	testkit.Must(t, f.Close())
	kept, err := lost.List(hc.dir)
	if err != nil || len(kept) != 1 || kept[0].Path != "/d/x" || kept[0].Size != 5000 {
		t.Fatalf("kept: %+v %v", kept, err)
	}
	ents, err := hc.b.ReadDir("/d")
	if err != nil || len(ents) != 1 || ents[0].Name != "y" {
		t.Fatalf("listing after the holder lost its delegation: %v %v", ents, err)
	}
	waitFor(t, 5*time.Second, func() bool {
		_, err := hc.a.Stat("/d/x")
		return errnoOf(err) == syscall.ENOENT
	}, func() string { return "the holder still finds the file it lost" })
	if got := testkit.Names(t, hc.a, "/d"); !slices.Equal(got, []string{"y"}) {
		t.Fatalf("the holder lists %v", got)
	}
}

// Many clients restart with the server at once: each comes back, and the
// last writer's data is what every one reads.
func TestRestartManyClients(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t, servertest.WithConfig(restartConfig))
	var cs []*pathfs.FS
	for i := range 4 {
		cs = append(cs, s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour }))
		testkit.WriteFile(t, cs[i], fmt.Sprintf("/m%d", i), testkit.Pattern(10<<10, byte(i)))
	}
	s.Restart()
	for i := range cs {
		for j := range cs {
			testkit.WantFile(t, cs[j], fmt.Sprintf("/m%d", i), testkit.Pattern(10<<10, byte(i)))
		}
	}
}

// A settle sent while the server is down goes through once it is back,
// in a new session: the files made here are there for another client.
func TestSettleAcrossRestart(t *testing.T) {
	t.Parallel() // waits, mostly: a grace period, a lease
	s := servertest.Start(t, servertest.WithConfig(restartConfig))
	a := s.Dial(t, func(o *client.Options) { o.FlushAge = time.Hour })
	testkit.Must(t, a.Mkdir("/d", 0o755))
	testkit.WriteFile(t, a, "/d/x", []byte("made here"))
	if st := a.Client().Stats(); st.MadeHere != 1 || st.Settled != 0 {
		t.Fatalf("made %d, settled %d", st.MadeHere, st.Settled)
	}
	s.Stop()
	made := make(chan error, 1)
	go func() { made <- a.Mkdir("/d/sub", 0o755) }() // settles /d first
	s.Start()
	select {
	case err := <-made:
		testkit.Must(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the mkdir never finished")
	}
	if st := a.Client().Stats(); st.Settled != 1 {
		t.Fatalf("%d files settled, want 1", st.Settled)
	}
	b := s.Dial(t, servertest.MemCache())
	testkit.WantFile(t, b, "/d/x", []byte("made here"))
	if got := testkit.Names(t, b, "/d"); fmt.Sprint(got) != "[sub x]" {
		t.Fatalf("another client lists %v", got)
	}
}
