package vldb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/principal"
)

func member(t *testing.T, dir string) *Member {
	t.Helper()
	m, err := StartMember(MemberConfig{Dir: dir, ClientAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the copies (cleanups run last first): a member waits
	// for its clients' watches when it stops.
	t.Cleanup(m.Close)
	return m
}

func open(t *testing.T, m *Member) *DB {
	t.Helper()
	d, err := Open(Config{Endpoints: []string{m.Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestCreateLookupAcrossCopies(t *testing.T) {
	m := member(t, t.TempDir())
	a, b := open(t, m), open(t, m)
	ctx := context.Background()
	v, err := a.Create(ctx, Volume{Name: "home", RW: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if v.ID != 1 {
		t.Fatalf("first id %d, want 1", v.ID)
	}
	// The creator's copy has it at once; the other's through its watch.
	if got, ok := a.ByName("home"); !ok || got.ID != v.ID || got.RW != "s1" {
		t.Fatalf("creator's copy: %+v %v", got, ok)
	}
	poll.Wait(t, 10*time.Second, "b sees home", func() bool { got, ok := b.Volume(v.ID); return ok && got.Name == "home" })
	if _, err := b.Create(ctx, Volume{Name: "home", RW: "s2"}); !errors.Is(err, ErrExists) {
		t.Fatalf("same name again: %v, want ErrExists", err)
	}
	// A volume registered with its own id moves the counter past it.
	if _, err := b.Create(ctx, Volume{ID: 10, Name: "old", RW: "s2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Create(ctx, Volume{ID: 10, Name: "other", RW: "s1"}); !errors.Is(err, ErrExists) {
		t.Fatalf("same id again: %v, want ErrExists", err)
	}
	w, err := a.Create(ctx, Volume{Name: "next", RW: "s1"})
	if err != nil || w.ID != 11 {
		t.Fatalf("after id 10: %+v %v, want id 11", w, err)
	}
}

// Concurrent creates from several copies get distinct ids, and of those
// racing for one name exactly one wins.
func TestConcurrentCreates(t *testing.T) {
	m := member(t, t.TempDir())
	dbs := []*DB{open(t, m), open(t, m), open(t, m)}
	ctx := context.Background()
	var mu sync.Mutex
	ids := map[uint64]string{}
	wins := 0
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("v%d", i)
			if i%3 == 0 {
				name = "contested"
			}
			v, err := dbs[i%3].Create(ctx, Volume{Name: name, RW: "s"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				if prev, dup := ids[v.ID]; dup {
					t.Errorf("id %d given to %s and %s", v.ID, prev, name)
				}
				ids[v.ID] = name
				if name == "contested" {
					wins++
				}
			case !errors.Is(err, ErrExists) || name != "contested":
				t.Errorf("create %s: %v", name, err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d creates of one name succeeded, want 1", wins)
	}
	if len(ids) != 21 {
		t.Fatalf("%d volumes made, want 21", len(ids))
	}
}

func TestUpdateRemove(t *testing.T) {
	m := member(t, t.TempDir())
	a, b := open(t, m), open(t, m)
	ctx := context.Background()
	v, _ := a.Create(ctx, Volume{Name: "sw", RW: "s1"})
	if _, err := b.Update(ctx, v.ID, func(v *Volume) error { v.RO = append(v.RO, "s2"); return nil }); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "a sees the new site", func() bool { got, _ := a.Volume(v.ID); return len(got.RO) == 1 && got.RO[0] == "s2" })
	refuse := errors.New("no")
	if _, err := a.Update(ctx, v.ID, func(v *Volume) error { v.RW = "x"; return refuse }); !errors.Is(err, refuse) {
		t.Fatalf("update refused by fn: %v", err)
	}
	if got, _ := a.Volume(v.ID); got.RW != "s1" {
		t.Fatalf("a refused update changed RW to %s", got.RW)
	}
	if err := a.Remove(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "b sees it gone", func() bool { _, ok := b.ByName("sw"); return !ok })
	if _, err := a.Update(ctx, v.ID, func(*Volume) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update of a removed volume: %v", err)
	}
	// The name is free again.
	if _, err := b.Create(ctx, Volume{Name: "sw", RW: "s2"}); err != nil {
		t.Fatal(err)
	}
}

func TestLiveness(t *testing.T) {
	m := member(t, t.TempDir())
	watcher := open(t, m)
	s, err := Open(Config{Endpoints: []string{m.Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(Server{Name: "s1", Addr: "127.0.0.1:1", Free: 5}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "s1 alive", func() bool { got, ok := watcher.Server("s1"); return ok && got.Alive && got.Addr == "127.0.0.1:1" })
	if p, ok := watcher.Place(); !ok || p.Name != "s1" {
		t.Fatalf("place: %+v %v", p, ok)
	}
	// A server that stops is seen dead once its lease expires; its
	// record stays.
	s.Close()
	poll.Wait(t, 10*time.Second, "s1 dead", func() bool { got, ok := watcher.Server("s1"); return ok && !got.Alive })
	if _, ok := watcher.Place(); ok {
		t.Fatal("placed on a dead server")
	}
}

// A member restarted on its data keeps the database.
func TestRestartKeeps(t *testing.T) {
	dir := t.TempDir()
	m := member(t, dir)
	d, err := Open(Config{Endpoints: []string{m.Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Create(context.Background(), Volume{Name: "kept", RW: "s1"}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	m.Close()
	m = member(t, dir)
	if v, ok := open(t, m).ByName("kept"); !ok || v.RW != "s1" {
		t.Fatalf("after restart: %+v %v", v, ok)
	}
}

func TestUnreachable(t *testing.T) {
	start := time.Now()
	_, err := Open(Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err == nil {
		t.Fatal("opened an etcd nobody serves")
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("took %v to fail", time.Since(start))
	}
	t.Log(err)
}

// A copy that has not yet seen another server's change has it after
// CatchUp, every time; and a read-only copy's id gives its volume.
func TestCatchUp(t *testing.T) {
	m := member(t, t.TempDir())
	a, b := open(t, m), open(t, m)
	ctx := context.Background()
	for i := range 200 {
		v, err := a.Create(ctx, Volume{Name: fmt.Sprintf("v%d", i), RW: "s"})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := b.ByName(v.Name); !ok {
			t.Fatalf("after CatchUp, %s is missing from the other copy", v.Name)
		}
	}
	v, err := a.Update(ctx, 1, func(w *Volume) error {
		w.ROID = NewID
		return nil
	})
	if err != nil || v.ROID == 0 || v.ROID == NewID {
		t.Fatalf("a read-only id: %+v %v", v, err)
	}
	if next, err := a.Create(ctx, Volume{Name: "after", RW: "s"}); err != nil || next.ID <= v.ROID {
		t.Fatalf("a volume made after the read-only id %d got id %d (%v)", v.ROID, next.ID, err)
	}
	b.CatchUp(ctx)
	if rw, ok := b.ByROID(v.ROID); !ok || rw.ID != 1 {
		t.Fatalf("ByROID(%d): %+v %v", v.ROID, rw, ok)
	}
}

// The principal registry is one in the cell: each server's copy learns
// the others' changes through the watch, and of servers racing to bind
// one uid to two names exactly one wins.
func TestPrincipalsAcrossServers(t *testing.T) {
	m := member(t, t.TempDir())
	regs := make([]*principal.Registry, 4)
	for i := range regs {
		regs[i] = principal.New()
		d, err := Open(Config{Endpoints: []string{m.Endpoint}, Mirrors: []Mirror{regs[i]}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		regs[i].Keep(d)
	}
	ctx := context.Background()
	if _, err := regs[0].Identify(ctx, "t", "alice", 2001, false); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the others see alice", func() bool {
		for _, r := range regs {
			if p, ok := r.Lookup("alice"); !ok || p.UID != 2001 {
				return false
			}
		}
		return true
	})
	var wg sync.WaitGroup
	errs := make([]error, len(regs))
	for i, r := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.Identify(ctx, "t", fmt.Sprintf("user%d", i), 3000, false)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else if !errors.Is(err, syscall.EPERM) {
			t.Fatalf("a losing bind: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d names bound uid 3000: %v", won, errs)
	}
	// A copy loaded from scratch (a new server) has the registry too.
	late := principal.New()
	d, err := Open(Config{Endpoints: []string{m.Endpoint}, Mirrors: []Mirror{late}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if p, ok := late.Lookup("alice"); !ok || p.UID != 2001 {
		t.Fatalf("a new copy: alice %+v %v", p, ok)
	}
}

// A member stopped in the normal way logs no error as it stops: etcd's
// own listeners closing is not one (it logged each with a stack trace).
func TestMemberClosesQuietly(t *testing.T) {
	dir := t.TempDir()
	m, err := StartMember(MemberConfig{Dir: dir, ClientAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	open(t, m).Close()
	logFile := filepath.Join(dir, "etcd.log")
	before, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	after, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(after[len(before):]), "\n") {
		if strings.Contains(line, `"level":"error"`) || strings.Contains(line, "stacktrace") {
			t.Errorf("etcd logged at a normal stop: %.300s", line)
		}
	}
}
