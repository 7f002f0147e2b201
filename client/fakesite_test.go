package client

// A fake site: the delegation rules of the cache manager tested against a
// file server kept in memory, with no network and no goroutine of its
// own. The test plays the server's back channel by calling handler, and
// every request the client makes lands in the fake's log, in order.

import (
	"context"
	"errors"
	"fmt"
	"github.com/hoardfs/hoard/client/site"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cache"
	"github.com/hoardfs/hoard/callback"
	"github.com/hoardfs/hoard/client/lost"
	"github.com/hoardfs/hoard/client/policy"
	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/node"
	"google.golang.org/grpc"
)

// fakeServer is a file server in memory: files and directories by FID,
// with delegations granted as grant says.
type fakeServer struct {
	pb.FileServerClient // what the fake does not serve panics (nil)

	mu    sync.Mutex
	files map[node.FID]*fakeFile
	// grant is what an Open grants (DELEG_NONE: nothing); dirGrant is
	// what an Open asking only for a delegation on a directory grants.
	grant, dirGrant pb.DelegKind
	state           uint64 // the last delegation state handed out
	next            uint64 // the last vnode handed out (Reserve)
	// refuse, when set, refuses stores with that errno (a revoked
	// delegation: ESTALE); refuseSettle refuses CreateReserved.
	refuse, refuseSettle syscall.Errno
	// bareSettle: CreateReserved grants the files no write delegation
	// (as for a client backing off after recalls).
	bareSettle bool
	// onOpen, when set, runs inside every Open, before its reply.
	onOpen func()
	renews int
	log    []string
	stores []datapath.StoreArgs
	data   map[node.FID][]byte
}

type fakeFile struct {
	st      node.Status
	entries map[string]node.FID
}

const fakeVolume = 7

func newFakeServer() *fakeServer {
	f := &fakeServer{files: map[node.FID]*fakeFile{}, data: map[node.FID][]byte{}, grant: pb.DelegKind_DELEG_WRITE,
		dirGrant: pb.DelegKind_DELEG_WRITE, next: 100}
	f.add(node.Status{FID: fakeRoot, Type: node.TypeDir, Mode: 0o777, Nlink: 2, DataVersion: 1})
	return f
}

var fakeRoot = node.FID{Volume: fakeVolume, Vnode: 1, Unique: 1}

// add puts a file (or directory) at the server, named in the root when it
// is not the root.
func (f *fakeServer) add(st node.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ff := &fakeFile{st: st}
	if st.Type == node.TypeDir {
		ff.entries = map[string]node.FID{}
	}
	f.files[st.FID] = ff
}

func (f *fakeServer) note(format string, args ...any) {
	f.log = append(f.log, fmt.Sprintf(format, args...))
}

// took returns the log so far and empties it.
func (f *fakeServer) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.log
	f.log = nil
	return l
}

func (f *fakeServer) statusOf(fid node.FID) (*pb.Status, error) {
	ff := f.files[fid]
	if ff == nil {
		return nil, syscall.ESTALE
	}
	st := ff.st
	st.Rights = uint8(access.All) | node.RightsKnown
	return pb.FromStatus(st, time.Minute), nil
}

func (f *fakeServer) GetStatus(_ context.Context, in *pb.GetStatusRequest, _ ...grpc.CallOption) (*pb.GetStatusReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &pb.GetStatusReply{}
	for _, fid := range in.Fids {
		ps, err := f.statusOf(fid.ToFID())
		r := &pb.StatusResult{Status: ps}
		if err != nil {
			r.Errno = int32(err.(syscall.Errno))
		}
		out.Results = append(out.Results, r)
	}
	return out, nil
}

func (f *fakeServer) Open(_ context.Context, in *pb.OpenRequest, _ ...grpc.CallOption) (*pb.OpenReply, error) {
	f.mu.Lock()
	hook := f.onOpen
	fid := in.Fid.ToFID()
	ff := f.files[fid]
	if ff == nil {
		f.mu.Unlock()
		return nil, syscall.ESTALE
	}
	kind := f.grant
	if ff.st.Type == node.TypeDir {
		kind = f.dirGrant
	}
	if !in.Write && kind == pb.DelegKind_DELEG_WRITE && ff.st.Type == node.TypeFile {
		kind = pb.DelegKind_DELEG_READ
	}
	var state uint64
	if kind != pb.DelegKind_DELEG_NONE {
		f.state++
		state = f.state
	}
	f.note("open %d write=%v only=%v reclaim=%d -> %d", fid.Vnode, in.Write, in.DelegationOnly, in.Reclaim, state)
	ps, _ := f.statusOf(fid)
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	return &pb.OpenReply{Status: ps, Kind: kind, State: state, Recorded: kind == pb.DelegKind_DELEG_NONE}, nil
}

func (f *fakeServer) Close(_ context.Context, in *pb.CloseRequest, _ ...grpc.CallOption) (*pb.CloseReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("close %d write=%v", in.Fid.Vnode, in.Write)
	return &pb.CloseReply{}, nil
}

func (f *fakeServer) Return(_ context.Context, in *pb.ReturnRequest, _ ...grpc.CallOption) (*pb.ReturnReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("return %d state=%d", in.Fid.Vnode, in.State)
	return &pb.ReturnReply{Accepted: true}, nil
}

// Renew is counted, not logged: a recall's renewal runs beside its give
// back.
func (f *fakeServer) Renew(context.Context, *pb.RenewRequest, ...grpc.CallOption) (*pb.RenewReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renews++
	return &pb.RenewReply{}, nil
}

func (f *fakeServer) renewed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renews
}

// Locate says every volume is here: the fake is a cell of one.
func (f *fakeServer) Locate(_ context.Context, in *pb.LocateRequest, _ ...grpc.CallOption) (*pb.Location, error) {
	return &pb.Location{Id: fakeVolume, Name: "fake", Here: true}, nil
}

func (f *fakeServer) ReadDir(_ context.Context, in *pb.ReadDirRequest, _ ...grpc.CallOption) (*pb.ReadDirReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir := f.files[in.Dir.ToFID()]
	if dir == nil || dir.entries == nil {
		return nil, syscall.ENOTDIR
	}
	ps, _ := f.statusOf(dir.st.FID)
	out := &pb.ReadDirReply{Dir: ps, Eof: true}
	names := make([]string, 0, len(dir.entries))
	for name := range dir.entries {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		fid := dir.entries[name]
		out.Entries = append(out.Entries, &pb.DirEntry{Name: name, Fid: pb.FromFID(fid), Type: pb.FromType(f.files[fid].st.Type), Cookie: uint64(i + 1)})
	}
	return out, nil
}

func (f *fakeServer) Reserve(_ context.Context, in *pb.ReserveRequest, _ ...grpc.CallOption) (*pb.ReserveReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("reserve %d", in.Count)
	out := &pb.ReserveReply{}
	for range in.Count {
		f.next++
		out.Fids = append(out.Fids, pb.FromFID(node.FID{Volume: in.Volume, Vnode: f.next, Unique: 1}))
	}
	return out, nil
}

func (f *fakeServer) Create(_ context.Context, in *pb.CreateRequest, _ ...grpc.CallOption) (*pb.CreateReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir := f.files[in.Dir.ToFID()]
	if _, ok := dir.entries[in.Name]; ok {
		return nil, syscall.EEXIST
	}
	f.next++
	fid := node.FID{Volume: fakeVolume, Vnode: f.next, Unique: 1}
	f.files[fid] = &fakeFile{st: node.Status{FID: fid, Type: in.Type.ToType(), Mode: in.Mode, Nlink: 1, DataVersion: 1}}
	dir.entries[in.Name] = fid
	dir.st.DataVersion++
	f.state++
	f.note("create %s -> %d", in.Name, f.state)
	ps, _ := f.statusOf(fid)
	ds, _ := f.statusOf(dir.st.FID)
	return &pb.CreateReply{Status: ps, Dir: ds, Created: true, Kind: f.grant, State: f.state}, nil
}

func (f *fakeServer) CreateReserved(_ context.Context, in *pb.CreateReservedRequest, _ ...grpc.CallOption) (*pb.CreateReservedReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir := f.files[in.Dir.ToFID()]
	if f.refuseSettle != 0 {
		f.note("settle refused")
		return nil, f.refuseSettle
	}
	var made, gone []string
	out := &pb.CreateReservedReply{}
	for _, r := range in.Removed {
		ps, _ := f.statusOf(r.Fid.ToFID())
		ps.Nlink = 0
		delete(dir.entries, r.Name)
		delete(f.files, r.Fid.ToFID())
		gone = append(gone, r.Name)
		dir.st.DataVersion++
		out.Removed = append(out.Removed, ps)
	}
	for _, r := range in.Files {
		fid := r.Fid.ToFID()
		st := node.Status{FID: fid, Type: node.TypeFile, Mode: r.Mode, Nlink: 1, DataVersion: 1}
		f.files[fid] = &fakeFile{st: st}
		dir.entries[r.Name] = fid
		dir.st.DataVersion++
		made = append(made, r.Name)
		ps, _ := f.statusOf(fid)
		out.Files = append(out.Files, ps)
		if f.bareSettle {
			out.States = append(out.States, 0)
			continue
		}
		f.state++
		out.States = append(out.States, f.state)
	}
	f.note("settle %d made=%v removed=%v", in.Dir.Vnode, made, gone)
	out.Dir, _ = f.statusOf(dir.st.FID)
	return out, nil
}

// fakeData is the fake's bulk-data path.
type fakeData struct{ f *fakeServer }

func (d fakeData) Fetch(_ context.Context, fid node.FID, off, n int64, _ int, sink datapath.Sink) (node.Status, time.Duration, error) {
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	ps, err := f.statusOf(fid)
	if err != nil {
		return node.Status{}, 0, err
	}
	st, ttl, _ := ps.ToStatus()
	data := f.data[fid]
	if off < int64(len(data)) {
		if err := sink(off, st.DataVersion, slices.Clone(data[off:min(off+n, int64(len(data)))])); err != nil {
			return node.Status{}, 0, err
		}
	}
	return st, ttl, nil
}

func (d fakeData) Store(_ context.Context, a datapath.StoreArgs) (node.Status, time.Duration, error) {
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.note("store %d deleg=%d", a.FID.Vnode, a.DelegState)
	if f.refuse != 0 {
		return node.Status{}, 0, f.refuse
	}
	ff := f.files[a.FID]
	if ff == nil {
		return node.Status{}, 0, syscall.ESTALE
	}
	data := f.data[a.FID]
	if a.HasTruncate {
		data = data[:min(int64(len(data)), int64(a.Truncate))]
	}
	for _, r := range a.Ranges {
		buf := make([]byte, r.Len)
		if err := a.Read(buf, r.Off); err != nil {
			return node.Status{}, 0, err
		}
		if end := r.Off + r.Len; end > int64(len(data)) {
			data = append(data, make([]byte, end-int64(len(data)))...)
		}
		copy(data[r.Off:], buf)
	}
	if a.HasSize {
		data = append(data, make([]byte, max(0, int64(a.Size)-int64(len(data))))...)[:a.Size]
	}
	f.data[a.FID] = data
	ff.st.Size = uint64(len(data))
	ff.st.DataVersion++
	f.stores = append(f.stores, a)
	ps, _ := f.statusOf(a.FID)
	st, ttl, _ := ps.ToStatus()
	return st, ttl, nil
}

// fakeLink is a connection that is always up and calls at once; each
// answer extends the lease, as conn's do (handler.Answered).
type fakeLink struct {
	f        *fakeServer
	answered func(sent time.Time)
}

func (l fakeLink) As(string) site.Caller { return l }

func (l fakeLink) Call(fn func(ctx context.Context) error) error {
	sent := time.Now()
	err := fn(context.Background())
	if err == nil && l.answered != nil {
		l.answered(sent)
	}
	return err
}

func (l fakeLink) CallData(fn func(ctx context.Context) error) error { return l.Call(fn) }
func (l fakeLink) CallOnce(_ string, fn func(ctx context.Context) error) error {
	return l.Call(fn)
}
func (l fakeLink) CallPatient(_ time.Duration, fn func(ctx context.Context) error) error {
	return l.Call(fn)
}
func (l fakeLink) Ready() bool                           { return true }
func (l fakeLink) AwaitReady(time.Time) error            { return nil }
func (l fakeLink) Data() datapath.Path                   { return fakeData{l.f} }
func (l fakeLink) Session() string                       { return "fake" }
func (l fakeLink) AwaitSession(string, time.Time) string { return "fake" }
func (l fakeLink) GiveUp(time.Time)                      {}
func (l fakeLink) GiveUpAt() time.Time                   { return time.Time{} }
func (l fakeLink) RPCs() int64                           { return 0 }
func (l fakeLink) Close()                                {}

// fakeClient is a Client whose one site is a fakeServer, with the lease
// announced and no background goroutines: the test runs the flusher,
// the expirer's steps and the back channel itself.
type fakeClient struct {
	*Client
	t   *testing.T
	srv *fakeServer
	at  *site.Site
	h   handler
}

func newFakeClient(t *testing.T, opts Options) *fakeClient {
	t.Helper()
	opts.Server = "fake:1"
	opts.CacheDir = t.TempDir()
	opts.defaults()
	if os.Getenv("HOARD_TEST_LOG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	} else {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ch, err := cache.Open(cache.Options{Dir: opts.CacheDir, Size: 1 << 26, ChunkSize: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{opts: opts, log: opts.Logger, cache: ch, nodes: map[node.FID]*Node{}, forgotten: map[*Node]struct{}{},
		vols: map[string]*pb.Volume{}, fetchSem: make(chan struct{}, 4), ctx: ctx, cancel: cancel}
	c.ghosts = policy.NewGhosts(16, time.Minute)
	c.flusher = newFlusher(c)
	srv := newFakeServer()
	s := site.New(opts.Server, "", nil, srv, opts.NoDelegations, c.log)
	c.sites = site.NewSites(cellOf{c}, s)
	fc := &fakeClient{Client: c, t: t, srv: srv, at: s, h: handler{c, s}}
	s.Conn = fakeLink{srv, fc.h.Answered}
	fc.h.Welcome(&pb.Welcome{Epoch: 1, LeaseMs: 60_000})
	// The flusher runs only when a test drains it: its ticks never come.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.flusher.Run(ctx, make(chan time.Time))
	}()
	t.Cleanup(func() {
		c.Close()
	})
	root, err := c.fresh(c.node(fakeRoot, s), c.self)
	if err != nil || root.Type != node.TypeDir {
		t.Fatalf("root: %v %v", root, err)
	}
	c.root = c.node(fakeRoot, s)
	return fc
}

// file puts a file with content at the server, named name in the root.
func (fc *fakeClient) file(name string, content string) *Node {
	fc.t.Helper()
	f := fc.srv
	f.mu.Lock()
	f.next++
	fid := node.FID{Volume: fakeVolume, Vnode: f.next, Unique: 1}
	f.files[fid] = &fakeFile{st: node.Status{FID: fid, Type: node.TypeFile, Mode: 0o644, Nlink: 1, DataVersion: 1, Size: uint64(len(content))}}
	f.data[fid] = []byte(content)
	f.files[fakeRoot].entries[name] = fid
	f.files[fakeRoot].st.DataVersion++
	f.mu.Unlock()
	n := fc.node(fid, fc.at)
	if _, err := fc.fresh(n, fc.self); err != nil {
		fc.t.Fatal(err)
	}
	return n
}

// open opens n through the Nodes API.
func (fc *fakeClient) open(n *Node, flag int) *File {
	fc.t.Helper()
	f, err := fc.Nodes().Open(n, nil, "", "f", flag)
	if err != nil {
		fc.t.Fatal(err)
	}
	return f
}

// write writes s at 0 to a new open of n, and closes it.
func (fc *fakeClient) write(n *Node, s string) {
	fc.t.Helper()
	f := fc.open(n, os.O_RDWR)
	if _, err := f.WriteAt([]byte(s), 0); err != nil {
		fc.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		fc.t.Fatal(err)
	}
}

// settled waits for the protocol work the client started in the
// background (give backs, reclaims, settles).
func (fc *fakeClient) settled() { fc.bg.Wait() }

// want checks the requests made since the last check, in order.
func (fc *fakeClient) want(want ...string) {
	fc.t.Helper()
	got := fc.srv.took()
	if !slices.Equal(got, want) {
		fc.t.Fatalf("requests:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(want, "\n       "))
	}
}

func (fc *fakeClient) held(n *Node) (callback.Held, bool) { return delegationAt(fc.at, n) }

func (fc *fakeClient) content(n *Node) string {
	fc.srv.mu.Lock()
	defer fc.srv.mu.Unlock()
	return string(fc.srv.data[n.fid])
}

func recallOf(n *Node, state uint64) *pb.Recall {
	return &pb.Recall{Fids: []*pb.FID{pb.FromFID(n.fid)}, States: []uint64{state}}
}

// Under a write delegation, opens and closes are local and writes stay
// in the cache past Close; a recall stores them, naming the delegation,
// before the delegation is given back.
func TestFakeSiteRecallStoresBeforeReturn(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.file("a", "")
	fc.write(n, "hello")
	fc.want("open 101 write=true only=false reclaim=0 -> 1")
	fc.write(n, "HELLO")
	fc.want() // the second open and both closes were local
	if h, ok := fc.held(n); !ok || h.Kind != callback.DelegWrite || h.State != 1 {
		t.Fatalf("delegation %+v %v, want write state 1", h, ok)
	}
	if n.entry.DirtyBytes() == 0 {
		t.Fatal("writes stored at close under a write delegation")
	}
	fc.h.Recall(recallOf(n, 1), 1)
	fc.settled()
	fc.want("store 101 deleg=1", "return 101 state=1")
	if fc.srv.renewed() != 1 {
		t.Fatalf("%d renewals, want the recall's one", fc.srv.renewed())
	}
	if got := fc.content(n); got != "HELLO" {
		t.Fatalf("server has %q", got)
	}
	if _, ok := fc.held(n); ok {
		t.Fatal("delegation still held after its return")
	}
	if fc.counters.localOpens.Load() != 1 || fc.counters.localCloses.Load() != 2 {
		t.Fatalf("local opens %d closes %d, want 1 and 2", fc.counters.localOpens.Load(), fc.counters.localCloses.Load())
	}
}

// A revoked delegation's writes cannot be stored: the server refuses
// them, they are kept in lost/, and the file's next Sync says so.
func TestFakeSiteRevokedWritesKeptInLost(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.file("a", "")
	fc.write(n, "doomed")
	fc.srv.took()
	fc.srv.refuse = syscall.ESTALE
	fc.h.Revoke(&pb.Revoke{Fids: []*pb.FID{pb.FromFID(n.fid)}, States: []uint64{1}})
	fc.settled()
	fc.want("store 101 deleg=1", "return 101 state=1")
	if fc.counters.revoked.Load() != 1 || fc.counters.lost.Load() != 1 {
		t.Fatalf("revoked %d lost %d, want 1 and 1", fc.counters.revoked.Load(), fc.counters.lost.Load())
	}
	err := n.takeLost()
	var le *lost.Error
	if !errors.As(err, &le) || le.Kept == "" {
		t.Fatalf("lost error %v, want one naming where the writes were kept", err)
	}
	if _, err := os.Stat(le.Kept); err != nil {
		t.Fatalf("lost/ does not have them: %v", err)
	}
}

// A lease that ran out takes the delegations with it: the client stops
// trusting them, stores what they covered (the server judges) and gives
// them back; before that, it renews while a third is left.
func TestFakeSiteLeaseLapseAndRenewal(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.file("a", "")
	fc.write(n, "x")
	fc.srv.took()
	now := time.Now()
	if lapsed := fc.at.KeepLease(now); len(lapsed) != 0 {
		t.Fatalf("lapsed at once: %v", lapsed)
	}
	fc.at.KeepLease(now.Add(50 * time.Second)) // less than 2/3 of 60 s left
	if !poll.Until(5*time.Second, func() bool { return fc.srv.renewed() == 1 }) {
		t.Fatal("no renewal with a third of the lease left")
	}
	lapsed := fc.at.KeepLease(now.Add(2 * time.Minute))
	if len(lapsed) != 1 || lapsed[0].FID != n.fid {
		t.Fatalf("lapsed %v, want the file's delegation", lapsed)
	}
	fc.giveBackAll(fc.at, lapsed)
	fc.settled()
	fc.want("store 101 deleg=1", "return 101 state=1")
}

// A grant that arrives after the session changed (a reset between the
// request and its reply) is not used, but given back at once, so that
// nobody waits a lease for it.
func TestFakeSiteVoidedGrantReturned(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.file("a", "")
	fc.srv.onOpen = func() { fc.h.Reset(); fc.srv.onOpen = nil }
	f := fc.open(n, os.O_RDWR)
	fc.settled()
	fc.want("open 101 write=true only=false reclaim=0 -> 1", "return 101 state=1")
	if _, ok := fc.held(n); ok {
		t.Fatal("a voided grant was installed")
	}
	f.Close()
}

// A recall of a delegation this process never held (handed over from an
// earlier process of the same line of sessions) is answered with a
// return; one it holds no more (already given back) with nothing.
func TestFakeSiteRecallOfUnknownDelegation(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.file("a", "")
	fc.h.Recall(recallOf(n, 3), 10) // before this session's states
	fc.settled()
	fc.want("return 101 state=3")
	fc.h.Recall(recallOf(n, 12), 10)
	fc.settled()
	fc.want()
}

// After a new session, dirty data made under a write delegation is
// reclaimed as its writer: the new grant covers it, nothing is stored;
// after a reset, the server refuses it, and it is kept in lost/.
func TestFakeSiteNewSessionReclaims(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.file("a", "")
	fc.write(n, "kept")
	fc.srv.took()
	fc.h.Resumed()
	fc.settled()
	fc.want("open 101 write=true only=false reclaim=1 -> 2")
	if h, ok := fc.held(n); !ok || h.State != 2 {
		t.Fatalf("delegation after reclaim %+v %v, want state 2", h, ok)
	}
	if n.entry.DirtyBytes() == 0 {
		t.Fatal("reclaimed writes were stored rather than kept under the new grant")
	}
	fc.srv.refuse = syscall.ESTALE
	fc.h.Reset()
	fc.settled()
	fc.want("store 101 deleg=2")
	if fc.counters.lost.Load() != 1 {
		t.Fatalf("lost %d after a reset, want 1", fc.counters.lost.Load())
	}
}

// The flusher stores a delegated file's writes once they are older than
// the flush age, keeping the delegation.
func TestFakeSiteFlusherStoresUnderDelegation(t *testing.T) {
	fc := newFakeClient(t, Options{FlushAge: time.Millisecond})
	n := fc.file("a", "")
	fc.write(n, "flushed")
	fc.srv.took()
	time.Sleep(2 * time.Millisecond)
	fc.flusher.Drain(dirtyNode{})
	fc.want("store 101 deleg=1")
	if fc.content(n) != "flushed" || n.entry.DirtyBytes() != 0 {
		t.Fatalf("server has %q, dirty %d", fc.content(n), n.entry.DirtyBytes())
	}
	if _, ok := fc.held(n); !ok {
		t.Fatal("the flush gave the delegation up")
	}
}

// Without delegations every open and close asks the server, and Close
// stores.
func TestFakeSiteNoDelegations(t *testing.T) {
	fc := newFakeClient(t, Options{NoDelegations: true})
	n := fc.file("a", "")
	fc.write(n, "plain")
	fc.want("store 101 deleg=0")
	if fc.content(n) != "plain" {
		t.Fatalf("server has %q", fc.content(n))
	}
}

// A server that grants nothing records the opens it is asked for, and
// hears of their closes; a reader under a callback promise asks nothing
// (no writer can hold a delegation meanwhile).
func TestFakeSiteRecordedOpensClosed(t *testing.T) {
	fc := newFakeClient(t, Options{})
	fc.srv.grant = pb.DelegKind_DELEG_NONE
	n := fc.file("a", "abc")
	f := fc.open(n, os.O_RDONLY)
	buf := make([]byte, 3)
	if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "abc" {
		t.Fatalf("read %q %v", buf, err)
	}
	f.Close()
	fc.want()
	fc.write(n, "xyz")
	fc.want("open 101 write=true only=false reclaim=0 -> 0", "store 101 deleg=0", "close 101 write=true")
	if fc.content(n) != "xyz" {
		t.Fatalf("server has %q", fc.content(n))
	}
}

// make makes file name in the root through the Nodes API.
func (fc *fakeClient) make(name string) *Node {
	fc.t.Helper()
	n, err := fc.Nodes().Create(Make{Dir: fc.root, Name: name, Type: node.TypeFile, Mode: 0o644})
	if err != nil {
		fc.t.Fatal(err)
	}
	return n
}

// names lists the root as the client has it.
func (fc *fakeClient) names() []string {
	fc.t.Helper()
	ents, err := fc.Nodes().ReadDir(fc.root)
	if err != nil {
		fc.t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name)
	}
	slices.Sort(out)
	return out
}

// atServer lists the root as the server has it.
func (fc *fakeClient) atServer() []string {
	fc.srv.mu.Lock()
	defer fc.srv.mu.Unlock()
	var out []string
	for name := range fc.srv.files[fakeRoot].entries {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Under a directory's write delegation, files are made here with FIDs
// the server reserved, listed at once, and created at the server in one
// request at the next settle (an fsync of the directory).
func TestFakeSiteDirDelegationMakesHere(t *testing.T) {
	fc := newFakeClient(t, Options{})
	for _, name := range []string{"a", "b", "c"} {
		fc.make(name)
	}
	fc.want("open 1 write=true only=true reclaim=0 -> 1", "reserve 64")
	if got := fc.names(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("listing %v", got)
	}
	if got := fc.atServer(); len(got) != 0 {
		t.Fatalf("the server has %v before the settle", got)
	}
	fc.want()
	if err := fc.Nodes().SyncDir(fc.root); err != nil {
		t.Fatal(err)
	}
	fc.want("settle 1 made=[a b c] removed=[]")
	if got := fc.atServer(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("the server has %v after the settle", got)
	}
	if fc.counters.madeHere.Load() != 3 || fc.counters.settled.Load() != 3 {
		t.Fatalf("made %d settled %d, want 3 and 3", fc.counters.madeHere.Load(), fc.counters.settled.Load())
	}
}

// A recall of the directory's delegation settles the files made under
// it before the delegation goes back: whoever asked finds them there.
func TestFakeSiteDirRecallSettlesFirst(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.make("x")
	fc.srv.took()
	if n.made() != fc.root {
		t.Fatal("the file was not made here")
	}
	fc.h.Recall(recallOf(fc.root, 1), 1)
	fc.settled()
	fc.want("settle 1 made=[x] removed=[]", "return 1 state=1")
	if n.made() != nil {
		t.Fatal("the file is still only here after the recall")
	}
}

// A file a recall's settle creates without a write delegation of its own
// has its writes stored before the directory's delegation goes back,
// even while another store of it (the flusher's) is under way: nothing
// covers them once the directory is returned, and whoever recalled it
// may open the file next.
func TestFakeSiteDirRecallStoresBareFiles(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.make("x")
	f := fc.open(n, os.O_RDWR)
	if _, err := f.WriteAt([]byte("data"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	fc.srv.took()
	fc.srv.bareSettle = true
	n.wmu.Lock() // a store of x under way
	fc.h.Recall(recallOf(fc.root, 1), 1)
	poll.Wait(t, 5*time.Second, "the recall's settle", func() bool { return n.made() == nil })
	n.wmu.Unlock()
	fc.settled()
	fc.want("settle 1 made=[x] removed=[]", "store "+strconv.FormatUint(n.fid.Vnode, 10)+" deleg=0", "return 1 state=1")
	if got := fc.content(n); got != "data" {
		t.Fatalf("the server has %q", got)
	}
}

// A file made here and removed before any settle never reaches the
// server; one the server knows, under a write delegation of its own, is
// removed there at the next settle, in the same request as new files.
func TestFakeSiteDirRemovesHere(t *testing.T) {
	fc := newFakeClient(t, Options{})
	fc.make("tmp")
	if err := fc.Nodes().Remove(fc.root, "tmp", false); err != nil {
		t.Fatal(err)
	}
	fc.make("kept")
	fc.srv.took()
	if got := fc.names(); !slices.Equal(got, []string{"kept"}) {
		t.Fatalf("listing %v", got)
	}
	if err := fc.Nodes().SyncDir(fc.root); err != nil {
		t.Fatal(err)
	}
	fc.want("settle 1 made=[kept] removed=[]")
	if fc.counters.madeDropped.Load() != 1 {
		t.Fatalf("made and dropped %d, want 1", fc.counters.madeDropped.Load())
	}
	if err := fc.Nodes().Remove(fc.root, "kept", false); err != nil {
		t.Fatal(err)
	}
	fc.make("next")
	fc.want()
	if err := fc.Nodes().SyncDir(fc.root); err != nil {
		t.Fatal(err)
	}
	fc.want("settle 1 made=[next] removed=[kept]")
	if got := fc.atServer(); !slices.Equal(got, []string{"next"}) {
		t.Fatalf("the server has %v", got)
	}
}

// A rename of a file made here, not yet at the server, is a rename of
// the name to be created.
func TestFakeSiteDirRenamesHere(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.make("old")
	fc.srv.took()
	fid, err := fc.Nodes().Rename(fc.root, "old", fc.root, "new")
	if err != nil || fid != n.fid {
		t.Fatalf("rename: %v %v", fid, err)
	}
	fc.want()
	if got := fc.names(); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("listing %v", got)
	}
	if err := fc.Nodes().SyncDir(fc.root); err != nil {
		t.Fatal(err)
	}
	fc.want("settle 1 made=[new] removed=[]")
}

// Files the server refuses to create (the directory's delegation went,
// no room) are given up: their names leave the listing, and what was
// written to them is kept in lost/ and reported at their next close.
func TestFakeSiteDirRefusedSettleLosesFiles(t *testing.T) {
	fc := newFakeClient(t, Options{})
	n := fc.make("refused")
	f := fc.open(n, os.O_RDWR)
	if _, err := f.WriteAt([]byte("data"), 0); err != nil {
		t.Fatal(err)
	}
	fc.srv.took()
	fc.srv.refuseSettle = syscall.ENOSPC
	if err := fc.Nodes().SyncDir(fc.root); err == nil {
		t.Fatal("a refused settle was not reported")
	}
	fc.want("settle refused")
	if err := f.Close(); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("close after a refused create: %v, want the writes kept in lost/", err)
	}
	fc.srv.refuseSettle = 0
	if got := fc.names(); slices.Contains(got, "refused") {
		t.Fatalf("listing %v still has the refused file", got)
	}
}

// Without directory delegations every create asks the server, and a
// new file comes with a write delegation of its own.
func TestFakeSiteNoDirDelegations(t *testing.T) {
	fc := newFakeClient(t, Options{NoDirDelegations: true})
	n := fc.make("a")
	fc.want("create a -> 1")
	if h, ok := fc.held(n); !ok || h.Kind != callback.DelegWrite {
		t.Fatalf("delegation on a new file %+v %v", h, ok)
	}
	if got := fc.atServer(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("the server has %v", got)
	}
}
