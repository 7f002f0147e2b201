package integration

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// A volume's quota, set with hoard vol set: a writer on a mount is told
// cappedVolume starts a server with a volume "capped" mounted at /capped,
// and returns it with an admin's library client.
func cappedVolume(t *testing.T) (*serverProc, *pathfs.FS) {
	t.Helper()
	srv := startServer(t, t.TempDir())
	c := dial(t, srv.addr, "mem", 16<<20)
	if _, err := c.Admin().CreateVolume("capped"); err != nil {
		t.Fatal(err)
	}
	if err := c.Admin().MountVolume("/capped", "capped"); err != nil {
		t.Fatal(err)
	}
	return srv, c
}

// EDQUOT by the fsync whose store would take the volume past it (by the
// close, without write-back; never by a write, which only reaches the
// cache), and the bytes refused never reach the server; statfs in the
// volume shows the quota; removing a file makes room again.
func TestQuotaThroughMount(t *testing.T) {
	needFuse(t)
	srv, c := cappedVolume(t)
	hoard := func(args ...string) (string, int) {
		return run(t, append(args, "--server", srv.addr, "--cache", "")...)
	}
	for _, bad := range [][]string{{"vol", "set", "capped"}, {"vol", "set", "capped", "--quota", "lots"}} {
		if out, code := hoard(bad...); code != 2 {
			t.Fatalf("hoard %s: exit %d, want 2: %s", strings.Join(bad, " "), code, out)
		}
	}
	if out, code := hoard("vol", "set", "capped", "--quota", "4M"); code != 0 {
		t.Fatalf("vol set: exit %d: %s", code, out)
	}
	alice := dialAs(t, srv.addr, issue(t, "alice", 1001))
	if _, err := alice.Admin().SetQuota("capped", 0); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("a user who is no admin set a quota: %v", err)
	}
	listed := func(quota, used string) {
		t.Helper()
		out, code := hoard("vol", "list")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); code == 0 && len(f) == 8 && f[1] == "capped" {
				if f[3] != quota || f[4] != used {
					t.Fatalf("vol list shows quota %s, used %s; want %s, %s:\n%s", f[3], f[4], quota, used, out)
				}
				return
			}
		}
		t.Fatalf("vol list: exit %d, no volume capped:\n%s", code, out)
	}
	listed("4M", "0")

	m := startMount(t, srv, t.TempDir())
	dir := m.path("capped")
	space := func(p string) (total, free uint64) {
		t.Helper()
		var sf unix.Statfs_t
		if err := unix.Statfs(p, &sf); err != nil {
			t.Fatal(err)
		}
		if sf.Bfree != sf.Bavail {
			t.Fatalf("statfs of %s: %d blocks free, %d available", p, sf.Bfree, sf.Bavail)
		}
		return sf.Blocks * uint64(sf.Bsize), sf.Bavail * uint64(sf.Bsize)
	}
	if total, free := space(dir); total != 4<<20 || free != 4<<20 {
		t.Fatalf("statfs in the volume: %d bytes, %d free; want the quota, all free", total, free)
	}
	if total, _ := space(m.dir); total == 4<<20 {
		t.Fatal("statfs of the root volume, which has no quota, shows the other's")
	}

	// Writes land in the cache; the fsync that stores them is refused.
	mib := testkit.Pattern(1<<20, 1)
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		if _, err := f.Write(mib); err != nil {
			t.Fatalf("write of MiB %d: %v", i, err)
		}
		err := f.Sync()
		switch {
		case i < 5 && err != nil:
			t.Fatalf("fsync of %d MiB under a quota of 4: %v", i, err)
		case i == 5 && !errors.Is(err, syscall.EDQUOT):
			t.Fatalf("fsync of 5 MiB under a quota of 4: %v, want EDQUOT", err)
		}
	}
	f.Close()
	if st, err := c.Stat("/capped/fill"); err != nil || st.Size != 4<<20 {
		t.Fatalf("at the server after the refused store: %+v %v", st, err)
	}
	if total, free := space(dir); total != 4<<20 || free != 0 {
		t.Fatalf("statfs in the full volume: %d bytes, %d free", total, free)
	}
	listed("4M", "4M")

	// Full: even a small file is refused, until a remove makes room.
	writeSync := func(name string) error {
		t.Helper()
		g, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		if _, err := g.Write(mib[:1000]); err != nil {
			t.Fatalf("write of %s: %v", name, err)
		}
		return g.Sync()
	}
	if err := writeSync("more"); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("fsync in the full volume: %v, want EDQUOT", err)
	}
	// Without write-back the store is made at close, which reports it.
	nd := startMount(t, srv, t.TempDir(), "--no-delegations")
	h, err := os.Create(nd.path("capped/closed"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write(mib[:1000]); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("close in the full volume, no write-back: %v, want EDQUOT", err)
	}
	if err := os.Remove(filepath.Join(dir, "fill")); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the removed file's bytes freed", func() bool {
		_, free := space(dir)
		return free == 4<<20
	})
	if err := writeSync("again"); err != nil {
		t.Fatalf("fsync after a remove made room: %v", err)
	}
	if st, err := c.Stat("/capped/again"); err != nil || st.Size != 1000 {
		t.Fatalf("at the server: %+v %v", st, err)
	}
	// The file whose store was refused (its writes kept in lost/) takes
	// writes again.
	if err := writeSync("more"); err != nil {
		t.Fatalf("fsync of the file refused before, after a remove made room: %v", err)
	}
	listed("4M", "2.0K")
}

// Under write-back a close keeps the writes in the cache, and the
// flusher stores them later: a store the volume's quota will refuse is
// refused at the close instead (EDQUOT), as AFS's store on close is, not
// found after cp said all was well.
func TestQuotaAtCloseUnderWriteBack(t *testing.T) {
	needFuse(t)
	srv, c := cappedVolume(t)
	if _, err := c.Admin().SetQuota("capped", 4<<20); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, srv, t.TempDir())
	small := filepath.Join(m.path("capped"), "small")
	if err := os.WriteFile(small, testkit.Pattern(1<<20, 1), 0o644); err != nil {
		t.Fatalf("1 MiB under a quota of 4: %v", err)
	}
	big := filepath.Join(m.path("capped"), "big")
	err := os.WriteFile(big, testkit.Pattern(5<<20, 2), 0o644)
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("close of 5 MiB under a quota of 4, with write-back: %v, want EDQUOT", err)
	}
	// What fits is still taken, after the refusal.
	if err := os.WriteFile(filepath.Join(m.path("capped"), "more"), testkit.Pattern(1<<20, 3), 0o644); err != nil {
		t.Fatalf("1 MiB more: %v", err)
	}
	out, code := run(t, "cache", "flush", m.dir)
	if code != 0 {
		t.Fatalf("cache flush: exit %d: %s", code, out)
	}
	if st, err := c.Stat("/capped/more"); err != nil || st.Size != 1<<20 {
		t.Fatalf("after flush: %+v %v", st, err)
	}
	// Another client fills the volume after a close was accepted: the
	// flush that finds its store refused says so, and fails.
	if err := os.WriteFile(filepath.Join(m.path("capped"), "late"), testkit.Pattern(1<<20, 4), 0o644); err != nil {
		t.Fatal(err)
	}
	other := testkit.Create(t, c, "/capped/other", testkit.Pattern(3<<19, 5))
	if err := other.Sync(); err != nil {
		t.Fatal(err)
	}
	other.Close()
	out, code = run(t, "cache", "flush", m.dir)
	if code != 1 || !strings.Contains(out, "late") || !strings.Contains(out, "refused") {
		t.Fatalf("cache flush of a refused store: exit %d: %s", code, out)
	}
	// Once there is room, the refused writes are stored again from lost/,
	// and their record goes; the refused big file's is discarded.
	if _, err := c.Admin().SetQuota("capped", 0); err != nil {
		t.Fatal(err)
	}
	recs, err := lost.List(m.cache)
	if err != nil || len(recs) != 2 {
		t.Fatalf("lost records: %v %v", recs, err)
	}
	for _, r := range recs {
		args := []string{"cache", "lost", "rm", r.ID, "--cache", m.cache}
		if r.Path == "/capped/late" {
			args = []string{"cache", "lost", "restore", r.ID, "--cache", m.cache, "--server", srv.addr}
		}
		if out, code := run(t, args...); code != 0 {
			t.Fatalf("hoard %v: exit %d: %s", args, code, out)
		}
	}
	if got := testkit.ReadFile(t, c, "/capped/late"); !bytes.Equal(got, testkit.Pattern(1<<20, 4)) {
		t.Fatalf("restored from lost/: %d bytes", len(got))
	}
	if out, _ := run(t, "cache", "lost", "--cache", m.cache); !strings.Contains(out, "no lost writes") {
		t.Fatalf("lost records left: %s", out)
	}
}

// A size set far past a file's data fills no quota: the quota counts
// blocks, as ext4's and AFS's do. One SetAttr to 16 TiB once made a
// volume full, and another user's 6 bytes were refused.
func TestQuotaSparseSizeFillsNothing(t *testing.T) {
	srv, c := cappedVolume(t)
	if _, err := c.Admin().SetQuota("capped", 1<<20); err != nil {
		t.Fatal(err)
	}
	bob := dialAs(t, srv.addr, testCell.admin) // no write-back: the truncation is stored at once
	writeAs(t, bob, "/capped/bob", "bob's bytes")
	if err := bob.Truncate("/capped/bob", 1<<40); err != nil {
		t.Fatalf("a sparse size of 1 TiB: %v", err)
	}
	writeAs(t, dialAs(t, srv.addr, testCell.admin), "/capped/alice", "6 byte")
	vs, err := c.Admin().Volumes()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v.Name == "capped" && v.Used > 64<<10 {
			t.Fatalf("volume capped counts %d bytes used for 17 bytes of data", v.Used)
		}
	}
}
