package stage

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// update is a staged update in memory; Abort may come from another
// goroutine (an idle stage's).
type update struct {
	mu        sync.Mutex
	data      []byte
	truncated []uint64
	size      uint64
	sized     bool
	aborts    atomic.Int32
	aborted   chan struct{}
}

func newUpdate() *update { return &update{aborted: make(chan struct{})} }

func (u *update) WriteAt(p []byte, off int64) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if end := int(off) + len(p); end > len(u.data) {
		u.data = append(u.data, make([]byte, end-len(u.data))...)
	}
	copy(u.data[off:], p)
	return nil
}
func (u *update) Truncate(n uint64) { u.truncated = append(u.truncated, n) }
func (u *update) SetSize(n uint64)  { u.size, u.sized = n, true }
func (u *update) Abort() {
	if u.aborts.Add(1) == 1 {
		close(u.aborted)
	}
}

// isAborted reports whether u was aborted, once and only once.
func (u *update) isAborted(t *testing.T) bool {
	t.Helper()
	if n := u.aborts.Load(); n > 1 {
		t.Errorf("update aborted %d times", n)
	}
	return u.aborts.Load() > 0
}

// clock is a settable clock.
type clock struct{ now atomic.Pointer[time.Time] }

func newClock() *clock {
	c := &clock{}
	c.set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	return c
}
func (c *clock) Now() time.Time          { return *c.now.Load() }
func (c *clock) set(t time.Time)         { c.now.Store(&t) }
func (c *clock) advance(d time.Duration) { c.set(c.Now().Add(d)) }
func table(perUser bool, c *clock) *Table[*update] {
	return New[*update](perUser, c.Now, slog.New(slog.DiscardHandler))
}

var (
	alice = access.Identity{User: "alice"}
	bob   = access.Identity{User: "bob"}
	f1    = node.FID{Volume: 1, Vnode: 2, Unique: 1}
	f2    = node.FID{Volume: 1, Vnode: 3, Unique: 1}
)

// begin is a begin that records the updates it makes.
type begins []*update

func (b *begins) begin() (*update, error) {
	u := newUpdate()
	*b = append(*b, u)
	return u, nil
}

func store(name string) *pb.StoreRequest { return &pb.StoreRequest{Stage: name} }

func errno(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return pb.Errno(err)
}

// A stage is begun by its first store and continued by the next, by
// session, file and name; a store that publishes never begins one.
func TestFor(t *testing.T) {
	tb := table(true, newClock())
	var b begins
	st, err := tb.For(1, alice, f1, store("s"), b.begin)
	if err != nil || len(b) != 1 {
		t.Fatalf("first store: %v, %d begun", err, len(b))
	}
	again, err := tb.For(1, alice, f1, &pb.StoreRequest{Stage: "s", Publish: true}, b.begin)
	if err != nil || again != st || len(b) != 1 {
		t.Fatalf("the stage's next store: %v, same %v, %d begun", err, again == st, len(b))
	}
	for _, other := range []struct {
		id   callback.ClientID
		f    node.FID
		name string
	}{{2, f1, "s"}, {1, f2, "s"}, {1, f1, "t"}} {
		if o, err := tb.For(other.id, alice, other.f, store(other.name), b.begin); err != nil || o == st {
			t.Errorf("%+v: %v, the same stage %v", other, err, o == st)
		}
	}
	if tb.Len() != 4 || len(b) != 4 {
		t.Fatalf("Len %d, %d begun; want 4", tb.Len(), len(b))
	}
	for _, tc := range []struct {
		what string
		id   callback.ClientID
		hdr  *pb.StoreRequest
		want syscall.Errno
	}{
		{"no session", 0, store("x"), syscall.EINVAL},
		{"a name too long", 1, store(strings.Repeat("x", node.MaxOp+1)), syscall.EINVAL},
		{"publishing a stage unknown", 1, &pb.StoreRequest{Stage: "x", Publish: true}, syscall.EIO},
	} {
		if _, err := tb.For(tc.id, alice, f1, tc.hdr, b.begin); errno(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.what, err, tc.want)
		}
	}
	refused := errors.New("no room")
	if _, err := tb.For(1, alice, f1, store("y"), func() (*update, error) { return nil, refused }); !errors.Is(err, refused) {
		t.Errorf("a begin that failed: %v", err)
	}
	if tb.Len() != 4 || len(b) != 4 {
		t.Fatalf("refused stores kept stages: Len %d, %d begun", tb.Len(), len(b))
	}
}

// Two first stores side by side begin one stage: the second's update is
// aborted, and it gets the first's stage.
func TestForBegunMeanwhile(t *testing.T) {
	tb := table(true, newClock())
	var inner *Stage[*update]
	mine := newUpdate()
	st, err := tb.For(1, alice, f1, store("s"), func() (*update, error) {
		var b begins
		var err error
		if inner, err = tb.For(1, alice, f1, store("s"), b.begin); err != nil {
			t.Fatal(err)
		}
		return mine, nil
	})
	if err != nil || st != inner || !mine.isAborted(t) || tb.Len() != 1 {
		t.Fatalf("%v: the other's stage %v, mine aborted %v, Len %d", err, st == inner, mine.aborts.Load(), tb.Len())
	}
}

// A stage's first truncation counts, its last size does, its writes go
// to its update; once taken, nothing more reaches the update.
func TestAddWriteTake(t *testing.T) {
	tb := table(true, newClock())
	var b begins
	st, _ := tb.For(1, alice, f1, store("s"), b.begin)
	for _, hdr := range []*pb.StoreRequest{
		{HasTruncate: true, Truncate: 10, HasSize: true, Size: 100},
		{HasTruncate: true, Truncate: 5},
		{HasSize: true, Size: 200},
		{},
	} {
		st.Add(hdr)
	}
	if err := st.WriteAt([]byte("hello"), 3); err != nil {
		t.Fatal(err)
	}
	u := b[0]
	if fmt.Sprint(u.truncated) != "[10]" || !u.sized || u.size != 200 || !bytes.Equal(u.data, []byte("\x00\x00\x00hello")) {
		t.Fatalf("update: truncated %v, size %d, data %q", u.truncated, u.size, u.data)
	}
	got, err := tb.Take(st)
	if err != nil || got != u || tb.Len() != 0 {
		t.Fatalf("Take: %v, the update %v, Len %d", err, got == u, tb.Len())
	}
	if err := st.WriteAt([]byte("late"), 0); errno(err) != syscall.EIO {
		t.Errorf("a write after Take: %v", err)
	}
	st.Add(&pb.StoreRequest{HasSize: true, Size: 1})
	if _, err := tb.Take(st); errno(err) != syscall.EIO {
		t.Errorf("a second Take: %v", err)
	}
	if u.size != 200 || u.isAborted(t) {
		t.Errorf("after Take the update changed: size %d, aborted %v", u.size, u.aborts.Load())
	}
	// Taken, it no longer counts: the session may begin another under its name.
	if again, err := tb.For(1, alice, f1, store("s"), b.begin); err != nil || again == st || len(b) != 2 {
		t.Errorf("the name again: %v, the old stage %v", err, again == st)
	}
}

// A stage whose store failed stays as the error its later stores get,
// its update aborted, until its session ends.
func TestFail(t *testing.T) {
	tb := table(true, newClock())
	var b begins
	st, _ := tb.For(1, alice, f1, store("s"), b.begin)
	cause := errors.New("disk full")
	tb.Fail(st, cause)
	tb.Fail(st, errors.New("later"))
	if !b[0].isAborted(t) {
		t.Fatal("a failed stage's update was not aborted")
	}
	for _, hdr := range []*pb.StoreRequest{store("s"), {Stage: "s", Publish: true}} {
		if _, err := tb.For(1, alice, f1, hdr, b.begin); !errors.Is(err, cause) || len(b) != 1 {
			t.Errorf("a store after the failure: %v, %d begun", err, len(b))
		}
	}
	// A publication under way when another store failed (they share the
	// stage) gets the failure, and the stage stays failed.
	if _, err := tb.Take(st); !errors.Is(err, cause) {
		t.Errorf("Take of a failed stage: %v", err)
	}
	if tb.Len() != 1 {
		t.Fatalf("Len %d, want the failed stage kept", tb.Len())
	}
	tb.Drop(1)
	if _, err := tb.For(1, alice, f1, store("s"), b.begin); err != nil || len(b) != 2 {
		t.Errorf("after its session ended: %v, %d begun", err, len(b))
	}
}

// Drop ends one session's stages, or every one's.
func TestDrop(t *testing.T) {
	tb := table(true, newClock())
	var b begins
	a1, _ := tb.For(1, alice, f1, store("s"), b.begin)
	tb.For(1, alice, f2, store("s"), b.begin)
	b2, _ := tb.For(2, bob, f1, store("s"), b.begin)
	tb.Drop(1)
	if tb.Len() != 1 || !b[0].isAborted(t) || !b[1].isAborted(t) || b[2].isAborted(t) {
		t.Fatalf("Drop(1): Len %d, aborted %d %d %d", tb.Len(), b[0].aborts.Load(), b[1].aborts.Load(), b[2].aborts.Load())
	}
	if _, err := tb.Take(a1); errno(err) != syscall.EIO {
		t.Errorf("Take of a dropped stage: %v", err)
	}
	if err := a1.WriteAt([]byte("x"), 0); errno(err) != syscall.EIO {
		t.Errorf("a write to a dropped stage: %v", err)
	}
	tb.Drop(0)
	if tb.Len() != 0 || !b[2].isAborted(t) {
		t.Fatalf("Drop(0): Len %d", tb.Len())
	}
	if _, err := tb.Take(b2); err == nil {
		t.Error("a stage dropped with every session's was taken")
	}
}

// tooMany reports a refusal for too many stages: RESOURCE_EXHAUSTED,
// EAGAIN on the data channel.
func tooMany(err error) bool {
	return status.Code(err) == codes.ResourceExhausted && pb.Errno(err) == syscall.EAGAIN
}

// The bounds on stages kept: a session's, a user's (on a server with
// users), the server's. A refused store's update is aborted, and a
// stage taken makes room.
func TestLimits(t *testing.T) {
	for _, tc := range []struct {
		what    string
		perUser bool
		// sessions of alice's, each filled to MaxPerSession first
		sessions int
		who      access.Identity
		id       callback.ClientID // then one more store, by who in id
		refused  bool
	}{
		{"a session's", true, 1, alice, 1, true},
		{"another session", true, 1, alice, 2, false},
		{"a user's", true, MaxPerUser / MaxPerSession, alice, 100, true},
		{"another user", true, MaxPerUser / MaxPerSession, bob, 100, false},
		{"no users: one for all", false, MaxPerUser / MaxPerSession, alice, 100, false},
		{"the server's", false, MaxPerServer / MaxPerSession, bob, 1000, true},
	} {
		t.Run(tc.what, func(t *testing.T) {
			tb := table(tc.perUser, newClock())
			var b begins
			var first *Stage[*update]
			for id := range tc.sessions {
				for i := range MaxPerSession {
					st, err := tb.For(callback.ClientID(id+1), alice, f1, store(fmt.Sprint(i)), b.begin)
					if err != nil {
						t.Fatalf("session %d, stage %d: %v", id+1, i, err)
					}
					if first == nil {
						first = st
					}
				}
			}
			_, err := tb.For(tc.id, tc.who, f1, store("one more"), b.begin)
			if tooMany(err) != tc.refused || err != nil && !tc.refused {
				t.Fatalf("one more: %v, want refused %v", err, tc.refused)
			}
			last := b[len(b)-1]
			if last.isAborted(t) != tc.refused {
				t.Errorf("the refused store's update aborted %v", last.aborts.Load())
			}
			if !tc.refused {
				return
			}
			if tb.Len() != tc.sessions*MaxPerSession {
				t.Errorf("Len %d", tb.Len())
			}
			// One of them published makes room, wherever the bound was.
			if _, err := tb.Take(first); err != nil {
				t.Fatal(err)
			}
			if _, err := tb.For(tc.id, tc.who, f1, store("one more"), b.begin); err != nil {
				t.Errorf("after one was taken: %v", err)
			}
		})
	}
}

// A stage nobody stored to for idle is dropped when another is begun;
// one stored to meanwhile stays.
func TestIdle(t *testing.T) {
	c := newClock()
	tb := table(true, c)
	var b begins
	old, _ := tb.For(1, alice, f1, store("old"), b.begin)
	kept, _ := tb.For(1, alice, f1, store("kept"), b.begin)
	c.advance(idle - time.Second)
	if _, err := tb.For(1, alice, f1, store("kept"), b.begin); err != nil {
		t.Fatal(err)
	}
	c.advance(2 * time.Second) // old idle past the bound, kept not
	if tb.Len() != 2 {
		t.Fatalf("Len %d: stages dropped before a stage was begun", tb.Len())
	}
	tb.For(2, bob, f2, store("new"), b.begin)
	select {
	case <-b[0].aborted:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle stage's update was not aborted")
	}
	if tb.Len() != 2 || b[1].isAborted(t) {
		t.Fatalf("Len %d, the stage stored to aborted %v", tb.Len(), b[1].aborts.Load())
	}
	if _, err := tb.Take(old); errno(err) != syscall.EIO {
		t.Errorf("Take of the idle stage: %v", err)
	}
	if st, err := tb.For(1, alice, f1, &pb.StoreRequest{Stage: "old", Publish: true}, b.begin); errno(err) != syscall.EIO {
		t.Errorf("publishing the idle stage: %v, %v", st, err)
	}
	if st, err := tb.Take(kept); err != nil || st != b[1] {
		t.Errorf("Take of the stage stored to: %v", err)
	}
}
