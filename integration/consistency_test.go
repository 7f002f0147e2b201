package integration

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
)

// The consistency checker: clients run random file sessions on a
// few shared names across a server crash, every operation is recorded with
// its invocation and response times, and porcupine decides whether some
// order of them explains what each one saw. The model is explained in
// docs/consistency.md.

// consNames are the shared names, in one directory.
var consNames = [...]string{"f0", "f1", "f2", "f3"}

// consSlow bounds an operation of a run: longer than the RPC timeout
// (10 s), shorter than the lease (30 s).
const consSlow = 20 * time.Second

// consGrace is the server's grace period after the restart: its default.
// With the harness's 1 s, a client that reconnected late on a busy
// machine now and then missed the reclaim of its write-back data (1 run
// in 10).
const consGrace = 3 * time.Second

// never is the response time of an operation whose outcome is unknown: it
// may take effect at any time after its invocation, or never.
const never = math.MaxInt64

type consKind uint8

const (
	kOpen     consKind = iota // resolves a name (and creates the file)
	kRead                     // a session's read of the whole file
	kWrite                    // a session's writes, stored (or delegated) by its close
	kEmpty                    // a session's O_TRUNC or ftruncate, which goes before its write
	kTruncate                 // truncate(2) by name, to 0
	kRename
)

// consIn is an operation's input.
type consIn struct {
	kind   consKind
	client int
	name   int    // open, truncate; rename's source
	to     int    // rename's target
	create bool   // open: O_WRONLY|O_CREATE|O_TRUNC
	fid    int64  // read, write: the file the session opened
	value  string // write
	// session ties a write to the kEmpty before it (0: none): with a
	// recall between them other sessions can come between, so each is an
	// operation of its own, but the write cannot go first.
	session int
	// Set by consPrepare from the history: invocation and response, the
	// earliest invocation of any operation that can come after this one
	// (older values can be forgotten), and the operation's index.
	call, ret, horizon int64
	id                 int
}

// consOut is an operation's result.
type consOut struct {
	unknown bool // failed with an unknown outcome
	// bounded: whatever happened, happened before the error returned. A
	// file that is gone (ESTALE) is refused any later store; after EIO or
	// a timeout in a restart, a request may still land later.
	bounded bool
	enoent  bool
	fid     int64  // open: the file opened
	data    string // read
	err     string // for the record
}

// ver is one value a name or a file had. until is the earliest response
// of the changes that superseded it (never while it is current): an
// operation invoked after that must not see it.
type ver[T comparable] struct {
	v     T
	until int64
}

// consState maps names to files (0: absent; negative: a file an unknown
// create may have made, whose id nobody saw yet) and files to contents,
// each with the values it had that may still be seen. A file no name can
// lead to any more is dead (nil): only sessions that have it open can
// reach it, and what they see of it is not checked.
type consState struct {
	names [len(consNames)][]ver[int64]
	files map[int64][]ver[string]
	// emptied are the sessions whose kEmpty happened and whose write has
	// not yet, in increasing order.
	emptied []int
}

func current[T comparable](vs []ver[T]) T { return vs[len(vs)-1].v }

// visible is what an operation invoked at call may see: the current value,
// and any value whose superseding changes had not all returned when the
// operation began (a callback break may still be on its way to its client).
func visible[T comparable](vs []ver[T], call int64) []T {
	out := []T{current(vs)}
	for _, x := range vs[:len(vs)-1] {
		if x.until >= call {
			out = append(out, x.v)
		}
	}
	return out
}

// push records a change to v that returned at ret.
func push[T comparable](vs []ver[T], v T, ret int64) []ver[T] {
	out := make([]ver[T], len(vs), len(vs)+1)
	for i, x := range vs {
		out[i] = ver[T]{x.v, min(x.until, ret)}
	}
	return append(out, ver[T]{v, never})
}

// forget drops the values no operation invoked from horizon on can see.
func forget[T comparable](vs []ver[T], horizon int64) []ver[T] {
	if !slices.ContainsFunc(vs[:len(vs)-1], func(x ver[T]) bool { return x.until < horizon }) {
		return vs
	}
	var out []ver[T]
	for i, x := range vs {
		if x.until >= horizon || i == len(vs)-1 {
			out = append(out, x)
		}
	}
	return out
}

// prune forgets what no later operation can see and marks dead the files
// no name can lead to. A state reached by different orders thus compares
// equal, which is what keeps the search small.
func (s consState) prune(horizon int64) consState {
	named := map[int64]bool{}
	for i := range s.names {
		s.names[i] = forget(s.names[i], horizon)
		for _, x := range s.names[i] {
			named[x.v] = true
		}
	}
	var files map[int64][]ver[string] // copied on the first change
	for f, vs := range s.files {
		if vs == nil {
			continue
		}
		ws := forget(vs, horizon)
		if !named[f] {
			ws = nil
		}
		if ws == nil || len(ws) != len(vs) {
			if files == nil {
				files = maps.Clone(s.files)
			}
			files[f] = ws
		}
	}
	if files != nil {
		s.files = files
	}
	return s
}

func (s consState) withFiles() consState {
	s.files = maps.Clone(s.files)
	return s
}

// bind replaces the placeholder p by the file id f it turned out to have.
func (s consState) bind(p, f int64) consState {
	for i, vs := range s.names {
		if slices.ContainsFunc(vs, func(x ver[int64]) bool { return x.v == p }) {
			nv := slices.Clone(vs)
			for j := range nv {
				if nv[j].v == p {
					nv[j].v = f
				}
			}
			s.names[i] = nv
		}
	}
	s = s.withFiles()
	s.files[f] = s.files[p]
	delete(s.files, p)
	return s
}

// consStep is the sequential specification: the states an operation can
// lead to (none: it cannot have happened as recorded). An operation acts
// on the state it is linearized in, except that it may see values that a
// change still under way when it began has superseded (visible).
func consStep(s consState, i consIn, o consOut) []consState {
	names := s.names[i.name]
	cur := current(names)
	vis := visible(names, i.call)
	switch i.kind {
	case kOpen:
		if o.unknown {
			t := s.withFiles()
			if cur != 0 {
				// Truncated, and stored by the release of the failed open.
				t.files[cur] = push(t.files[cur], "", i.ret)
			} else {
				p := -int64(i.id) - 1
				t.names[i.name] = push(names, p, i.ret)
				t.files[p] = []ver[string]{{"", never}}
			}
			return []consState{s, t}
		}
		if o.enoent {
			if slices.Contains(vis, 0) {
				return []consState{s}
			}
			return nil
		}
		if slices.Contains(vis, o.fid) {
			return []consState{s}
		}
		if _, known := s.files[o.fid]; known {
			return nil
		}
		var next []consState
		if i.create && cur == 0 {
			t := s.withFiles()
			t.names[i.name] = push(names, o.fid, i.ret)
			t.files[o.fid] = []ver[string]{{"", never}}
			next = append(next, t)
		}
		for _, p := range vis {
			if p < 0 {
				next = append(next, s.bind(p, o.fid))
			}
		}
		return next
	case kRead:
		vs, ok := s.files[i.fid]
		if ok && (vs == nil || slices.Contains(visible(vs, i.call), o.data) || truncatedUnder(visible(vs, i.call), o.data)) {
			return []consState{s}
		}
		return nil
	case kWrite:
		vs, ok := s.files[i.fid]
		switch {
		case !ok:
			return nil
		case vs == nil:
			return []consState{s}
		}
		if i.session != 0 {
			k, found := slices.BinarySearch(s.emptied, i.session)
			if !found {
				return nil // its kEmpty has not happened yet
			}
			s.emptied = slices.Delete(slices.Clone(s.emptied), k, k+1)
		}
		t := s.withFiles()
		if vs != nil {
			t.files[i.fid] = push(vs, i.value, i.ret)
		}
		if !o.unknown {
			return []consState{t}
		}
		return []consState{s, t}
	case kEmpty:
		vs, ok := s.files[i.fid]
		if !ok {
			return nil
		}
		k, _ := slices.BinarySearch(s.emptied, i.session)
		s.emptied = slices.Insert(slices.Clone(s.emptied), k, i.session)
		t := s.withFiles()
		if vs != nil {
			t.files[i.fid] = push(vs, "", i.ret)
		}
		if !o.unknown {
			return []consState{t}
		}
		return []consState{s, t}
	case kTruncate:
		if o.enoent {
			if slices.Contains(vis, 0) {
				return []consState{s}
			}
			return nil
		}
		var next []consState
		if o.unknown {
			next = append(next, s)
		}
		for _, f := range vis {
			if f != 0 {
				t := s.withFiles()
				t.files[f] = push(t.files[f], "", i.ret)
				next = append(next, t)
			}
		}
		return next
	case kRename:
		if o.enoent {
			// The server resolves the names; a kernel may answer from a
			// negative entry it has not yet been told is void.
			if cur == 0 || slices.Contains(vis, 0) {
				return []consState{s}
			}
			return nil
		}
		var next []consState
		if o.unknown {
			next = append(next, s)
		} else if to := current(s.names[i.to]); to != 0 && slices.Contains(vis, to) {
			// Both names lead to one file, as a kernel sees them while a
			// break for the source is on its way: rename(2) then does
			// nothing and succeeds, without asking the file system.
			next = append(next, s)
		}
		if cur != 0 {
			t := s
			t.names[i.to] = push(s.names[i.to], cur, i.ret)
			t.names[i.name] = push(names, 0, i.ret)
			next = append(next, t)
		}
		return next
	}
	panic("unknown operation")
}

// truncatedUnder reports a read that a truncation overtook through a
// kernel's page cache: the kernel asked for the length it knew, got less,
// and filled the rest with zeros (FUSE, as NFS, keeps the old size when
// the attributes changed during the read). Zeros the length of a visible
// value are legal when the empty file is visible too.
func truncatedUnder(vis []string, data string) bool {
	if data == "" || strings.Trim(data, "\x00") != "" || !slices.Contains(vis, "") {
		return false
	}
	return slices.ContainsFunc(vis, func(v string) bool { return len(v) == len(data) })
}

func consEqual(a, b consState) bool {
	if !slices.Equal(a.emptied, b.emptied) {
		return false
	}
	for i := range a.names {
		if !slices.Equal(a.names[i], b.names[i]) {
			return false
		}
	}
	if len(a.files) != len(b.files) {
		return false
	}
	for f, vs := range a.files {
		if ws, ok := b.files[f]; !ok || (vs == nil) != (ws == nil) || !slices.Equal(vs, ws) {
			return false
		}
	}
	return true
}

func consHash(s consState) uint64 {
	h := uint64(14695981039346656037)
	mix := func(x uint64) { h = (h ^ x) * 1099511628211 }
	for _, vs := range s.names {
		for _, x := range vs {
			mix(uint64(x.v))
			mix(uint64(x.until))
		}
	}
	var files uint64 // order-independent over the map
	for f, vs := range s.files {
		g := uint64(f) * 0x9e3779b97f4a7c15
		for _, x := range vs {
			for _, c := range []byte(x.v) {
				g = (g ^ uint64(c)) * 1099511628211
			}
			g = (g ^ uint64(x.until)) * 1099511628211
		}
		files += g
	}
	mix(files)
	for _, x := range s.emptied {
		mix(uint64(x))
	}
	return h
}

func fidName(f int64) string {
	switch {
	case f == 0:
		return "-"
	case f < 0:
		return fmt.Sprintf("#?%d", -f)
	}
	return fmt.Sprintf("#%d", f&(1<<40-1))
}

// consModel is the porcupine model. It is nondeterministic (an operation
// of unknown outcome may or may not have happened); porcupine tracks the
// set of states a history can have led to.
func consModel() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Init: func() []any {
			var s consState
			for i := range s.names {
				s.names[i] = []ver[int64]{{0, never}}
			}
			s.files = map[int64][]ver[string]{}
			return []any{s}
		},
		Step: func(state, input, output any) []any {
			s, i := state.(consState), input.(consIn)
			var out []any
			for _, t := range consStep(s, i, output.(consOut)) {
				if i.kind != kRead {
					t = t.prune(i.horizon)
				}
				out = append(out, t)
			}
			return out
		},
		Equal:             func(a, b any) bool { return consEqual(a.(consState), b.(consState)) },
		Hash:              func(s any) uint64 { return consHash(s.(consState)) },
		DescribeOperation: consDescribe,
		DescribeState: func(state any) string {
			s := state.(consState)
			var b strings.Builder
			for i, vs := range s.names {
				f := current(vs)
				fmt.Fprintf(&b, "%s=%s", consNames[i], fidName(f))
				if f != 0 {
					fmt.Fprintf(&b, ":%q", current(s.files[f]))
				}
				b.WriteString(" ")
			}
			return b.String()
		},
	}
	return m.ToModel()
}

func consDescribe(input, output any) string {
	i, o := input.(consIn), output.(consOut)
	var what string
	switch i.kind {
	case kOpen:
		what = "open " + consNames[i.name]
		if i.create {
			what += " O_CREAT|O_TRUNC"
		}
		if !o.unknown && !o.enoent {
			what += " → " + fidName(o.fid)
		}
	case kRead:
		what = fmt.Sprintf("read %s → %q", fidName(i.fid), o.data)
	case kWrite:
		what = fmt.Sprintf("write %s %q", fidName(i.fid), i.value)
	case kEmpty:
		what = fmt.Sprintf("empty %s", fidName(i.fid))
	case kTruncate:
		what = "truncate " + consNames[i.name]
	case kRename:
		what = "rename " + consNames[i.name] + " → " + consNames[i.to]
	}
	switch {
	case o.unknown:
		what += " ?unknown (" + o.err + ")"
	case o.enoent:
		what += " ENOENT"
	}
	return fmt.Sprintf("c%d %s", i.client, what)
}

// consPrepare completes the inputs from the history. The horizon of an
// operation is the earliest invocation among the operations that return
// after it began: only those can be linearized after it. Operations that
// never return are left out, which costs only an unknown truncate the
// chance of having hit a name's older file.
func consPrepare(ops []porcupine.Operation) {
	var finite []porcupine.Operation
	for _, op := range ops {
		if op.Return != never {
			finite = append(finite, op)
		}
	}
	slices.SortFunc(finite, func(a, b porcupine.Operation) int { return cmp.Compare(a.Return, b.Return) })
	low := make([]int64, len(finite)+1) // low[k]: earliest invocation in finite[k:]
	low[len(finite)] = never
	for k := len(finite) - 1; k >= 0; k-- {
		low[k] = min(low[k+1], finite[k].Call)
	}
	for k, op := range ops {
		i := op.Input.(consIn)
		i.call, i.ret, i.id = op.Call, op.Return, k
		j, _ := slices.BinarySearchFunc(finite, op.Call, func(x porcupine.Operation, t int64) int { return cmp.Compare(x.Return, t) })
		i.horizon = min(low[j], op.Call)
		ops[k].Input = i
	}
}

// consHistory records operations against one monotonic clock.
type consHistory struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	// slow lists the operations that took longer than consSlow, whatever
	// their outcome.
	slow []string
}

func (h *consHistory) now() int64 { return int64(time.Since(h.start)) }

// add records an operation; row separates a client's opens, reads and
// writes in the visualization, where they overlap.
func (h *consHistory) add(row int, i consIn, o consOut, call, ret int64) {
	took := time.Duration(ret - call)
	if o.unknown && !o.bounded {
		ret = never
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if took > consSlow {
		h.slow = append(h.slow, fmt.Sprintf("took %v: %s", took, consDescribe(i, o)))
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: 3*i.client + row, Input: i, Call: call, Output: o, Return: ret})
}

// consFS is a client as the workers see it: the library or a FUSE mount.
type consFS interface {
	// open returns the file's identity: its inode number on a mount.
	open(name string, flag int) (consFile, int64, error)
	rename(from, to string) error
	truncate(name string) error
}

type consFile interface {
	io.Reader
	io.WriterAt
	Truncate(size int64) error
	Close() error
}

type libFS struct {
	c   *pathfs.FS
	dir string
	via *serverProc // the server or proxy c talks to
}

func (l libFS) open(name string, flag int) (consFile, int64, error) {
	f, err := l.c.Open(l.dir+"/"+name, flag, 0o644)
	if err != nil {
		return nil, 0, err
	}
	fid := f.FID()
	return f, int64(fid.Volume<<40 | fid.Vnode&(1<<40-1)), nil // as the mount numbers inodes
}

func (l libFS) rename(from, to string) error {
	return l.c.Rename(l.dir+"/"+from, l.dir+"/"+to)
}

func (l libFS) truncate(name string) error { return l.c.Truncate(l.dir+"/"+name, 0) }

type osFS struct{ dir string }

func (m osFS) open(name string, flag int) (consFile, int64, error) {
	f, err := os.OpenFile(filepath.Join(m.dir, name), flag, 0o644)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, int64(fi.Sys().(*syscall.Stat_t).Ino), nil
}

func (m osFS) rename(from, to string) error {
	return os.Rename(filepath.Join(m.dir, from), filepath.Join(m.dir, to))
}

func (m osFS) truncate(name string) error { return os.Truncate(filepath.Join(m.dir, name), 0) }

// consWorker runs random sessions as one client.
type consWorker struct {
	id     int
	fs     consFS
	h      *consHistory
	rng    *rand.Rand
	seq    int
	failed int // operations that failed, dropped or recorded as unknown
}

// pause is a random short delay, so that sessions interleave.
func (w *consWorker) pause() {
	if w.rng.IntN(3) > 0 {
		time.Sleep(time.Duration(w.rng.IntN(5000)) * time.Microsecond)
	}
}

func (w *consWorker) name() int { return w.rng.IntN(len(consNames)) }

// value is unique and of one length, so a write at offset 0 replaces any
// content the file can have.
func (w *consWorker) value() string {
	w.seq++
	return fmt.Sprintf("c%d-%05d", w.id, w.seq)
}

func (w *consWorker) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		switch p := w.rng.IntN(100); {
		case p < 35:
			w.readSession(w.name())
		case p < 55:
			w.writeSession(os.O_WRONLY | os.O_CREATE | os.O_TRUNC)
		case p < 75:
			w.writeSession(os.O_RDWR)
		case p < 85:
			w.truncate()
		default:
			w.rename()
		}
		w.pause()
	}
}

// open records the open of a session and returns the file (or nil), its
// identity, and the open's invocation.
func (w *consWorker) open(name, flag int) (consFile, int64, int64) {
	create := flag&os.O_CREATE != 0
	in := consIn{kind: kOpen, client: w.id, name: name, create: create}
	call := w.h.now()
	f, fid, err := w.fs.open(consNames[name], flag)
	ret := w.h.now()
	switch {
	case err == nil:
		w.h.add(0, in, consOut{fid: fid}, call, ret)
	case create:
		// The file may have been created before the open failed (by
		// its truncation, say).
		w.h.add(0, in, w.unknown(err), call, ret)
	case errors.Is(err, syscall.ENOENT):
		w.h.add(0, in, consOut{enoent: true}, call, ret)
	default:
		w.failed++ // a failed open without O_CREATE changes nothing
	}
	return f, fid, call
}

func (w *consWorker) read(f consFile, fid, call int64) {
	data, err := io.ReadAll(f)
	ret := w.h.now()
	if err != nil {
		w.failed++ // a failed read says nothing
		return
	}
	w.h.add(1, consIn{kind: kRead, client: w.id, fid: fid}, consOut{data: string(data)}, call, ret)
}

func (w *consWorker) readSession(name int) {
	f, fid, call := w.open(name, os.O_RDONLY)
	if f == nil {
		return
	}
	w.pause()
	w.read(f, fid, call)
	f.Close()
}

func (w *consWorker) writeSession(flag int) {
	f, fid, call := w.open(w.name(), flag)
	if f == nil {
		return
	}
	// Emptying the file (O_TRUNC, ftruncate) and the write are two
	// changes: a recall between them stores the empty file, and other
	// clients' sessions can come between. Either lands by the close, the
	// emptying first.
	in := consIn{kind: kWrite, client: w.id, fid: fid, value: w.value()}
	empty := consIn{kind: kEmpty, client: w.id, fid: fid, session: w.id<<24 | w.seq}
	from := call
	emptied := flag&os.O_TRUNC != 0
	var err error
	if flag == os.O_RDWR {
		if w.rng.IntN(2) == 0 {
			w.read(f, fid, call)
		}
		if w.rng.IntN(3) == 0 {
			emptied, from = true, w.h.now()
			err = f.Truncate(0)
		}
	}
	w.pause()
	if _, werr := f.WriteAt([]byte(in.value), 0); err == nil {
		err = werr
	}
	w.pause()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	var out consOut
	if err != nil {
		out = w.unknown(err)
	}
	ret := w.h.now()
	if emptied {
		in.session = empty.session
		w.h.add(2, empty, out, from, ret)
	}
	w.h.add(2, in, out, from, ret)
}

func (w *consWorker) truncate() {
	in := consIn{kind: kTruncate, client: w.id, name: w.name()}
	call := w.h.now()
	err := w.fs.truncate(consNames[in.name])
	w.h.add(0, in, w.outcome(err), call, w.h.now())
}

func (w *consWorker) rename() {
	in := consIn{kind: kRename, client: w.id, name: w.name()}
	in.to = (in.name + 1 + w.rng.IntN(len(consNames)-1)) % len(consNames)
	call := w.h.now()
	err := w.fs.rename(consNames[in.name], consNames[in.to])
	w.h.add(0, in, w.outcome(err), call, w.h.now())
}

// outcome classifies a change's error: ENOENT is an answer, anything else
// leaves it unknown whether the change happened.
func (w *consWorker) outcome(err error) consOut {
	switch {
	case err == nil:
		return consOut{}
	case errors.Is(err, syscall.ENOENT):
		return consOut{enoent: true}
	}
	return w.unknown(err)
}

func (w *consWorker) unknown(err error) consOut {
	w.failed++
	return consOut{unknown: true, bounded: errors.Is(err, syscall.ESTALE), err: err.Error()}
}

// consRun runs the clients for about d (with restart, a kill -9 and
// restart of the server halfway), then has each client read every name
// once more, alone, and checks the history. It returns how many files the
// library clients made under directory delegations.
// consRun runs the clients' sessions for d, killing and restarting srv
// halfway if restart, and calling each of midway halfway too.
func consRun(t *testing.T, srv *serverProc, clients []consFS, d time.Duration, restart bool, midway ...func()) int64 {
	if restart {
		srv.prepare() // before the workers open files on FUSE mounts
	}
	h := &consHistory{start: time.Now()}
	workers := make([]*consWorker, len(clients))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, fs := range clients {
		workers[i] = &consWorker{id: i, fs: fs, h: h, rng: rand.New(rand.NewPCG(rand.Uint64(), uint64(i)))}
		wg.Go(func() { workers[i].run(stop) })
	}
	time.Sleep(d / 2)
	if restart {
		killed := h.now()
		srv.kill9()
		srv.restart()
		t.Logf("server killed at %v and back after %v", time.Duration(killed), time.Duration(h.now()-killed))
		time.Sleep(consGrace) // nothing changes before it ends
	}
	for _, m := range midway {
		m()
	}
	time.Sleep(d / 2)
	close(stop)
	wg.Wait()
	for _, w := range workers {
		for name := range consNames {
			w.readSession(name)
		}
	}
	consCheck(t, h.ops)
	// Nothing waits for a lease to run out when every client answers: an
	// operation that took that long waited for a recall nobody answered.
	for _, slow := range h.slow {
		t.Error(slow)
	}
	failed := 0
	for _, w := range workers {
		failed += w.failed
	}
	var made, settled int64
	for _, fs := range clients {
		if l, ok := fs.(libFS); ok {
			st := l.c.Client().Stats()
			made, settled = made+st.MadeHere, settled+st.Settled
		}
	}
	t.Logf("%d operations in %v, %d failed; the library clients made %d files under directory delegations, %d of them created at the server later",
		len(h.ops), time.Duration(h.now()), failed, made, settled)
	return made
}

// consCheck fails the test if the history is not close-to-open
// consistent.
func consCheck(t *testing.T, ops []porcupine.Operation) {
	t.Helper()
	consVerify(t, ops, t.Errorf, t.Errorf)
}

// consVerify checks ops and says so through undecided (the checker ran
// out of time) or illegal, with where the history is kept.
func consVerify(t *testing.T, ops []porcupine.Operation, undecided, illegal func(string, ...any)) porcupine.CheckResult {
	t.Helper()
	kinds := map[consKind]int{}
	unknown := 0
	for _, op := range ops {
		kinds[op.Input.(consIn).kind]++
		if op.Output.(consOut).unknown {
			unknown++
		}
	}
	t.Logf("history: %d opens, %d reads, %d write sessions, %d truncates, %d renames; %d of unknown outcome",
		kinds[kOpen], kinds[kRead], kinds[kWrite], kinds[kTruncate], kinds[kRename], unknown)
	consPrepare(ops)
	model := consModel()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, 30*time.Second)
	t.Logf("checked in %v: %s", time.Since(start).Round(time.Millisecond), res)
	if res == porcupine.Ok {
		return res
	}
	dir, err := os.MkdirTemp("", "hoard-consistency-")
	if err != nil {
		t.Fatal(err)
	}
	if err := porcupine.VisualizePath(model, info, filepath.Join(dir, "history.html")); err != nil {
		t.Error(err)
	}
	sorted := slices.Clone(ops)
	slices.SortStableFunc(sorted, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	last := -1
	if res == porcupine.Illegal {
		if last = consStuck(info, sorted); last >= 0 {
			op := sorted[last]
			t.Logf("the first operation the checker could not explain, at %.3fms: %s", float64(op.Call)/1e6, consDescribe(op.Input, op.Output))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "history.txt"), []byte(consText(sorted, last)), 0o644); err != nil {
		t.Error(err)
	}
	if res == porcupine.Unknown {
		undecided("the checker timed out; the history is in %s", dir)
	} else {
		illegal("the history is not close-to-open consistent: %s/history.html, %s/history.txt", dir, dir)
	}
	return res
}

// consStuck returns the index in sorted (by invocation) of the
// operation the checker could not place: of those left out of its longest
// partial linearization, the first to return. What went wrong is there or
// shortly before. (The shortest illegal prefix by invocation can instead
// name a legal read whose value a write invoked later explains.)
func consStuck(info porcupine.LinearizationInfo, sorted []porcupine.Operation) int {
	placed := map[int]bool{} // by consIn.id
	for _, part := range info.PartialLinearizationsOperations() {
		var longest []porcupine.Operation
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
		for _, op := range longest {
			placed[op.Input.(consIn).id] = true
		}
	}
	stuck := -1
	for i, op := range sorted {
		if !placed[op.Input.(consIn).id] && (stuck < 0 || op.Return < sorted[stuck].Return) {
			stuck = i
		}
	}
	return stuck
}

// consText lists a history sorted by invocation, one operation a line,
// marking the one at index mark.
func consText(sorted []porcupine.Operation, mark int) string {
	var b strings.Builder
	for k, op := range sorted {
		ret := "∞"
		if op.Return != never {
			ret = fmt.Sprintf("%.3fms", float64(op.Return)/1e6)
		}
		fmt.Fprintf(&b, "%.3fms %s %s\n", float64(op.Call)/1e6, ret, consDescribe(op.Input, op.Output))
		if k == mark {
			b.WriteString("^^^ the first operation the checker could not explain\n")
		}
	}
	return b.String()
}

// dialCons connects a library client with a cache of its own and a name
// of its own, as a client on another machine would be.
func dialCons(t *testing.T, srv *serverProc, name string, noDeleg bool) *pathfs.FS {
	return dialConsWith(t, srv, name, client.Options{NoDelegations: noDeleg})
}

// dialConsWith is dialCons with more options.
func dialConsWith(t *testing.T, srv *serverProc, name string, o client.Options) *pathfs.FS {
	t.Helper()
	// The client's log, at debug, is kept as records in a ring, and
	// shown if the test fails: a history the checker cannot explain then
	// comes with the breaks, recalls and grants each client saw. Records
	// are not formatted as they come, which would slow the clients
	// enough to hide races.
	recs := &recordLog{}
	log := slog.New(recordHandler{l: recs})
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("HOARD_TEST_DUMP") != "" {
			t.Logf("client %s log (its last %d records):\n%s", name, recordLogMax, recs)
		}
	})
	o.Server, o.CacheDir, o.CacheSize, o.Name = srv.addr, t.TempDir(), 64<<20, name
	o.DialTimeout, o.RPCTimeout, o.Logger = 5*time.Second, 10*time.Second, log
	c, err := cellDial(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Three library clients, with and without delegations, and with
// directory delegations granted whenever they can be (by default a
// client gets one only on a directory no other client has cached, which
// in this shared directory is seldom); and two clients of a proxy with one
// of the origin (with delegations), the origin killed and restarted under
// them.
func TestConsistencyLibrary(t *testing.T) {
	for _, mode := range []string{"delegations", "no-delegations", "dir-delegations", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			args := []string{"--grace", consGrace.String()}
			if mode == "dir-delegations" {
				args = append(args, "--dir-delegations", "any")
			}
			srv := startServer(t, t.TempDir(), args...)
			var clients []consFS
			for i := range 3 {
				to := srv
				if mode == "proxy" && i > 0 {
					if i == 1 {
						to = startProxy(t, srv, t.TempDir(), "--grace", consGrace.String())
					} else {
						to = clients[1].(libFS).via
					}
				}
				// Back off from a recalled directory for a moment only:
				// here, grants and recalls are what is tested.
				c := dialConsWith(t, to, fmt.Sprintf("%s-c%d", t.Name(), i),
					client.Options{NoDelegations: mode == "no-delegations", DirBackoff: time.Millisecond})
				clients = append(clients, libFS{c, "/d", to})
			}
			if err := clients[0].(libFS).c.Mkdir("/d", 0o755); err != nil {
				t.Fatal(err)
			}
			made := consRun(t, srv, clients, 4*time.Second, true)
			if mode == "dir-delegations" && made == 0 {
				t.Error("no file was made under a directory delegation")
			}
		})
	}
}

// Two FUSE mounts and a library client; the same with one of the mounts
// through a proxy, and with one served over io_uring.
func TestConsistencyFuse(t *testing.T) {
	needFuse(t)
	for _, mode := range []string{"direct", "proxy", "io_uring"} {
		t.Run(mode, func(t *testing.T) {
			var ring []string
			if mode == "io_uring" {
				needURing(t)
				ring = []string{"--io-uring"}
			}
			srv := startServer(t, t.TempDir(), "--grace", consGrace.String())
			lib := dialCons(t, srv, t.Name()+"-lib", false)
			if err := lib.Mkdir("/d", 0o755); err != nil {
				t.Fatal(err)
			}
			a := startMount(t, srv, t.TempDir(), append(mountDebug(), ring...)...)
			to := srv
			if mode == "proxy" {
				to = startProxy(t, srv, t.TempDir(), "--grace", consGrace.String())
			}
			b := startMount(t, to, t.TempDir(), mountDebug()...)
			consRun(t, srv, []consFS{osFS{a.path("d")}, osFS{b.path("d")}, libFS{lib, "/d", srv}}, 4*time.Second, true)
		})
	}
}

// The checker itself: histories made by hand, and whether close-to-open
// explains each.
func TestConsistencyModel(t *testing.T) {
	const ms = int64(time.Millisecond)
	type op struct {
		in        consIn
		out       consOut
		call, ret int64
	}
	open := func(c, name int, create bool, fid int64, call, ret int64) op {
		return op{consIn{kind: kOpen, client: c, name: name, create: create}, consOut{fid: fid, enoent: fid == 0}, call, ret}
	}
	write := func(c int, fid int64, v string, call, ret int64) op {
		return op{consIn{kind: kWrite, client: c, fid: fid, value: v}, consOut{}, call, ret}
	}
	// emptied is an emptying session's pair: the emptying, then the write.
	emptied := func(c int, fid int64, v string, call, ret int64) []op {
		e := op{consIn{kind: kEmpty, client: c, fid: fid, session: c + 1}, consOut{}, call, ret}
		w := write(c, fid, v, call, ret)
		w.in.session = c + 1
		return []op{e, w}
	}
	read := func(c int, fid int64, data string, call, ret int64) op {
		return op{consIn{kind: kRead, client: c, fid: fid}, consOut{data: data}, call, ret}
	}
	rename := func(c, from, to int, call, ret int64) op {
		return op{consIn{kind: kRename, client: c, name: from, to: to}, consOut{}, call, ret}
	}
	unknown := func(o op) op {
		o.out.unknown = true
		o.ret = never
		return o
	}
	// c0 creates f0 (file 7) and writes "A" in [0, 3] ms; c1 opens it
	// with O_TRUNC and writes "B" in [4, 6].
	base := slices.Concat([]op{open(0, 0, true, 7, 0, 1*ms), write(0, 7, "A", 0, 3*ms), open(1, 0, true, 7, 4*ms, 5*ms)},
		emptied(1, 7, "B", 4*ms, 6*ms))
	with := func(ops ...op) []op { return append(slices.Clone(base), ops...) }
	cases := []struct {
		name string
		ops  []op
		ok   bool
	}{
		{"reads after each close", with(open(2, 0, false, 7, 3*ms+1, 4*ms), read(2, 7, "A", 3*ms+1, 4*ms),
			open(2, 0, false, 7, 7*ms, 8*ms), read(2, 7, "B", 7*ms, 8*ms)), true},
		{"a read during a session sees the old value", with(open(2, 0, false, 7, 4*ms, 5*ms), read(2, 7, "A", 4*ms, 5*ms)), true},
		// What a recall that does not wait for the holder's store looks
		// like.
		{"a read returns a value older than a completed close", with(open(2, 0, false, 7, 7*ms, 8*ms), read(2, 7, "A", 7*ms, 8*ms)), false},
		{"a read returns a value never written", with(open(2, 0, false, 7, 7*ms, 8*ms), read(2, 7, "C", 7*ms, 8*ms)), false},
		{"a read sees a value before its session began", with(open(2, 0, false, 7, 1*ms, 2*ms), read(2, 7, "B", 1*ms, 3*ms)), false},
		{"an open after a completed create finds nothing", with(open(2, 0, false, 0, 7*ms, 8*ms)), false},
		// Two readers disagree in real-time order while c1's session is
		// under way: the second has not yet taken the break.
		{"new, then old during a session", with(open(2, 0, false, 7, 4*ms, 5*ms), read(2, 7, "B", 4*ms, 5*ms),
			read(0, 7, "A", 5*ms+1, 5*ms+2)), true},
		// A holder's file recalled between its O_TRUNC and its write.
		{"the empty file during a truncating session", with(open(2, 0, false, 7, 4*ms, 5*ms), read(2, 7, "", 4*ms, 5*ms)), true},
		{"the empty file after a truncating session", with(open(2, 0, false, 7, 7*ms, 8*ms), read(2, 7, "", 7*ms, 8*ms)), false},
		// c1's session is recalled after its O_TRUNC: c2's whole session
		// comes between, then c1's write lands.
		{"a session recalled between its O_TRUNC and its write", slices.Concat([]op{open(0, 0, true, 7, 0, 1*ms), write(0, 7, "A", 0, 2*ms),
			open(1, 0, true, 7, 3*ms, 4*ms), read(2, 7, "", 4*ms+1, 4*ms+2), open(2, 0, true, 7, 5*ms, 6*ms)},
			emptied(2, 7, "C", 5*ms, 8*ms), emptied(1, 7, "D", 3*ms, 9*ms),
			[]op{open(0, 0, false, 7, 10*ms, 11*ms), read(0, 7, "D", 10*ms, 11*ms)}), true},
		{"both sessions done, the file empty", slices.Concat([]op{open(0, 0, true, 7, 0, 1*ms), write(0, 7, "A", 0, 2*ms),
			open(1, 0, true, 7, 3*ms, 4*ms), open(2, 0, true, 7, 5*ms, 6*ms)},
			emptied(2, 7, "C", 5*ms, 8*ms), emptied(1, 7, "D", 3*ms, 9*ms),
			[]op{open(0, 0, false, 7, 10*ms, 11*ms), read(0, 7, "", 10*ms, 11*ms)}), false},
		{"an emptying session's write before its emptying", slices.Concat([]op{open(0, 0, true, 7, 0, 1*ms), write(0, 7, "A", 0, 2*ms),
			open(1, 0, true, 7, 3*ms, 4*ms)}, emptied(1, 7, "D", 3*ms, 9*ms),
			[]op{open(0, 0, false, 7, 10*ms, 11*ms), read(0, 7, "", 10*ms, 11*ms)}), false},
		// A kernel's short read under a truncation that overlaps it.
		{"zeros of the old length during a truncate", with(open(2, 0, false, 7, 7*ms, 8*ms), read(2, 7, "\x00", 7*ms, 10*ms),
			op{consIn{kind: kTruncate, client: 0, name: 0}, consOut{}, 8 * ms, 9 * ms}), true},
		{"zeros without a truncate", with(open(2, 0, false, 7, 7*ms, 8*ms), read(2, 7, "\x00", 7*ms, 10*ms)), false},
		{"zeros of another length during a truncate", with(open(2, 0, false, 7, 7*ms, 8*ms), read(2, 7, "\x00\x00", 7*ms, 10*ms),
			op{consIn{kind: kTruncate, client: 0, name: 0}, consOut{}, 8 * ms, 9 * ms}), false},
		// c1's session writes into file 7 after c2 renamed it from f0
		// to f1: the data follows the file.
		{"a session across a rename of its file", []op{open(0, 0, true, 7, 0, 1*ms), write(0, 7, "A", 0, 2*ms),
			open(1, 0, false, 7, 3*ms, 4*ms), rename(2, 0, 1, 5*ms, 6*ms), open(2, 1, false, 7, 7*ms, 8*ms), read(2, 7, "A", 7*ms, 8*ms),
			write(1, 7, "B", 3*ms, 9*ms), open(2, 1, false, 7, 10*ms, 11*ms), read(2, 7, "B", 10*ms, 11*ms)}, true},
		// c0 still sees f0 as file 7 when c2's rename moved it to f1.
		{"a rename over the same file, seen stale", []op{open(0, 0, true, 7, 0, 1*ms), write(0, 7, "A", 0, 2*ms),
			rename(2, 0, 1, 3*ms, 6*ms), rename(0, 0, 1, 4*ms, 7*ms)}, true},
		{"a rename over the same file, after the break", []op{open(0, 0, true, 7, 0, 1*ms), write(0, 7, "A", 0, 2*ms),
			rename(2, 0, 1, 3*ms, 4*ms), rename(0, 0, 1, 5*ms, 7*ms)}, false},
		{"a rename's effect is lost", []op{open(0, 0, true, 7, 0, 1*ms), write(0, 7, "A", 0, 2*ms), rename(2, 0, 1, 3*ms, 4*ms),
			open(1, 0, false, 7, 5*ms, 6*ms)}, false},
		// A write of unknown outcome may show up at any time later, or
		// never.
		{"an unknown write seen later", with(unknown(write(2, 7, "C", 7*ms, 8*ms)), open(1, 0, false, 7, 20*ms, 21*ms), read(1, 7, "C", 20*ms, 21*ms)), true},
		{"an unknown write not seen", with(unknown(write(2, 7, "C", 7*ms, 8*ms)), open(1, 0, false, 7, 20*ms, 21*ms), read(1, 7, "B", 20*ms, 21*ms)), true},
		// It leaves the value it superseded visible until a change that
		// completed supersedes both.
		{"an unknown write, then a completed one, then the first", with(unknown(write(2, 7, "C", 7*ms, 8*ms)), write(0, 7, "D", 10*ms, 12*ms),
			open(1, 0, false, 7, 20*ms, 21*ms), read(1, 7, "B", 20*ms, 21*ms)), false},
	}
	for _, c := range cases {
		var ops []porcupine.Operation
		for _, o := range c.ops {
			ops = append(ops, porcupine.Operation{ClientId: o.in.client, Input: o.in, Call: o.call, Output: o.out, Return: o.ret})
		}
		consPrepare(ops)
		if got := porcupine.CheckOperations(consModel(), ops); got != c.ok {
			t.Errorf("%s: judged consistent: %v, want %v", c.name, got, c.ok)
		}
	}
}

// The operation named when a history cannot be explained is the stale
// read, not an earlier legal read of a value written by a session invoked
// after it.
func TestConsistencyStuck(t *testing.T) {
	const ms = int64(time.Millisecond)
	mk := func(in consIn, out consOut, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: in.client, Input: in, Output: out, Call: call, Return: ret}
	}
	ops := []porcupine.Operation{
		mk(consIn{kind: kOpen, client: 0, name: 0, create: true}, consOut{fid: 7}, 0, 1*ms),
		mk(consIn{kind: kWrite, client: 0, fid: 7, value: "A"}, consOut{}, 0, 3*ms),
		// c2's read, invoked before c1's session, sees its "B": legal.
		mk(consIn{kind: kOpen, client: 2, name: 0}, consOut{fid: 7}, 3*ms+ms/2, 5*ms),
		mk(consIn{kind: kRead, client: 2, fid: 7}, consOut{data: "B"}, 3*ms+ms/2, 5*ms),
		mk(consIn{kind: kOpen, client: 1, name: 0, create: true}, consOut{fid: 7}, 4*ms, 5*ms),
		mk(consIn{kind: kEmpty, client: 1, fid: 7, session: 2}, consOut{}, 4*ms, 6*ms),
		mk(consIn{kind: kWrite, client: 1, fid: 7, value: "B", session: 2}, consOut{}, 4*ms, 6*ms),
		// c0 reads "A" after c1's close: the fault.
		mk(consIn{kind: kOpen, client: 0, name: 0}, consOut{fid: 7}, 7*ms, 8*ms),
		mk(consIn{kind: kRead, client: 0, fid: 7}, consOut{data: "A"}, 7*ms, 8*ms),
	}
	consPrepare(ops)
	res, info := porcupine.CheckOperationsVerbose(consModel(), ops, 10*time.Second)
	if res != porcupine.Illegal {
		t.Fatalf("judged %v, want illegal", res)
	}
	sorted := slices.Clone(ops)
	slices.SortStableFunc(sorted, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	i := consStuck(info, sorted)
	if i < 0 || sorted[i].Call != 7*ms || sorted[i].Input.(consIn).kind != kRead {
		t.Fatalf("named %d, want c0's read at 7 ms", i)
	}
}

// recordLog keeps the last recordLogMax of a client's log records as
// they came, formatting them only when asked (String).
type recordLog struct {
	mu   sync.Mutex
	recs []slog.Record // a ring, once full
	next int
	full bool
}

const recordLogMax = 1 << 14

func (l *recordLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	h := slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})
	order := l.recs
	if l.full {
		order = append(slices.Clone(l.recs[l.next:]), l.recs[:l.next]...)
	}
	for _, r := range order {
		h.Handle(context.Background(), r)
	}
	return b.String()
}

// recordHandler is a slog.Handler into a recordLog, at every level.
type recordHandler struct {
	l     *recordLog
	attrs []slog.Attr
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.l.mu.Lock()
	if len(h.l.recs) < recordLogMax {
		h.l.recs = append(h.l.recs, r)
	} else {
		h.l.recs[h.l.next] = r
		h.l.next, h.l.full = (h.l.next+1)%recordLogMax, true
	}
	h.l.mu.Unlock()
	return nil
}

func (h recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recordHandler{h.l, append(slices.Clone(h.attrs), as...)}
}

func (h recordHandler) WithGroup(string) slog.Handler { return h }
