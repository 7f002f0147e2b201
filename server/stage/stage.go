// Package stage keeps a server's staged stores (StoreRequest.stage): a
// client writing a large file sends it as many stores, and a crash
// between them must not leave the file torn. The stores of one stage add
// their writes to one staged update, kept here across requests and seen
// by nobody; the store that publishes commits it as one version, as a
// single store would be. A stage belongs to the session that began it
// and ends with it.
package stage

import (
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// The bounds on the stages kept unpublished.
const (
	MaxPerSession = 16
	// MaxPerUser bounds one user's across sessions: a sixteenth of the
	// server's, so that one user holding theirs leaves the others'.
	MaxPerUser   = 64
	MaxPerServer = 1024
	// idle: a stage nobody stored to for this long is dropped (its
	// writer gave up on it without its session ending). A writer stores
	// its pieces one after the other, seconds apart at most.
	idle = 5 * time.Minute
)

// Update is the staged update a stage's writes go to (server.Update).
type Update interface {
	WriteAt(p []byte, off int64) error
	Truncate(n uint64)
	SetSize(n uint64)
	Abort()
}

type key struct {
	id   callback.ClientID
	fid  node.FID
	name string
}

// Stage is one stage kept across requests.
type Stage[U Update] struct {
	key  key
	user string     // whose it counts as
	mu   sync.Mutex // one write at a time, and none once closed
	u    U
	cut  bool // the stage's truncation point is set: the first one counts
	// closed: published or dropped; the update is not ours any more.
	closed bool
	used   time.Time // under Table.mu
	// failed: a store of it failed at the server; the stage stays, as
	// this error, so that its later stores do not begin it again without
	// the writes that one lost.
	failed error
}

// Table is a server's stages, by key and by session.
type Table[U Update] struct {
	// perUser bounds each user's stages (on an insecure server,
	// everyone is one user).
	perUser   bool
	now       func() time.Time // when a stage is used, and idle
	log       *slog.Logger
	mu        sync.Mutex
	m         map[key]*Stage[U]
	bySession map[callback.ClientID]int
	byUser    map[string]int
}

// New is an empty table; perUser bounds each user's stages; now is the
// clock idle stages are dropped by.
func New[U Update](perUser bool, now func() time.Time, log *slog.Logger) *Table[U] {
	return &Table[U]{perUser: perUser, now: now, log: log, m: map[key]*Stage[U]{}, bySession: map[callback.ClientID]int{}, byUser: map[string]int{}}
}

// errLost: the stage a store continues or publishes is not here (its
// session ended, it was idle too long): its earlier writes are gone.
func errLost(f node.FID, name string) error {
	return fmt.Errorf("store %v: stage %q unknown here (its session ended, or the server restarted): its writes are gone: %w", f, name, syscall.EIO)
}

// errTooMany is RESOURCE_EXHAUSTED over gRPC, EAGAIN on the data
// channel; the client may try again once one of its stages is published.
func errTooMany(msg string) error {
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(&pb.Error{Errno: int32(syscall.EAGAIN)})
	if err != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// For finds the stage of session id that a store of f (header hdr) by
// who continues, or begins it with begin. A store that publishes never
// begins one (the client sends a store alone without a stage), so an
// unknown stage there is one that was lost.
func (t *Table[U]) For(id callback.ClientID, who access.Identity, f node.FID, hdr *pb.StoreRequest, begin func() (U, error)) (*Stage[U], error) {
	if id == 0 {
		return nil, fmt.Errorf("store %v: a stage needs a session: %w", f, syscall.EINVAL)
	}
	if len(hdr.Stage) > node.MaxOp {
		return nil, fmt.Errorf("store %v: stage name of %d bytes, at most %d: %w", f, len(hdr.Stage), node.MaxOp, syscall.EINVAL)
	}
	k := key{id, f, hdr.Stage}
	t.mu.Lock()
	if st := t.m[k]; st != nil {
		defer t.mu.Unlock()
		if st.failed != nil {
			return nil, st.failed
		}
		st.used = t.now()
		return st, nil
	}
	t.mu.Unlock()
	if hdr.Publish {
		return nil, errLost(f, hdr.Stage)
	}
	u, err := begin()
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.m[k]; st != nil { // begun meanwhile by a store beside this one
		u.Abort()
		if st.failed != nil {
			return nil, st.failed
		}
		return st, nil
	}
	now := t.now()
	t.dropIdleLocked(now)
	if n := t.bySession[id]; n >= MaxPerSession {
		u.Abort()
		return nil, errTooMany(fmt.Sprintf("store %v: %d stages unpublished in this session, the most it may have", f, n))
	}
	if n := t.byUser[who.User]; n >= MaxPerUser && t.perUser {
		u.Abort()
		return nil, errTooMany(fmt.Sprintf("store %v: %d stages unpublished by %s, the most one user may have", f, n, who))
	}
	if len(t.m) >= MaxPerServer {
		u.Abort()
		return nil, errTooMany(fmt.Sprintf("store %v: %d stages unpublished on this server, the most it keeps", f, len(t.m)))
	}
	st := &Stage[U]{key: k, user: who.User, u: u, used: now}
	t.m[k] = st
	t.bySession[id]++
	t.byUser[st.user]++
	return st, nil
}

// Add stages a store's header changes: the stage's first truncation
// point counts (the client sends it with the stage's first store), the
// last size does.
func (st *Stage[U]) Add(hdr *pb.StoreRequest) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	if hdr.HasTruncate && !st.cut {
		st.u.Truncate(hdr.Truncate)
		st.cut = true
	}
	if hdr.HasSize {
		st.u.SetSize(hdr.Size)
	}
}

// WriteAt adds a store's write to the stage.
func (st *Stage[U]) WriteAt(p []byte, off int64) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return errLost(st.key.fid, st.key.name)
	}
	return st.u.WriteAt(p, off)
}

// close aborts the stage's update unless it was taken.
func (st *Stage[U]) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.closed {
		st.closed = true
		st.u.Abort()
	}
}

// Take removes the stage for its publication: from now on the update is
// the caller's. It fails if the stage was dropped or failed meanwhile; a
// failed one stays, as Fail keeps it.
func (t *Table[U]) Take(st *Stage[U]) (U, error) {
	var none U
	t.mu.Lock()
	failed := st.failed
	if t.m[st.key] == st && failed == nil {
		t.removeLocked(st)
	}
	t.mu.Unlock()
	if failed != nil {
		return none, failed
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return none, errLost(st.key.fid, st.key.name)
	}
	st.closed = true
	return st.u, nil
}

// Fail keeps a stage whose store failed at the server only as the error
// its later stores get.
func (t *Table[U]) Fail(st *Stage[U], err error) {
	t.mu.Lock()
	if t.m[st.key] == st && st.failed == nil {
		st.failed = fmt.Errorf("store %v: stage %q failed before: %w", st.key.fid, st.key.name, err)
	}
	t.mu.Unlock()
	st.close()
}

func (t *Table[U]) removeLocked(st *Stage[U]) {
	delete(t.m, st.key)
	if t.byUser[st.user]--; t.byUser[st.user] <= 0 {
		delete(t.byUser, st.user)
	}
	if t.bySession[st.key.id]--; t.bySession[st.key.id] <= 0 {
		delete(t.bySession, st.key.id)
	}
}

// dropIdleLocked drops stages nobody stored to for idle.
func (t *Table[U]) dropIdleLocked(now time.Time) {
	for _, st := range t.m {
		if now.Sub(st.used) > idle {
			t.removeLocked(st)
			go st.close() // not under the table's lock: it may wait for a write
		}
	}
}

// Drop drops the stages of session id (of every session if 0): its back
// channel ended, or the server is stopping.
func (t *Table[U]) Drop(id callback.ClientID) {
	var drop []*Stage[U]
	t.mu.Lock()
	for _, st := range t.m {
		if id == 0 || st.key.id == id {
			t.removeLocked(st)
			drop = append(drop, st)
		}
	}
	t.mu.Unlock()
	for _, st := range drop {
		t.log.Debug("stage dropped", "client", st.key.id, "fid", st.key.fid, "stage", st.key.name)
		st.close()
	}
}

// Len is how many stages are kept unpublished.
func (t *Table[U]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
