package server

import (
	"fmt"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/callback"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
)

// Staged stores (StoreRequest.stage): a client writing a large file
// sends it as many stores, and a crash between them must not leave the
// file torn. The stores of one stage add their writes to one staged
// update, kept here across requests and seen by nobody; the store that
// publishes commits it as one version, as a single store would be. A
// stage belongs to the session that began it and ends with it.
const (
	maxStagesPerSession = 16
	// maxStagesPerUser bounds one user's across sessions: a sixteenth of
	// the server's, so that one user holding theirs leaves the others'.
	maxStagesPerUser   = 64
	maxStagesPerServer = 1024
	// stageIdle: a stage nobody stored to for this long is dropped (its
	// writer gave up on it without its session ending). A writer stores
	// its pieces one after the other, seconds apart at most.
	stageIdle = 5 * time.Minute
)

type stageKey struct {
	id   callback.ClientID
	fid  node.FID
	name string
}

type stage struct {
	key  stageKey
	user string     // whose it counts as
	mu   sync.Mutex // one write at a time, and none once closed
	u    Update
	cut  bool // the stage's truncation point is set: the first one counts
	// closed: published or dropped; the update is not ours any more.
	closed bool
	used   time.Time // under stages.mu
	// failed: a store of it failed at the server; the stage stays, as
	// this error, so that its later stores do not begin it again without
	// the writes that one lost.
	failed error
}

// stages are a server's stages, by key and by session.
type stages struct {
	mu        sync.Mutex
	m         map[stageKey]*stage
	bySession map[callback.ClientID]int
	byUser    map[string]int
}

// errStageLost: the stage a store continues or publishes is not here (its
// session ended, it was idle too long): its earlier writes are gone.
func errStageLost(f node.FID, name string) error {
	return fmt.Errorf("store %v: stage %q unknown here (its session ended, or the server restarted): its writes are gone: %w", f, name, syscall.EIO)
}

// errTooManyStages is RESOURCE_EXHAUSTED over gRPC, EAGAIN on the data
// channel; the client may try again once one of its stages is published.
func errTooManyStages(msg string) error {
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(&pb.Error{Errno: int32(syscall.EAGAIN)})
	if err != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// stageFor finds the stage a store continues, or begins it. A store that
// publishes never begins one (the client sends a store alone without a
// stage), so an unknown stage there is one that was lost.
func (s *Server) stageFor(o *op, f node.FID, hdr *pb.StoreRequest) (*stage, error) {
	if o.id == 0 {
		return nil, fmt.Errorf("store %v: a stage needs a session: %w", f, syscall.EINVAL)
	}
	if len(hdr.Stage) > node.MaxOp {
		return nil, fmt.Errorf("store %v: stage name of %d bytes, at most %d: %w", f, len(hdr.Stage), node.MaxOp, syscall.EINVAL)
	}
	key := stageKey{o.id, f, hdr.Stage}
	t := &s.stages
	t.mu.Lock()
	if st := t.m[key]; st != nil {
		defer t.mu.Unlock()
		if st.failed != nil {
			return nil, st.failed
		}
		st.used = time.Now()
		return st, nil
	}
	t.mu.Unlock()
	if hdr.Publish {
		return nil, errStageLost(f, hdr.Stage)
	}
	u, err := s.store.BeginUpdate(f, hdr.BaseVersion, hdr.DelegState != 0)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.m[key]; st != nil { // begun meanwhile by a store beside this one
		u.Abort()
		if st.failed != nil {
			return nil, st.failed
		}
		return st, nil
	}
	s.dropIdleLocked(time.Now())
	if n := t.bySession[o.id]; n >= maxStagesPerSession {
		u.Abort()
		return nil, errTooManyStages(fmt.Sprintf("store %v: %d stages unpublished in this session, the most it may have", f, n))
	}
	if n := t.byUser[o.who.User]; n >= maxStagesPerUser && s.users != nil { // on an insecure server, everyone is one user
		u.Abort()
		return nil, errTooManyStages(fmt.Sprintf("store %v: %d stages unpublished by %s, the most one user may have", f, n, o.who))
	}
	if len(t.m) >= maxStagesPerServer {
		u.Abort()
		return nil, errTooManyStages(fmt.Sprintf("store %v: %d stages unpublished on this server, the most it keeps", f, len(t.m)))
	}
	st := &stage{key: key, user: o.who.User, u: u, used: time.Now()}
	if t.m == nil {
		t.m, t.bySession, t.byUser = map[stageKey]*stage{}, map[callback.ClientID]int{}, map[string]int{}
	}
	t.m[key] = st
	t.bySession[o.id]++
	t.byUser[st.user]++
	return st, nil
}

// add stages a store's header changes: the stage's first truncation
// point counts (the client sends it with the stage's first store), the
// last size does.
func (st *stage) add(hdr *pb.StoreRequest) {
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

func (st *stage) writeAt(p []byte, off int64) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return errStageLost(st.key.fid, st.key.name)
	}
	return st.u.WriteAt(p, off)
}

// close aborts the stage's update unless it was taken.
func (st *stage) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.closed {
		st.closed = true
		st.u.Abort()
	}
}

// takeStage removes the stage for its publication: from now on the update
// is the caller's. It fails if the stage was dropped meanwhile.
func (s *Server) takeStage(st *stage) (Update, error) {
	s.stages.mu.Lock()
	if s.stages.m[st.key] == st {
		s.removeStageLocked(st)
	}
	s.stages.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil, errStageLost(st.key.fid, st.key.name)
	}
	st.closed = true
	return st.u, nil
}

// failStage keeps a stage whose store failed at the server only as the
// error its later stores get.
func (s *Server) failStage(st *stage, err error) {
	s.stages.mu.Lock()
	if s.stages.m[st.key] == st && st.failed == nil {
		st.failed = fmt.Errorf("store %v: stage %q failed before: %w", st.key.fid, st.key.name, err)
	}
	s.stages.mu.Unlock()
	st.close()
}

func (s *Server) removeStageLocked(st *stage) {
	t := &s.stages
	delete(t.m, st.key)
	if t.byUser[st.user]--; t.byUser[st.user] <= 0 {
		delete(t.byUser, st.user)
	}
	if t.bySession[st.key.id]--; t.bySession[st.key.id] <= 0 {
		delete(t.bySession, st.key.id)
	}
}

// dropIdleLocked drops stages nobody stored to for stageIdle.
func (s *Server) dropIdleLocked(now time.Time) {
	for _, st := range s.stages.m {
		if now.Sub(st.used) > stageIdle {
			s.removeStageLocked(st)
			go st.close() // not under the table's lock: it may wait for a write
		}
	}
}

// dropStages drops the stages of session id (of every session if 0): its
// back channel ended, or the server is stopping.
func (s *Server) dropStages(id callback.ClientID) {
	var drop []*stage
	s.stages.mu.Lock()
	for _, st := range s.stages.m {
		if id == 0 || st.key.id == id {
			s.removeStageLocked(st)
			drop = append(drop, st)
		}
	}
	s.stages.mu.Unlock()
	for _, st := range drop {
		s.log.Debug("stage dropped", "client", st.key.id, "fid", st.key.fid, "stage", st.key.name)
		st.close()
	}
}

// StagesOpen is how many stages the server keeps unpublished.
func (s *Server) StagesOpen() int {
	s.stages.mu.Lock()
	defer s.stages.mu.Unlock()
	return len(s.stages.m)
}
