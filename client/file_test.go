package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/testkit"
	"github.com/hoardfs/hoard/internal/testkit/servertest"
	"github.com/hoardfs/hoard/node"
)

// Dial fails, naming the address, when nothing answers there, and when
// no address is given at all.
func TestDialFailures(t *testing.T) {
	if _, err := client.Dial(client.Options{}); err == nil {
		t.Fatal("Dial without a server address succeeded")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	testkit.Must(t, err)
	addr := l.Addr().String()
	l.Close()
	start := time.Now()
	_, err = client.Dial(client.Options{Server: addr, DialTimeout: 300 * time.Millisecond, Logger: servertest.Logger()})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial of a closed port: %v, want an error naming %s", err, addr)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Dial of a closed port took %v", took)
	}
}

// Open's flags behave as os.OpenFile's: O_EXCL, O_APPEND, O_TRUNC, and the
// read-only and write-only modes; Seek, Read, Write, ReadAt, WriteAt,
// Stat and Close of a File.
func TestOpenFlagsAndFile(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t)
	b := s.Dial(t, servertest.MemCache())

	f, err := a.Open("/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
	testkit.Must(t, err)
	if f.Name() != "/f" || f.FID().IsZero() {
		t.Fatalf("name %q, fid %v", f.Name(), f.FID())
	}
	if _, err := a.Open("/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("O_EXCL on an existing file: %v", err)
	}
	if n, err := f.Write([]byte("hello world")); n != 11 || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	if _, err := f.WriteAt([]byte("W"), 6); err != nil {
		t.Fatal(err)
	}
	if pos, err := f.Seek(-5, io.SeekEnd); pos != 6 || err != nil {
		t.Fatalf("seek from the end: %d %v", pos, err)
	}
	rest, err := io.ReadAll(f)
	if string(rest) != "World" || err != nil {
		t.Fatalf("read after seek: %q %v", rest, err)
	}
	if pos, _ := f.Seek(-2, io.SeekCurrent); pos != 9 {
		t.Fatalf("seek from the current offset: %d", pos)
	}
	if _, err := f.Seek(-100, io.SeekStart); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("seek before the start: %v", err)
	}
	if _, err := f.Seek(0, 42); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("seek with a bad whence: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 1), -1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("read at a negative offset: %v", err)
	}
	if _, err := f.WriteAt([]byte("x"), -1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("write at a negative offset: %v", err)
	}
	if n, err := f.WriteAt(nil, 3); n != 0 || err != nil {
		t.Fatalf("empty write: %d %v", n, err)
	}
	p := make([]byte, 20)
	if n, err := f.ReadAt(p, 6); n != 5 || err != io.EOF {
		t.Fatalf("read across the end: %d %v", n, err)
	}
	if st, err := f.Stat(); err != nil || st.Size != 11 || st.Mode&0o777 != 0o640 || st.Type != node.TypeFile {
		t.Fatalf("stat of an open file: %+v %v", st, err)
	}
	if d := f.Policy(); d.Bypass || f.Bypassed() || d.String() == "" {
		t.Fatalf("a small file's policy: %v, bypassed %v", d, f.Bypassed())
	}
	testkit.Must(t, f.Close())
	if err := f.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if _, err := f.ReadAt(p, 0); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if _, err := f.Write(p); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if err := f.Truncate(0); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("truncate after close: %v", err)
	}
	if err := f.Sync(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("sync after close: %v", err)
	}
	if err := f.Flush(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("flush after close: %v", err)
	}
	if _, err := f.Stat(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("stat after close: %v", err)
	}
	testkit.WantFile(t, b, "/f", []byte("hello World"))

	// O_APPEND writes at the end; WriteAt is refused on such a file.
	g, err := a.Open("/f", os.O_WRONLY|os.O_APPEND, 0)
	testkit.Must(t, err)
	if _, err := g.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAt([]byte("?"), 0); err == nil {
		t.Fatal("WriteAt on an O_APPEND file succeeded")
	}
	if _, err := g.ReadAt(p, 0); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("read on a write-only file: %v", err)
	}
	testkit.Must(t, g.Close())
	testkit.WantFile(t, b, "/f", []byte("hello World!"))

	// A read-only file cannot be written, truncated; its Sync and Flush
	// have nothing to do.
	ro, err := a.Open("/f", os.O_RDONLY, 0)
	testkit.Must(t, err)
	if _, err := ro.Write([]byte("x")); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("write on a read-only file: %v", err)
	}
	if err := ro.Truncate(1); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("truncate of a read-only file: %v", err)
	}
	testkit.Must(t, ro.Sync())
	testkit.Must(t, ro.Flush())
	testkit.Must(t, ro.Close())

	// O_TRUNC empties the file; Create does too.
	h, err := a.Open("/f", os.O_WRONLY|os.O_TRUNC, 0)
	testkit.Must(t, err)
	testkit.Must(t, h.Close())
	if st, err := b.Stat("/f"); err != nil || st.Size != 0 {
		t.Fatalf("after O_TRUNC: %+v %v", st, err)
	}
	testkit.WriteFile(t, a, "/f", []byte("again"))
	testkit.WriteFile(t, a, "/f", []byte("x"))
	testkit.WantFile(t, b, "/f", []byte("x"))

	// O_CREATE without O_EXCL on an existing file opens it as it is.
	h, err = a.Open("/f", os.O_RDWR|os.O_CREATE, 0o600)
	testkit.Must(t, err)
	if st, _ := h.Stat(); st.Size != 1 {
		t.Fatalf("O_CREATE of an existing file: size %d", st.Size)
	}
	testkit.Must(t, h.Close())
}

// Truncate, Allocate and Sync of an open file, and the zeros a write past
// the end leaves.
func TestFileTruncateAllocate(t *testing.T) {
	s := servertest.Start(t)
	a := s.Dial(t)
	b := s.Dial(t, servertest.MemCache())
	h := testkit.Create(t, a, "/t", []byte("hello world"))
	testkit.Must(t, h.Truncate(5))
	_, err := h.WriteAt([]byte("XY"), 8)
	testkit.Must(t, err)
	if err := h.Truncate(-1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("negative truncate: %v", err)
	}
	if err := h.Allocate(0, 0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("allocate of nothing: %v", err)
	}
	testkit.Must(t, h.Allocate(0, 4)) // inside: nothing to do
	if st, _ := h.Stat(); st.Size != 10 {
		t.Fatalf("size after allocate inside: %d", st.Size)
	}
	testkit.Must(t, h.Allocate(10, 6))
	if st, _ := h.Stat(); st.Size != 16 {
		t.Fatalf("size after allocate past the end: %d", st.Size)
	}
	testkit.Must(t, h.Sync())
	testkit.WantFile(t, b, "/t", []byte("hello\x00\x00\x00XY\x00\x00\x00\x00\x00\x00"))
	testkit.Must(t, h.Close())

	// Truncate by name: longer, then shorter.
	testkit.Must(t, a.Truncate("/t", 20))
	if st, _ := b.Stat("/t"); st.Size != 20 {
		t.Fatalf("after truncate to 20: size %d", st.Size)
	}
	testkit.Must(t, a.Truncate("/t", 2))
	testkit.WantFile(t, b, "/t", []byte("he"))
	testkit.WantErrno(t, "negative truncate by name", a.Truncate("/t", -1), syscall.EINVAL)
	testkit.WantErrno(t, "truncate of a missing file", a.Truncate("/none", 1), syscall.ENOENT)
}

// A read of a file larger than a chunk, in pieces of odd sizes, returns
// exactly what was written; a sequential reader gets the chunks after
// the ones it read fetched ahead.
func TestLargeFileAndReadAhead(t *testing.T) {
	s := servertest.Start(t)
	data := testkit.Pattern(3<<20+12345, 7)
	s.Seed(t, "/big", data)
	r := s.Dial(t)
	f := openFile(t, r, "/big", os.O_RDONLY)
	p := make([]byte, 64<<10)
	var got []byte
	for range 8 { // two 256 KiB chunks, sequentially
		n, err := f.Read(p)
		testkit.Must(t, err)
		got = append(got, p[:n]...)
	}
	read := int64(len(got))
	waitFor(t, 10*time.Second, func() bool { return r.Client().Stats().BytesFetched > read+256<<10 }, func() string {
		return "no read-ahead after a sequential read"
	})
	rest, err := io.ReadAll(f)
	testkit.Must(t, err)
	got = append(got, rest...)
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, want %d, equal %v", len(got), len(data), bytes.Equal(got, data))
	}
	// Random reads fetch only what they read.
	c := s.Dial(t, servertest.MemCache())
	g := openFile(t, c, "/big", os.O_RDONLY)
	for _, off := range []int64{3 << 20, 1 << 20, 2<<20 + 7, 512 << 10} {
		n, err := g.ReadAt(p[:100], off)
		if n != 100 || err != nil || !bytes.Equal(p[:100], data[off:off+100]) {
			t.Fatalf("random read at %d: %d %v", off, n, err)
		}
	}
	// Three whole chunks and the short last one.
	if got, want := c.Client().Stats().BytesFetched, int64(3*256<<10+len(data)-3<<20); got != want {
		t.Fatalf("random reads fetched %d bytes, want the %d of the 4 chunks read", got, want)
	}
}

// Concurrent readers of one file share its fetches and each reads the
// right bytes; concurrent writers of different files in one directory
// through two clients lose nothing.
func TestConcurrentAccess(t *testing.T) {
	s := servertest.Start(t)
	data := testkit.Pattern(4<<20, 11)
	w := s.Seed(t, "/shared", data)
	r := s.Dial(t)
	f := openFile(t, r, "/shared", os.O_RDONLY)
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			p := make([]byte, 100_000)
			for i := range 20 {
				off := int64((g*7919 + i*104729) % (len(data) - len(p)))
				n, err := f.ReadAt(p, off)
				if err != nil || n != len(p) || !bytes.Equal(p, data[off:off+int64(n)]) {
					errs <- fmt.Errorf("reader %d: at %d: %d bytes, %v", g, off, n, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		testkit.Must(t, <-errs)
	}
	if got := r.Client().Stats().BytesFetched; got > int64(len(data)) {
		t.Fatalf("fetched %d bytes of a %d-byte file", got, len(data))
	}

	testkit.Must(t, w.Mkdir("/cd", 0o755))
	clients := []*pathfs.FS{w, r}
	for g := range 4 {
		go func() {
			c := clients[g%2]
			for i := range 10 {
				name := fmt.Sprintf("/cd/g%d-%d", g, i)
				h, err := c.Create(name)
				if err == nil {
					_, err = h.Write([]byte(name))
				}
				if err == nil {
					err = h.Close()
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %v", name, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		testkit.Must(t, <-errs)
	}
	for _, c := range clients {
		ents, err := c.ReadDir("/cd")
		if err != nil || len(ents) != 40 {
			t.Fatalf("listing after concurrent creates: %d entries, %v", len(ents), err)
		}
	}
	for g := range 4 {
		name := fmt.Sprintf("/cd/g%d-9", g)
		testkit.WantFile(t, clients[(g+1)%2], name, []byte(name))
	}
}

// A program that reads a directory's files in the order of its listing
// gets the next small files fetched ahead of its opens.
func TestDirectoryReadAhead(t *testing.T) {
	s := servertest.Start(t)
	w := s.Dial(t, servertest.MemCache())
	testkit.Must(t, w.Mkdir("/tree", 0o755))
	const n, size = 20, 10 << 10
	for i := range n {
		testkit.WriteFile(t, w, fmt.Sprintf("/tree/f%02d", i), testkit.Pattern(size, byte(i)))
	}
	r := s.Dial(t)
	ents, err := r.ReadDir("/tree")
	testkit.Must(t, err)
	for _, e := range ents { // statuses known, as a kernel's lookups make them
		_, err := r.Stat("/tree/" + e.Name)
		testkit.Must(t, err)
	}
	if got := r.Client().Stats().BytesFetched; got != 0 {
		t.Fatalf("fetched %d bytes before reading", got)
	}
	for i, e := range ents[:3] {
		testkit.WantFile(t, r, "/tree/"+e.Name, testkit.Pattern(size, byte(i)))
	}
	waitFor(t, 5*time.Second, func() bool { return r.Client().Stats().BytesFetched > 3*size }, func() string {
		return fmt.Sprintf("fetched %d bytes reading 3 files of %d in order: no read-ahead", r.Client().Stats().BytesFetched, size)
	})
	for i, e := range ents[3:] {
		testkit.WantFile(t, r, "/tree/"+e.Name, testkit.Pattern(size, byte(3+i)))
	}
	if got := r.Client().Stats().BytesFetched; got != n*size {
		t.Fatalf("fetched %d bytes for %d files of %d: read-ahead fetched twice", got, n, size)
	}
}
