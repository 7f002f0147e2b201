package chunkindex

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hoardfs/hoard/internal/poll"
)

// store is a Source for tests: records changed with set and del.
type store struct {
	mu      sync.Mutex
	changed map[string][]byte
	stats   testStats
}

type testStats struct {
	Puts    int       `json:"puts"`
	Indexed time.Time `json:"indexed"`
}

func (s *store) set(k, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = map[string][]byte{}
	}
	s.changed[k] = []byte(v)
	s.stats.Puts++
}

func (s *store) del(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = map[string][]byte{}
	}
	s.changed[k] = nil
}

func (s *store) source(x *Index) Source {
	return Source{
		Changes: func() map[string][]byte {
			s.mu.Lock()
			defer s.mu.Unlock()
			c := s.changed
			s.changed = nil
			return c
		},
		Stats: func() any {
			s.mu.Lock()
			defer s.mu.Unlock()
			st := s.stats
			st.Indexed = x.Indexed()
			return st
		},
	}
}

func start(t *testing.T, dir string, every time.Duration) (*Index, *store) {
	t.Helper()
	x, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &store{}
	if err := x.Start(s.source(x), every); err != nil {
		t.Fatal(err)
	}
	return x, s
}

func records(t *testing.T, x *Index) map[string]string {
	t.Helper()
	got := map[string]string{}
	if err := x.Load(func(k, v []byte) error { got[string(k)] = string(v); return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

// Records committed are there at the next open, with the counters and
// the settings; Drop removes a record as it is loaded.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	x, s := start(t, dir, time.Hour)
	if v, err := x.Setting("size", []byte("10")); err != nil || string(v) != "10" {
		t.Fatalf("first setting: %q %v", v, err)
	}
	s.set("a", "1")
	s.set("b", "2")
	s.set("c", "3")
	if err := x.Commit(); err != nil {
		t.Fatal(err)
	}
	s.del("b")
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}

	x, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Abandon()
	if !x.Clean() {
		t.Fatal("not clean after Close")
	}
	if v, _ := x.Setting("size", []byte("20")); string(v) != "10" {
		t.Fatalf("setting %q, want the first one kept", v)
	}
	var st testStats
	if !x.LoadStats(&st) || st.Puts != 3 {
		t.Fatalf("counters %+v", st)
	}
	err = x.Load(func(k, v []byte) error {
		if string(k) == "c" {
			return Drop
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := records(t, x); !maps.Equal(got, map[string]string{"a": "1"}) {
		t.Fatalf("records %v", got)
	}
	if err := x.Load(func(k, v []byte) error { return errors.New("bad record") }); err == nil {
		t.Fatal("a Load callback's error was not returned")
	}
}

// In use, the index is not clean: a crash (Abandon) leaves it so, and
// keeps what was committed. The proxy's store wrote its clean mark as the
// digit 1: still clean.
func TestCleanMark(t *testing.T) {
	dir := t.TempDir()
	x, s := start(t, dir, time.Hour)
	s.set("a", "1")
	x.Commit()
	s.set("b", "2") // not committed
	x.Abandon()
	x, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if x.Clean() {
		t.Fatal("clean after a crash")
	}
	if got := records(t, x); !maps.Equal(got, map[string]string{"a": "1"}) {
		t.Fatalf("records after a crash %v", got)
	}
	x.Abandon()

	db, err := bolt.Open(filepath.Join(dir, "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bktMeta).Put(keyClean, []byte("1")) })
	db.Close()
	x, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Abandon()
	if !x.Clean() {
		t.Fatal("the proxy store's clean mark is not read as clean")
	}
}

// An index file that is not one opens empty and unclean; a second
// process is kept out.
func TestUnreadableAndLocked(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "index.db"), []byte("not a database"), 0o600)
	x, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Abandon()
	if x.Clean() || len(records(t, x)) != 0 {
		t.Fatal("an unreadable index did not open empty and unclean")
	}
	if _, err := Open(dir); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a second open: %v", err)
	}
}

// A commit that fails keeps its records for the next, where later
// changes of the same records win.
func TestFailedCommitRetried(t *testing.T) {
	x, s := start(t, t.TempDir(), time.Hour)
	defer x.Abandon()
	s.set("a", "1")
	s.set("", "bolt refuses an empty key")
	if err := x.Commit(); err == nil {
		t.Fatal("a commit of an empty key succeeded")
	}
	s.del("")
	if err := x.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := records(t, x); !maps.Equal(got, map[string]string{"a": "1"}) {
		t.Fatalf("records %v", got)
	}
}

// The committer writes on its own; Indexed says up to when, in the
// counters another process reads from stats.json.
func TestCommitterAndIndexed(t *testing.T) {
	dir := t.TempDir()
	x, s := start(t, dir, 10*time.Millisecond)
	if !x.Indexed().IsZero() {
		t.Fatal("indexed before any commit")
	}
	s.set("a", "1")
	changed := time.Now()
	var st testStats
	if !poll.Until(10*time.Second, func() bool { return ReadStats(dir, &st) == nil && st.Indexed.After(changed) }) {
		t.Fatalf("stats.json does not say the change is indexed: %+v", st)
	}
	x.Abandon()
	x, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Abandon()
	if got := records(t, x); got["a"] != "1" {
		t.Fatalf("indexed, but not in the index: %v", got)
	}
}

func TestChecksum(t *testing.T) {
	// CRC32C's check value.
	if c := Checksum([]byte("123456789")); c != 0xe3069283 {
		t.Fatalf("checksum %08x", c)
	}
}
