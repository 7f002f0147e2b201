package bypass

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/datapath"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/node"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const cs = 1 << 10 // chunk size of the tests

// fake is a server holding one file, with stages as the real one keeps
// them: a stage's stores are applied together when one publishes it.
type fake struct {
	mu      sync.Mutex
	data    []byte
	dv      uint64
	session string
	stages  map[string][]datapath.StoreArgs
	bodies  map[string][][]byte
	stores  []datapath.StoreArgs
	fetches []int64
	// eagain refuses this many stores with EAGAIN first; failStore fails
	// every store; onStore runs before each store is applied.
	eagain    int
	failStore error
	onStore   func(datapath.StoreArgs)
	kept      [][2]int64
	keptData  []byte
	pending   map[*Open]bool
	missed    int
	unchanged bool
}

func newFake(data []byte) *fake {
	return &fake{data: data, dv: 1, session: "s1", stages: map[string][]datapath.StoreArgs{}, bodies: map[string][][]byte{}, pending: map[*Open]bool{}}
}

func (f *fake) Status() (node.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return node.Status{Type: node.TypeFile, Size: uint64(len(f.data)), DataVersion: f.dv}, nil
}

func (f *fake) FetchChunk(idx int64) ([]byte, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fetches = append(f.fetches, idx)
	if idx*cs >= int64(len(f.data)) {
		return nil, f.dv, nil
	}
	return bytes.Clone(f.data[idx*cs : min(int64(len(f.data)), (idx+1)*cs)]), f.dv, nil
}

func (f *fake) Store(args datapath.StoreArgs) error {
	if f.onStore != nil {
		f.onStore(args)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stores = append(f.stores, args)
	if f.eagain > 0 {
		f.eagain--
		return pb.Err(syscall.EAGAIN) // too many stages
	}
	if f.failStore != nil {
		return f.failStore
	}
	var body []byte
	for _, r := range args.Ranges {
		p := make([]byte, r.Len)
		args.Read(p, r.Off)
		body = append(body, p...)
	}
	if args.Stage != "" {
		f.stages[args.Stage] = append(f.stages[args.Stage], args)
		f.bodies[args.Stage] = append(f.bodies[args.Stage], body)
		if !args.Publish {
			return nil
		}
		for i, a := range f.stages[args.Stage] {
			f.apply(a, f.bodies[args.Stage][i])
		}
		delete(f.stages, args.Stage)
		delete(f.bodies, args.Stage)
	} else {
		f.apply(args, body)
	}
	f.dv++
	return nil
}

func (f *fake) apply(a datapath.StoreArgs, body []byte) {
	if a.HasTruncate && int64(a.Truncate) < int64(len(f.data)) {
		f.data = f.data[:a.Truncate]
	}
	for _, r := range a.Ranges {
		if end := r.Off + r.Len; end > int64(len(f.data)) {
			f.data = append(f.data, make([]byte, end-int64(len(f.data)))...)
		}
		copy(f.data[r.Off:], body[:r.Len])
		body = body[r.Len:]
	}
	if a.HasSize {
		f.data = append(f.data, make([]byte, max(0, int64(a.Size)-int64(len(f.data))))...)[:a.Size]
	}
}

func (f *fake) Session() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.session
}

func (f *fake) AwaitSession(time.Time) string { return f.Session() }

func (f *fake) KeepLost(ranges [][2]int64, read func(p []byte, off int64) error, size int64, trunc *uint64, cause error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range ranges {
		p := make([]byte, r[1])
		read(p, r[0])
		f.kept = append(f.kept, r)
		f.keptData = append(f.keptData, p...)
	}
	return errors.New("kept in lost/")
}

func (f *fake) Unpublished(o *Open, pending bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[o] = pending
}

func (f *fake) Missed() {
	f.mu.Lock()
	f.missed++
	f.mu.Unlock()
}

func open(f *fake, probation bool) *Open {
	return New(f, Config{Name: "/f", FID: node.FID{Volume: 1, Vnode: 2, Unique: 3}, ChunkSize: cs, Probation: probation,
		Timeout: time.Second, Log: slog.New(slog.DiscardHandler)})
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

func TestReadSequentialAndEOF(t *testing.T) {
	data := pattern(10*cs+100, 1)
	f := newFake(data)
	o := open(f, false)
	var got []byte
	p := make([]byte, 700)
	for off := int64(0); ; {
		n, admit, err := o.ReadAt(p, off)
		if admit {
			t.Fatal("a sequential read ended the probation of an open not on probation")
		}
		got = append(got, p[:n]...)
		off += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, not the file's %d", len(got), len(data))
	}
	if n, _, err := o.ReadAt(p, int64(len(data))); n != 0 || err != io.EOF {
		t.Fatalf("read at the end: %d, %v", n, err)
	}
	if f.missed == 0 {
		t.Fatal("reads past the cache not counted")
	}
}

// A random read of an open on probation ends it: the caller reads through
// the cache instead.
func TestProbationEndsAtRandomRead(t *testing.T) {
	o := open(newFake(pattern(8*cs, 2)), true)
	p := make([]byte, 100)
	if _, admit, err := o.ReadAt(p, 0); admit || err != nil {
		t.Fatalf("first read: admit %v, %v", admit, err)
	}
	if _, admit, _ := o.ReadAt(p, 100); admit {
		t.Fatal("a sequential read admitted the file")
	}
	if _, admit, _ := o.ReadAt(p, 5*cs); !admit {
		t.Fatal("a random read did not end the probation")
	}
}

// Buffered chunks of a version another client replaced are not served:
// the read is served again from the new version, never mixing them.
func TestReadNeverMixesVersions(t *testing.T) {
	f := newFake(pattern(4*cs, 3))
	o := open(f, false)
	p := make([]byte, cs)
	if _, _, err := o.ReadAt(p, 0); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 5*time.Second, "read-ahead", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.fetches) >= 3 // chunk 0, and 1 and 2 ahead
	})
	f.mu.Lock()
	f.data, f.dv = pattern(4*cs, 9), f.dv+1
	f.mu.Unlock()
	n, _, err := o.ReadAt(p, cs)
	if err != nil || n != cs {
		t.Fatalf("read: %d, %v", n, err)
	}
	if !bytes.Equal(p, pattern(4*cs, 9)[cs:2*cs]) {
		t.Fatal("a read served bytes of the version a change replaced")
	}
}

// Writes of an open are one stage: nothing is visible at the server until
// Publish, then all of it, with the truncation of an O_TRUNC open first.
func TestWritesPublishedAtOnce(t *testing.T) {
	old := pattern(3*writeRun, 4)
	f := newFake(bytes.Clone(old))
	o := open(f, false)
	if err := o.Truncate(0); err != nil {
		t.Fatal(err)
	}
	want := pattern(2*writeRun+123, 5)
	for off := 0; off < len(want); off += 1 << 16 {
		if _, err := o.WriteAt(want[off:min(len(want), off+1<<16)], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if !f.pending[o] {
		t.Fatal("writes not said to be pending publication")
	}
	st, err := o.Status()
	if err != nil || st.Size != uint64(len(want)) {
		t.Fatalf("status before publication: size %d (%v), want the open's %d", st.Size, err, len(want))
	}
	f.mu.Lock()
	seen := bytes.Equal(f.data, old)
	f.mu.Unlock()
	if !seen {
		t.Fatal("the server's file changed before the publication")
	}
	if err := o.Publish(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f.data, want) {
		t.Fatalf("after publication the server holds %d bytes, not the %d written", len(f.data), len(want))
	}
	if f.pending[o] {
		t.Fatal("still pending after publication")
	}
	stage := f.stores[0].Stage
	if stage == "" || !f.stores[0].HasTruncate || f.stores[0].Truncate != 0 {
		t.Fatalf("first store %+v: want the stage's truncation", f.stores[0])
	}
	for i, s := range f.stores {
		if s.Stage != stage || s.Publish != (i == len(f.stores)-1) {
			t.Fatalf("store %d: stage %q publish %v", i, s.Stage, s.Publish)
		}
	}
	if !f.stores[len(f.stores)-1].Sync {
		t.Fatal("the publication is not synced")
	}
}

// A stage lives as long as its session: writes whose session ended are
// not published, the application gets EIO, and the server keeps the file
// as it was.
func TestStageLostWithItsSession(t *testing.T) {
	old := pattern(cs, 6)
	f := newFake(bytes.Clone(old))
	o := open(f, false)
	f.onStore = func(datapath.StoreArgs) {
		f.mu.Lock()
		f.session = "s2" // the server restarted under the first run
		f.mu.Unlock()
	}
	if _, err := o.WriteAt(pattern(writeRun, 7), 0); err != nil {
		t.Fatal(err)
	}
	o.WriteAt([]byte("x"), writeRun) // sends the full run
	err := o.Publish()
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("publish after the session ended: %v, want EIO", err)
	}
	if !bytes.Equal(f.data, old) || len(f.kept) != 0 {
		t.Fatalf("the file changed (%v) or a copy was kept (%v)", !bytes.Equal(f.data, old), f.kept)
	}
	if _, err := o.WriteAt([]byte("y"), 0); err == nil {
		t.Fatal("a write after the loss was accepted")
	}
}

// Writes that went in one store without a stage, and failed, are kept
// (lost/), as the cached path keeps undeliverable data.
func TestUnstagedFailureKeepsWrites(t *testing.T) {
	f := newFake(nil)
	f.failStore = status.Error(codes.Unavailable, "down")
	o := open(f, false)
	o.WriteAt([]byte("hello"), 10)
	if err := o.Publish(); err == nil || err.Error() != "kept in lost/" {
		t.Fatalf("publish: %v, want the keeper's error", err)
	}
	if len(f.kept) != 1 || f.kept[0] != [2]int64{10, 5} || string(f.keptData) != "hello" {
		t.Fatalf("kept %v %q", f.kept, f.keptData)
	}
}

// Too many stages at the server (EAGAIN): the store is tried again.
func TestStoreRetriedWhileServerFull(t *testing.T) {
	f := newFake(nil)
	f.eagain = 2
	o := open(f, false)
	o.WriteAt([]byte("abc"), 0)
	if err := o.Publish(); err != nil {
		t.Fatal(err)
	}
	if string(f.data) != "abc" || len(f.stores) != 3 {
		t.Fatalf("data %q after %d stores", f.data, len(f.stores))
	}
	for _, s := range f.stores {
		if s.Op != f.stores[0].Op || s.Op == "" {
			t.Fatal("a store tried again under another op id: the server could apply it twice")
		}
	}
}
