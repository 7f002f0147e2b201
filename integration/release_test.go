package integration

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	cadmin "github.com/hoardfs/hoard/client/admin"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/node"
)

// A volume released to two read-only sites: its mount point leads to the
// copy, which refuses changes; a %NAME mount point leads to the
// read-write volume; a second release sends what changed and no more,
// and a reader of the copy during it sees each file whole, of one
// release or the next.
func TestCellRelease(t *testing.T) {
	_, srvs := cellOf3(t)
	admin := dial(t, srvs[2].addr, "mem", 64<<20)
	waitAlive(t, admin, 3)
	if _, err := admin.Admin().CreateVolumeOn("sw", "s1"); err != nil {
		t.Fatal(err)
	}
	for _, mp := range [][2]string{{"/sw", "sw"}, {"/sw-rw", "%sw"}} {
		if err := admin.Admin().MountVolume(mp[0], mp[1]); err != nil {
			t.Fatal(err)
		}
	}
	v1, v2 := testkit.Pattern(8<<20, 1), testkit.Pattern(8<<20, 2)
	testkit.WriteFile(t, admin, "/sw-rw/big", v1)
	for i := range 50 {
		testkit.WriteFile(t, admin, "/sw-rw/small"+string(rune('a'+i%26))+string(rune('a'+i/26)), []byte(strings.Repeat("x", 5000)))
	}
	out, code := run(t, "vol", "release", "sw", "--server", srvs[2].addr, "--cache", "")
	if code != 1 || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "no read-only sites") {
		t.Fatalf("release with no sites: exit %d: %q", code, out)
	}
	for _, s := range []string{"s2", "s3"} {
		if err := admin.Admin().AddSite("sw", s); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Admin().AddSite("sw", "s2"); err == nil {
		t.Fatal("a site added twice")
	}
	if err := admin.Admin().AddSite("sw", "nobody"); err == nil {
		t.Fatal("an unknown server added as a site")
	}
	rep, err := admin.Admin().Release("sw")
	if err != nil || len(rep.Sites) != 2 {
		t.Fatalf("first release: %+v %v", rep, err)
	}
	if rep.Bytes < int64(len(v1)) {
		t.Fatalf("first release sent %d bytes, less than the volume's", rep.Bytes)
	}
	examined(t, admin, "sw", "two sites, release 1", func(info cadmin.VolumeInfo) bool {
		return len(info.RO) == 2 && info.Released == 1 && len(info.Pending) == 0
	})

	// A mount dialled to s1, the read-write site, reads the copy.
	m := startMount(t, srvs[0], t.TempDir())
	if b, err := os.ReadFile(m.path("sw/big")); err != nil || !bytes.Equal(b, v1) {
		t.Fatalf("read of the copy: %d bytes, %v", len(b), err)
	}
	if err := os.WriteFile(m.path("sw/new"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("create in the copy: %v", err)
	}
	if f, err := os.OpenFile(m.path("sw/big"), os.O_WRONLY, 0); !errors.Is(err, syscall.EROFS) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("open of the copy for writing: %v", err)
	}
	if err := os.Remove(m.path("sw/smallaa")); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("remove in the copy: %v", err)
	}
	if err := os.WriteFile(m.path("sw-rw/by-mount"), []byte("rw"), 0o644); err != nil {
		t.Fatalf("write through the %%sw mount point: %v", err)
	}

	// A reader of the copy while the next release is made.
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			b, err := os.ReadFile(m.path("sw/big"))
			if err == nil && !bytes.Equal(b, v1) && !bytes.Equal(b, v2) {
				err = errors.New("a read of the copy during a release was of neither release")
			}
			if err != nil {
				errs <- err
				return
			}
			reads.Add(1)
		}
	}()
	w := dial(t, srvs[2].addr, "mem", 64<<20)
	testkit.WriteFile(t, w, "/sw-rw/big", v2)
	w.Close() // stores what it holds
	if b, err := os.ReadFile(m.path("sw/big")); err != nil || !bytes.Equal(b, v1) {
		t.Fatalf("the copy changed with the read-write volume, before a release: %d bytes, %v", len(b), err)
	}
	for reads.Load() < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	rep, err = admin.Admin().Release("sw")
	if err != nil {
		t.Fatalf("second release: %v", err)
	}
	// Only the changed file travels (to two sites), not the 50 others.
	if rep.Bytes < 2*int64(len(v2)) || rep.Bytes > 2*int64(len(v2))+64<<10 {
		t.Fatalf("second release sent %d bytes for one changed 8 MiB file at two sites", rep.Bytes)
	}
	var b []byte
	if !poll.Until(10*time.Second, func() bool { b, err = os.ReadFile(m.path("sw/big")); return err == nil && bytes.Equal(b, v2) }) {
		t.Fatalf("the copy not of the second release 10 s after it: %d bytes, %v", len(b), err)
	}
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if b, err := os.ReadFile(m.path("sw/by-mount")); err != nil || string(b) != "rw" {
		t.Fatalf("a file written before the release, read in the copy: %q %v", b, err)
	}

	// A site restarted keeps its copy (it is not a volume of its own).
	srvs[1].kill9()
	srvs[1].restart()
	info := examined(t, admin, "sw", "two sites", func(info cadmin.VolumeInfo) bool { return len(info.RO) == 2 })
	if _, err := os.Stat(filepath.Join(srvs[1].data, "data", fmt.Sprint(info.ROID))); err != nil {
		t.Fatalf("s2's copy after a restart: %v", err)
	}
	if _, err := admin.Admin().Examine("sw" + node.ReadOnlySuffix); err != nil {
		t.Fatalf("the copy after s2 restarted: %v", err)
	}
	vols, err := admin.Admin().VolumeInfos()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if strings.HasSuffix(v.Volume.Name, node.ReadOnlySuffix) {
			t.Fatalf("s2 registered its copy as a volume at its start: %+v", v.Location)
		}
	}

	// Sites go as they came; a volume with sites is not removed. A site
	// removed while down drops its copy when it starts.
	if err := admin.Admin().RemoveVolume("sw"); err == nil {
		t.Fatal("a volume with read-only sites removed")
	}
	if err := admin.Admin().RemoveSite("sw", "s2"); err != nil {
		t.Fatal(err)
	}
	srvs[2].kill9()
	admin = dial(t, srvs[0].addr, "mem", 16<<20) // the first was s3's
	if err := admin.Admin().RemoveSite("sw", "s3"); err == nil || !strings.Contains(err.Error(), "until it restarts") {
		t.Fatalf("remsite of a site that is down: %v", err)
	}
	srvs[2].restart()
	if !strings.Contains(srvs[2].logs.String(), "no longer a site of\" volume="+"sw"+node.ReadOnlySuffix) {
		t.Errorf("s3 did not say it dropped sw's copy, by the copy's name:\n%s", srvs[2].logs)
	}
	for i, s := range srvs[1:] {
		if _, err := os.Stat(filepath.Join(s.data, "data", fmt.Sprint(info.ROID))); err == nil {
			t.Fatalf("s%d kept the copy of a site removed", i+2)
		}
	}
	examined(t, admin, "sw", "no sites", func(info cadmin.VolumeInfo) bool { return len(info.RO)+len(info.Pending) == 0 })
	if err := admin.Admin().RemoveVolume("sw"); err != nil {
		t.Fatal(err)
	}
}

// kill -9 of the read-only site a reader is reading a 256 MiB file from:
// the reader goes on from the other site and ends with the right bytes.
func TestCellReadOnlyFailover(t *testing.T) {
	_, srvs := cellOf3(t)
	admin := dial(t, srvs[2].addr, "mem", 64<<20)
	waitAlive(t, admin, 3)
	if _, err := admin.Admin().CreateVolumeOn("sw", "s3"); err != nil {
		t.Fatal(err)
	}
	// (The root volume, on s1, is unreachable once s1 dies: mount
	// points are made first.)
	for _, mp := range [][2]string{{"/sw", "sw"}, {"/sw-rw", "%sw"}} {
		if err := admin.Admin().MountVolume(mp[0], mp[1]); err != nil {
			t.Fatal(err)
		}
	}
	data := testkit.Pattern(256<<20, 7)
	w := dial(t, srvs[2].addr, "mem", 512<<20)
	testkit.WriteFile(t, w, "/sw/big", data)
	w.Close() // stores what it holds
	for _, s := range []string{"s1", "s2"} {
		if err := admin.Admin().AddSite("sw", s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Admin().Release("sw"); err != nil {
		t.Fatal(err)
	}
	// A mount and a library client read from s1, the first site; s1 dies
	// a quarter of the way.
	m := startMount(t, srvs[2], t.TempDir())
	lib := dial(t, srvs[2].addr, "mem", 64<<20)
	mf, err := os.Open(m.path("sw/big"))
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	lf, err := lib.Open("/sw/big", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	// Both read at once; s1 is killed once both are past 64 MiB.
	var wg sync.WaitGroup
	var past sync.WaitGroup
	errs := make([]error, 2)
	for i, r := range []io.Reader{mf, lf} {
		wg.Add(1)
		past.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = func() error {
				h := sha256.New()
				if _, err := io.CopyN(h, r, 64<<20); err != nil {
					past.Done()
					return err
				}
				past.Done()
				var longest time.Duration
				buf := make([]byte, 1<<20)
				for {
					start := time.Now()
					n, err := io.ReadFull(r, buf)
					longest = max(longest, time.Since(start))
					h.Write(buf[:n])
					if err == io.EOF || err == io.ErrUnexpectedEOF {
						break
					}
					if err != nil {
						return fmt.Errorf("read after the site died: %w", err)
					}
				}
				if want := sha256.Sum256(data); !bytes.Equal(h.Sum(nil), want[:]) {
					return errors.New("the bytes read differ from the file's")
				}
				t.Logf("reader %d: longest read across the failover: %v", i, longest)
				return nil
			}()
		}()
	}
	past.Wait()
	srvs[0].kill9()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
	}
	if !strings.Contains(m.logs.String(), "reading from another") {
		t.Fatalf("the mount did not fail over from s1:\n%s", m.logs)
	}
	// A release with a site down reaches the others, and says which it
	// did not.
	if err := os.Remove(m.path("sw/big")); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("remove in the copy: %v", err)
	}
	testkit.WriteFile(t, admin, "/sw-rw/after", []byte("after"))
	rep, err := admin.Admin().Release("sw")
	if err == nil || !strings.Contains(err.Error(), "s1 keeps its last release") || len(rep.Sites) != 1 || rep.Sites[0] != "s2" {
		t.Fatalf("release with s1 down: %+v %v", rep, err)
	}
}

// examined waits until volume name, as the server c is dialled to has
// it, is as ok wants (each server's copy of the location database
// follows etcd by a watch), for at most 5 s.
func examined(t *testing.T, c *pathfs.FS, name, want string, ok func(cadmin.VolumeInfo) bool) cadmin.VolumeInfo {
	t.Helper()
	var info cadmin.VolumeInfo
	var err error
	if !poll.Until(5*time.Second, func() bool { info, err = c.Admin().Examine(name); return err == nil && ok(info) }) {
		t.Fatalf("volume %s not %s: %+v %v", name, want, info.Location, err)
	}
	return info
}

// The cell's root volume replicated, as AFS replicates root.afs: mounts
// read its read-only copy, so they start and list the cell with the root
// volume's server dead; a mount point made through any path is made in
// the read-write root and reaches readers at the next release.
func TestCellReadOnlyRoot(t *testing.T) {
	_, srvs := cellOf3(t)
	admin := dial(t, srvs[1].addr, "mem", 64<<20)
	waitAlive(t, admin, 3)
	if _, err := admin.Admin().CreateVolumeOn("home", "s2"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Admin().MountVolume("/home", "home"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"s2", "s3"} {
		if err := admin.Admin().AddSite(node.RootVolume, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Admin().Release(node.RootVolume); err != nil {
		t.Fatal(err)
	}

	// After the release a new client's root is the copy; a mount point
	// made through it lands in the read-write root, and the CLI says how
	// to publish it.
	if _, err := admin.Admin().CreateVolumeOn("proj", "s3"); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, "vol", "mount", "proj", "/proj", "--server", srvs[1].addr)
	if code != 0 || !strings.Contains(out, "hoard vol release root") {
		t.Fatalf("vol mount in the replicated root: exit %d:\n%s", code, out)
	}
	examined(t, admin, node.RootVolume, "released", func(v cadmin.VolumeInfo) bool { return v.Released > 0 })
	r := dial(t, srvs[1].addr, "mem", 16<<20)
	if _, err := r.Stat("/proj"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("/proj before the root's release: %v, want not found", err)
	}
	// An ACL set through the copy is set in the read-write root.
	if rw, err := r.Admin().CopyOf("/"); err != nil || rw != node.RootVolume {
		t.Fatalf("CopyOf(/) = %q, %v; want the root volume", rw, err)
	}
	rl, _ := access.ParseRights("rl")
	if _, err := r.Admin().SetACL("/", "system:anyuser", rl); err != nil {
		t.Fatalf("set the root's ACL through its copy: %v", err)
	}
	if _, err := admin.Admin().Release(node.RootVolume); err != nil {
		t.Fatal(err)
	}

	srvs[0].kill9() // s1, the read-write root's
	m := startMount(t, srvs[1], t.TempDir())
	names, err := os.ReadDir(m.path(""))
	if err != nil {
		t.Fatalf("list the mount's root with s1 dead: %v", err)
	}
	var got []string
	for _, e := range names {
		got = append(got, e.Name())
	}
	if !slices.Contains(got, "home") || !slices.Contains(got, "proj") {
		t.Fatalf("the mount's root with s1 dead lists %q, want home and proj", got)
	}
	if err := os.WriteFile(m.path("home/a"), []byte("a"), 0o644); err != nil {
		t.Fatalf("write in home (on s2) with s1 dead: %v", err)
	}
	if err := os.WriteFile(m.path("x"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("create in the read-only root: %v, want EROFS", err)
	}
}
