package integration

import (
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// A listing through the node API (what the mount's READDIRPLUS does)
// learns every entry's status in bulk: looking the entries up afterwards
// costs no round trip, where it cost one each.
func TestListingLearnsStatuses(t *testing.T) {
	srv := startServer(t, t.TempDir())
	w := dial(t, srv.addr, "mem", 64<<20)
	if err := w.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		testkit.WriteFile(t, w, fmt.Sprintf("/d/f%03d", i), []byte("x"))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	c := dial(t, srv.addr, t.TempDir(), 64<<20)
	d, _, err := c.Client().Nodes().Lookup(nodeRoot(t, c.Client().Nodes()), "d")
	if err != nil {
		t.Fatal(err)
	}
	ents, err := c.Client().Nodes().ReadDir(d)
	if err != nil || len(ents) != n {
		t.Fatalf("listed %d entries (%v), want %d", len(ents), err, n)
	}
	before := c.Client().Stats().RPCs
	for _, e := range ents {
		if _, st, err := c.Client().Nodes().Lookup(d, e.Name); err != nil || st.FID != e.FID || st.Size != 1 {
			t.Fatalf("lookup %s: %+v %v", e.Name, st, err)
		}
	}
	if rpcs := c.Client().Stats().RPCs - before; rpcs != 0 {
		t.Fatalf("looking up %d listed entries took %d round trips, want none", n, rpcs)
	}
}

// A reader that opens a directory's small files in the order of its
// listing (find | xargs cat, tar) gets the files after the one it opens
// fetched ahead, which its next opens find whole in the cache. Opens out
// of order fetch nothing ahead.
func TestReadAheadAcrossFiles(t *testing.T) {
	srv := startServer(t, t.TempDir())
	w := dial(t, srv.addr, "mem", 64<<20)
	if err := w.Mkdir("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := range n {
		testkit.WriteFile(t, w, fmt.Sprintf("/d/f%03d", i), testkit.Pattern(1000+i, byte(i)))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	read := func(c *pathfs.FS, d *client.Node, name string) {
		t.Helper()
		n, _, err := c.Client().Nodes().Lookup(d, name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := c.Client().Nodes().Open(n, d, name, "/d/"+name, os.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
		var i int
		fmt.Sscanf(name, "f%d", &i)
		if err != nil || string(got) != string(testkit.Pattern(1000+i, byte(i))) {
			t.Fatalf("read %s: %d bytes (%v)", name, len(got), err)
		}
	}
	listed := func() (*pathfs.FS, *client.Node, []client.DirEntry) {
		c := dial(t, srv.addr, t.TempDir(), 64<<20)
		d, _, err := c.Client().Nodes().Lookup(nodeRoot(t, c.Client().Nodes()), "d")
		if err != nil {
			t.Fatal(err)
		}
		ents, err := c.Client().Nodes().ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		return c, d, ents
	}

	size := func(names ...client.DirEntry) (total int64) {
		for _, e := range names {
			var i int
			fmt.Sscanf(e.Name, "f%d", &i)
			total += int64(1000 + i)
		}
		return total
	}
	c, d, ents := listed()
	for _, e := range ents[:3] {
		read(c, d, e.Name)
	}
	// The third open in order fetches the next eight files ahead.
	if !poll.Until(5*time.Second, func() bool { return c.Client().Stats().BytesFetched >= size(ents[:11]...) }) {
		t.Fatalf("three opens in listing order fetched %d bytes, want the next eight files too (%d)", c.Client().Stats().BytesFetched, size(ents[:11]...))
	}
	misses := c.Client().Stats().Misses
	for _, e := range ents[3:11] {
		read(c, d, e.Name)
	}
	if m := c.Client().Stats().Misses - misses; m != 0 {
		t.Fatalf("files fetched ahead missed the cache %d times", m)
	}

	c, d, ents = listed()
	for i := len(ents) - 1; i >= 0; i -= 3 {
		read(c, d, ents[i].Name)
	}
	var want int64
	for i := len(ents) - 1; i >= 0; i -= 3 {
		want += size(ents[i])
	}
	// Fetches ahead would be started by the opens and land a little
	// later; the client counts no read-ahead started, so only a bounded
	// wait can tell that none comes.
	poll.Holds(t, 200*time.Millisecond, fmt.Sprintf("opens out of order fetch just the %d bytes they read", want),
		func() bool { return c.Client().Stats().BytesFetched == want })
}

// nodeRoot is k's root directory, failing the test on error.
func nodeRoot(t testing.TB, k *client.Nodes) *client.Node {
	t.Helper()
	n, err := k.Root()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
