// Package testkit holds what the tests of client, client/pathfs and the
// integration tests share: test data, checks, whole-file helpers on a
// pathfs.FS, and a TCP relay that can hold, cut or corrupt a
// connection. Package servertest adds a server in the test's process.
package testkit

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"testing"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
)

// Pattern is n pseudo-random bytes, different for each seed and the same
// on every call with it.
func Pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// Create creates (or truncates) name through c and writes data to it,
// failing the test on any error, and returns the file still open.
func Create(t testing.TB, c *pathfs.FS, name string, data []byte) *client.File {
	t.Helper()
	f, err := c.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	return f
}

// WriteFile creates (or truncates) name through c, writes data to it and
// closes it, failing the test on any error.
func WriteFile(t testing.TB, c *pathfs.FS, name string, data []byte) {
	t.Helper()
	if err := Create(t, c, name, data).Close(); err != nil {
		t.Fatal(err)
	}
}

// TryRead reads the whole of name through c.
func TryRead(c *pathfs.FS, name string) ([]byte, error) {
	f, err := c.Open(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// ReadFile reads the whole of name through c, failing the test on error.
func ReadFile(t testing.TB, c *pathfs.FS, name string) []byte {
	t.Helper()
	b, err := TryRead(c, name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// WantFile fails unless name reads as want through c.
func WantFile(t testing.TB, c *pathfs.FS, name string, want []byte) {
	t.Helper()
	got := ReadFile(t, c, name)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: read %d bytes %s, want %d bytes %s", name, len(got), short(got), len(want), short(want))
	}
}

// short quotes b, or its start when it is long.
func short(b []byte) string {
	if len(b) > 32 {
		return fmt.Sprintf("%q...", b[:32])
	}
	return fmt.Sprintf("%q", b)
}

// Names lists dir through c, sorted, failing the test on error.
func Names(t testing.TB, c *pathfs.FS, dir string) []string {
	t.Helper()
	ents, err := c.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name)
	}
	slices.Sort(got)
	return got
}
