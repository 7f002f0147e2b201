package integration

import (
	"bytes"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hoardfs/hoard/internal/testkit"
)

// needPassthrough skips when the mount reads cached files through the
// page cache (no kernel support, or not root): there is nothing to test.
func needPassthrough(t *testing.T, m *mountProc) {
	t.Helper()
	if !strings.Contains(m.logs.String(), "cached reads by FUSE passthrough") {
		t.Skipf("SKIP: passthrough unavailable here: %s", m.logs)
	}
}

// cachedFile writes a file of data through m and reads it back whole, so
// that it is wholly cached: the next read-only open is passthrough.
func cachedFile(t *testing.T, m *mountProc, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(m.path(name), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got, err := os.ReadFile(m.path(name)); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read back %s: %d bytes, %v", name, len(got), err)
		}
	}
}

// alignedBlock is a 4 KiB buffer aligned for O_DIRECT.
func alignedBlock(t *testing.T, fill byte) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	for i := range b {
		b[i] = fill
	}
	return b
}

// An open never fails because another open of the inode is passthrough
// (the kernel keeps one backing file per inode): not an O_DIRECT writer
// after this mount stored a new version through that backing file (as
// fsstress's truncate and dwrite do), and not a writer after another
// client made a new version, which must see that version while the
// passthrough reader keeps the bytes it opened.
func TestFusePassthroughOpenNotRefused(t *testing.T) {
	needFuse(t)
	srv := startServer(t, t.TempDir())
	m := startMount(t, srv, t.TempDir())
	needPassthrough(t, m)

	t.Run("own version", func(t *testing.T) {
		data := testkit.Pattern(1<<20, 5)
		cachedFile(t, m, "own", data)
		r, err := os.Open(m.path("own"))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		// A truncation by name while the passthrough reader is open is
		// stored at once: a new version, in the same cache file.
		if err := os.Truncate(m.path("own"), 512<<10); err != nil {
			t.Fatal(err)
		}
		w, err := os.OpenFile(m.path("own"), os.O_RDWR|syscall.O_DIRECT, 0)
		if err != nil {
			t.Fatalf("O_DIRECT open for writing beside a passthrough reader: %v", err)
		}
		block := alignedBlock(t, 'w')
		if _, err := w.WriteAt(block, 4096); err != nil {
			t.Fatalf("O_DIRECT write: %v", err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		want := append([]byte(nil), data[:512<<10]...)
		copy(want[4096:], block)
		if got, err := os.ReadFile(m.path("own")); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("after the O_DIRECT write: %d bytes (want %d), equal %v, %v", len(got), len(want), bytes.Equal(got, want), err)
		}
	})

	t.Run("another client's version", func(t *testing.T) {
		other := startMount(t, srv, t.TempDir())
		old, fresh := testkit.Pattern(1<<20, 6), testkit.Pattern(1<<20, 7)
		cachedFile(t, m, "theirs", old)
		r, err := os.Open(m.path("theirs"))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		head := make([]byte, 4096)
		if _, err := r.ReadAt(head, 0); err != nil {
			t.Fatal(err)
		}
		// The other client's store breaks this mount's promise before it
		// returns; its version goes to a new cache file here.
		if err := os.WriteFile(other.path("theirs"), fresh, 0o644); err != nil {
			t.Fatal(err)
		}
		w, err := os.OpenFile(m.path("theirs"), os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("open for writing beside a passthrough reader of an older version: %v", err)
		}
		got, err := io.ReadAll(w)
		if err != nil || !bytes.Equal(got, fresh) {
			t.Fatalf("the writer reads %d bytes, equal to the new version %v, old %v: %v", len(got), bytes.Equal(got, fresh), bytes.Equal(got, old), err)
		}
		if _, err := w.WriteAt([]byte("mine"), 0); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		want := append([]byte("mine"), fresh[4:]...)
		rd, err := os.OpenFile(m.path("theirs"), os.O_RDONLY|syscall.O_DIRECT, 0)
		if err != nil {
			t.Fatalf("O_DIRECT open for reading: %v", err)
		}
		got, err = io.ReadAll(rd)
		rd.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("a new reader gets %d bytes, the current version %v: %v", len(got), bytes.Equal(got, want), err)
		}
		if got, err := os.ReadFile(other.path("theirs")); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("the other client reads %d bytes, the stored version %v: %v", len(got), bytes.Equal(got, want), err)
		}
		// The first reader keeps what it opened (AFS semantics).
		again := make([]byte, 4096)
		if _, err := r.ReadAt(again, 0); err != nil || !bytes.Equal(again, old[:4096]) {
			t.Fatalf("the passthrough reader's bytes changed under it: %v", err)
		}
	})
}
