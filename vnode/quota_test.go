package vnode

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/node"
)

// counts fails unless volume vol's counters are used bytes and files
// vnodes, and agree with a count of its vnodes made afresh.
func counts(t *testing.T, s *Store, vol, used, files uint64) {
	t.Helper()
	v, err := s.VolumeByID(vol)
	if err != nil {
		t.Fatal(err)
	}
	var scanUsed, scanFiles uint64
	s.view(vol, func(v *vtx) error {
		return v.vnodes.ForEach(func(k, b []byte) error {
			r, err := decodeRecord(b)
			if err != nil {
				t.Fatal(err)
			}
			scanFiles++
			scanUsed += v.charge(&r, getU64(k))
			return nil
		})
	})
	if v.Used != used || v.Files != files {
		t.Fatalf("volume %s counts %d bytes in %d vnodes, want %d in %d", v.Name, v.Used, v.Files, used, files)
	}
	if scanUsed != used || scanFiles != files {
		t.Fatalf("volume %s holds %d bytes in %d vnodes, want %d in %d", v.Name, scanUsed, scanFiles, used, files)
	}
}

func setSize(s *Store, f node.FID, n uint64) (node.Status, error) {
	return s.SetAttr(f, node.Change{Mask: node.SetSize, Size: n})
}

func tryWrite(s *Store, f node.FID, off int64, data []byte, op node.Op) (node.Status, error) {
	u, err := s.BeginUpdate(f)
	if err != nil {
		return node.Status{}, err
	}
	if err := u.WriteAt(data, off); err != nil {
		return node.Status{}, err
	}
	return u.Commit(true, time.Time{}, op)
}

// The used bytes are what the volume's regular files take on disk (a
// data file's blocks, inline bytes), whichever way that changes (stores,
// truncations, moves between inline and data files, removes, renames
// over a file), and the vnodes are counted as made and freed; both
// survive a restart.
func TestQuotaUsageCounted(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	vol := r.Volume
	counts(t, s, vol, 0, 1)
	a := mustCreate(t, s, r, "a", node.TypeFile).FID
	counts(t, s, vol, 0, 2)
	write(t, s, a, 0, bytes.Repeat([]byte("a"), 10))
	counts(t, s, vol, 10, 2)
	write(t, s, a, 0, bytes.Repeat([]byte("b"), 20)) // 10 bytes replaced, 10 more
	counts(t, s, vol, 20, 2)
	write(t, s, a, inlineMax, []byte("past inline")) // to a data file, with a hole
	counts(t, s, vol, disk(t, s, a), 2)
	if d := disk(t, s, a); d >= inlineMax {
		t.Fatalf("a data file with a hole of %d bytes counts %d", inlineMax, d)
	}
	write(t, s, a, 5, []byte("in place"))
	counts(t, s, vol, disk(t, s, a), 2)
	if _, err := setSize(s, a, 5); err != nil { // back inline
		t.Fatal(err)
	}
	counts(t, s, vol, 5, 2)
	if _, err := setSize(s, a, 1<<20); err != nil { // sparse: its size does not count
		t.Fatal(err)
	}
	counts(t, s, vol, disk(t, s, a), 2)
	if d := disk(t, s, a); d > 8192 {
		t.Fatalf("a file of 5 bytes then a hole counts %d", d)
	}
	sparse := disk(t, s, a)

	mustCreate(t, s, r, "d", node.TypeDir)
	if _, _, _, err := s.Create(r, "sl", node.TypeSymlink, node.Attr{}, "a-long-enough-target", true, ""); err != nil {
		t.Fatal(err)
	}
	counts(t, s, vol, sparse, 4)
	// A second name is no second copy; the bytes go with the last one.
	if _, _, err := s.Link(r, "a2", a, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Remove(r, "a", false, ""); err != nil {
		t.Fatal(err)
	}
	counts(t, s, vol, sparse, 4)
	if _, _, err := s.Remove(r, "a2", false, ""); err != nil {
		t.Fatal(err)
	}
	counts(t, s, vol, 0, 3)

	b := mustCreate(t, s, r, "b", node.TypeFile).FID
	write(t, s, b, 0, []byte("bbb"))
	c := mustCreate(t, s, r, "c", node.TypeFile).FID
	write(t, s, c, 0, bytes.Repeat([]byte("c"), inlineMax+1))
	counts(t, s, vol, 3+disk(t, s, c), 5)
	if _, err := s.Rename(r, "b", r, "c", "", ""); err != nil { // c is freed
		t.Fatal(err)
	}
	counts(t, s, vol, 3, 4)
	if _, _, err := s.Remove(r, "d", true, ""); err != nil {
		t.Fatal(err)
	}
	counts(t, s, vol, 3, 3)

	// Files made and removed under a directory delegation.
	fids, err := s.Reserve(vol, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.CreateReserved(r, []node.Reserved{{Name: "r1", FID: fids[0]}, {Name: "r2", FID: fids[1]}}, nil, ""); err != nil {
		t.Fatal(err)
	}
	counts(t, s, vol, 3, 5)
	write(t, s, fids[0], 0, []byte("r1r1"))
	if _, _, _, err := s.CreateReserved(r, nil, []node.Removed{{Name: "r1", FID: fids[0]}}, ""); err != nil {
		t.Fatal(err)
	}
	counts(t, s, vol, 3, 4)

	// Another volume counts its own.
	pv, err := s.CreateVolume("proj")
	if err != nil {
		t.Fatal(err)
	}
	p := mustCreate(t, s, pv.Root, "p", node.TypeFile).FID
	write(t, s, p, 0, []byte("pp"))
	counts(t, s, pv.ID, 2, 2)
	counts(t, s, vol, 3, 4)

	s.Close()
	s = open(t, dir)
	counts(t, s, vol, 3, 4)
	counts(t, s, pv.ID, 2, 2)
}

// A store that would take the volume past its quota fails with EDQUOT
// and changes nothing: not the file's bytes, version or data files, not
// the count; a store that fits exactly is taken.
func TestQuotaRefusesGrowth(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	vol := r.Volume
	if _, err := s.SetQuota("nosuch", 1); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("quota of a missing volume: %v", err)
	}
	v, err := s.SetQuota(node.RootVolume, 100)
	if err != nil || v.Quota != 100 || v.ID != vol {
		t.Fatalf("set quota: %+v %v", v, err)
	}
	f := mustCreate(t, s, r, "f", node.TypeFile).FID
	before := write(t, s, f, 0, bytes.Repeat([]byte("x"), 60))
	refused := func(what string, st node.Status, err error) {
		t.Helper()
		if !errors.Is(err, syscall.EDQUOT) {
			t.Fatalf("%s: got %+v, %v; want EDQUOT", what, st, err)
		}
	}
	st, err := tryWrite(s, f, 60, bytes.Repeat([]byte("y"), 41), "")
	refused("41 bytes more", st, err)
	if got, _ := s.GetStatus(f); got.DataVersion != before.DataVersion || got.Size != 60 {
		t.Fatalf("a refused store changed the file: %+v", got)
	}
	if got := read(t, s, f); !bytes.Equal(got, bytes.Repeat([]byte("x"), 60)) {
		t.Fatalf("a refused store changed the bytes: %q", got)
	}
	counts(t, s, vol, 60, 2)
	st, err = setSize(s, f, 101)
	refused("an extending truncate", st, err)
	g := mustCreate(t, s, r, "g", node.TypeFile).FID
	write(t, s, g, 0, bytes.Repeat([]byte("g"), 40)) // to the byte
	counts(t, s, vol, 100, 3)
	st, err = tryWrite(s, g, 40, []byte("!"), "")
	refused("one byte past", st, err)
	counts(t, s, vol, 100, 3)

	// Data files: neither the move from inline nor a store in place
	// publishes anything. The move takes whole blocks: more than the
	// quota leaves.
	if _, err := s.SetQuota(node.RootVolume, 1024); err != nil {
		t.Fatal(err)
	}
	st, err = tryWrite(s, f, inlineMax, bytes.Repeat([]byte("z"), 200), "")
	refused("moving to a data file", st, err)
	if len(dataFiles(s, f)) != 0 || stagingFiles(t, s) != 0 {
		t.Fatalf("a refused store left files: %v, %d staging", dataFiles(s, f), stagingFiles(t, s))
	}
	if _, err := s.SetQuota(node.RootVolume, 0); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("B"), inlineMax+100)
	write(t, s, f, 0, big)
	if _, err := s.SetQuota(node.RootVolume, 40+disk(t, s, f)+100); err != nil {
		t.Fatal(err)
	}
	files := dataFiles(s, f)
	was, _ := s.GetStatus(f)
	// In place, past the end: not even the blocks are allocated.
	st, err = tryWrite(s, f, int64(len(big)), bytes.Repeat([]byte("C"), 8192), "")
	refused("growing a data file", st, err)
	if got := read(t, s, f); !bytes.Equal(got, big) {
		t.Fatalf("a refused store changed a data file's bytes: %d bytes", len(got))
	}
	if now, _ := s.GetStatus(f); now.Blocks != was.Blocks || now.DataVersion != was.DataVersion {
		t.Fatalf("a refused store changed the file: %+v, was %+v", now, was)
	}
	if now := dataFiles(s, f); len(now) != 1 || now[0] != files[0] || stagingFiles(t, s) != 0 {
		t.Fatalf("data files %v then %v, %d staging", files, now, stagingFiles(t, s))
	}
	counts(t, s, vol, 40+disk(t, s, f), 3)
}

// disk is what file f takes on the store's disk: its data file's blocks.
func disk(t *testing.T, s *Store, f node.FID) uint64 {
	t.Helper()
	st, err := s.GetStatus(f)
	if err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// A size set far past a file's data fills no quota: one SetAttr to a
// large size once made a volume full, and another user's 6 bytes were
// refused.
func TestQuotaSparseSizeCostsNothing(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	if _, err := s.SetQuota(node.RootVolume, 1<<20); err != nil {
		t.Fatal(err)
	}
	bob := mustCreate(t, s, r, "bob", node.TypeFile).FID
	write(t, s, bob, 0, bytes.Repeat([]byte("b"), inlineMax+1))
	if _, err := setSize(s, bob, 1<<40); err != nil {
		t.Fatalf("a sparse size of 1 TiB under a quota of 1 MiB: %v", err)
	}
	alice := mustCreate(t, s, r, "alice", node.TypeFile).FID
	if _, err := tryWrite(s, alice, 0, []byte("6 byte"), ""); err != nil {
		t.Fatalf("alice's 6 bytes after bob's sparse size: %v", err)
	}
	// Data, though, counts, holes or not.
	if _, err := tryWrite(s, bob, 1<<39, bytes.Repeat([]byte("x"), 2<<20), ""); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("2 MiB of data under a quota of 1 MiB: %v", err)
	}
}

// A store made already (its reply lost) is answered as made when sent
// again, even if the quota would refuse it now.
func TestQuotaRepeatedStore(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	f := mustCreate(t, s, r, "f", node.TypeFile).FID
	first, err := tryWrite(s, f, 0, bytes.Repeat([]byte("x"), 50), "op1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setSize(s, f, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetQuota(node.RootVolume, 20); err != nil {
		t.Fatal(err)
	}
	again, err := tryWrite(s, f, 0, bytes.Repeat([]byte("x"), 50), "op1")
	if err != nil || again.FID != first.FID {
		t.Fatalf("store sent again: %+v %v", again, err)
	}
	counts(t, s, r.Volume, 10, 2)
}

// Over its quota (set below what it holds) a volume may only shrink:
// truncations, removes and stores that do not grow a file are taken.
func TestQuotaShrinkWhenOver(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	vol := r.Volume
	f := mustCreate(t, s, r, "f", node.TypeFile).FID
	write(t, s, f, 0, bytes.Repeat([]byte("x"), 80))
	g := mustCreate(t, s, r, "g", node.TypeFile).FID
	write(t, s, g, 0, bytes.Repeat([]byte("g"), 30))
	v, err := s.SetQuota(node.RootVolume, 50)
	if err != nil || v.Quota != 50 || v.Used != 110 || v.Files != 3 {
		t.Fatalf("quota below the use: %+v %v", v, err)
	}
	if _, err := tryWrite(s, f, 80, []byte("x"), ""); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("growth over the quota: %v", err)
	}
	if _, err := setSize(s, f, 70); err != nil {
		t.Fatalf("truncate over the quota: %v", err)
	}
	if _, err := tryWrite(s, f, 0, bytes.Repeat([]byte("y"), 70), ""); err != nil {
		t.Fatalf("overwrite over the quota: %v", err)
	}
	counts(t, s, vol, 100, 3)
	if _, _, err := s.Remove(r, "f", false, ""); err != nil {
		t.Fatalf("remove over the quota: %v", err)
	}
	counts(t, s, vol, 30, 2)
	write(t, s, g, 30, bytes.Repeat([]byte("g"), 20))
	counts(t, s, vol, 50, 2)
	if _, err := s.SetQuota(node.RootVolume, 0); err != nil {
		t.Fatal(err)
	}
	write(t, s, g, 50, bytes.Repeat([]byte("g"), 1000))
	counts(t, s, vol, 1050, 2)
}

// Stores committed together (group) are each held to the quota in the
// transaction that counts them: however they interleave, exactly as many
// as fit are taken.
func TestQuotaConcurrentStores(t *testing.T) {
	s := open(t, t.TempDir())
	r := root(t, s)
	if _, err := s.SetQuota(node.RootVolume, 100); err != nil {
		t.Fatal(err)
	}
	const n = 32
	fids := make([]node.FID, n)
	for i := range fids {
		fids[i] = mustCreate(t, s, r, fmt.Sprintf("f%d", i), node.TypeFile).FID
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range fids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := s.BeginUpdate(fids[i])
			if err == nil {
				err = u.WriteAt(bytes.Repeat([]byte("w"), 10), 0)
			}
			<-start
			if err == nil {
				_, err = u.Commit(false, time.Time{}, "")
			}
			errs[i] = err
		}()
	}
	close(start)
	wg.Wait()
	taken := 0
	for _, err := range errs {
		switch {
		case err == nil:
			taken++
		case !errors.Is(err, syscall.EDQUOT):
			t.Fatal(err)
		}
	}
	if taken != 10 {
		t.Fatalf("%d stores of 10 bytes taken under a quota of 100", taken)
	}
	counts(t, s, r.Volume, 100, n+1)
}

// A store from before the counts (format 4) has them made when opened,
// and kept from then on.
func TestQuotaFormatUpgrade(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	r := root(t, s)
	f := mustCreate(t, s, r, "f", node.TypeFile).FID
	write(t, s, f, 0, bytes.Repeat([]byte("f"), inlineMax+5))
	g := mustCreate(t, s, r, "g", node.TypeFile).FID
	write(t, s, g, 0, []byte("small"))
	mustCreate(t, s, r, "d", node.TypeDir)
	pv, err := s.CreateVolume("proj")
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, mustCreate(t, s, pv.Root, "p", node.TypeFile).FID, 0, []byte("pp"))
	err = s.db.Update(func(tx *bolt.Tx) error {
		for _, id := range []uint64{r.Volume, pv.ID} {
			vm := tx.Bucket(bktVolumes).Bucket(u64(id)).Bucket(bktVolMeta)
			if err := vm.Delete(keyUsed); err != nil {
				return err
			}
			if err := vm.Delete(keyFiles); err != nil {
				return err
			}
		}
		return tx.Bucket(bktMeta).Put(keyFormat, u64(4))
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir)
	counts(t, s, r.Volume, disk(t, s, f)+5, 4)
	counts(t, s, pv.ID, 2, 2)
	s.view(r.Volume, func(v *vtx) error {
		if f := getU64(v.tx.Bucket(bktMeta).Get(keyFormat)); f != formatVersion {
			t.Errorf("format %d after the upgrade", f)
		}
		return nil
	})
	write(t, s, g, 5, []byte("er"))
	counts(t, s, r.Volume, disk(t, s, f)+7, 4)
}
