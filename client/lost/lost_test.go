package lost

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"

	pb "github.com/hoardfs/hoard/hoardpb"
)

// What Save keeps, List finds, with the bytes at their offsets.
func TestSaveAndList(t *testing.T) {
	cache := t.TempDir()
	if got, err := List(cache); err != nil || len(got) != 0 {
		t.Fatalf("an empty cache lists %v, %v", got, err)
	}
	data := bytes.Repeat([]byte("x"), 3<<20)
	read := func(p []byte, off int64) error { copy(p, data[off:]); return nil }
	cut := uint64(7)
	for i, path := range []string{"/a", "/b"} {
		_, err := Save(cache, Record{Path: path, FID: "1.2.3", Ranges: [][2]int64{{int64(i) * 10, 2 << 20}}, Size: 3 << 20, Truncate: &cut, Error: "server gone"}, read, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := List(cache)
	if err != nil || len(got) != 2 || got[0].Path != "/a" || got[1].Path != "/b" {
		t.Fatalf("listed %+v, %v: want /a then /b", got, err)
	}
	b, err := os.ReadFile(got[1].Data)
	if err != nil || len(b) != 10+2<<20 || !bytes.Equal(b[10:], data[10:10+2<<20]) || b[0] != 0 {
		t.Fatalf("kept data of %d bytes does not hold the range at its offset: %v", len(b), err)
	}
	if *got[0].Truncate != 7 || got[0].Error != "server gone" || got[0].Time.IsZero() {
		t.Fatalf("record %+v", got[0])
	}
}

// The application hears the server's own answer when it can act on it,
// EIO otherwise.
func TestErrorErrno(t *testing.T) {
	for cause, want := range map[error]syscall.Errno{
		pb.Err(syscall.ENOSPC):    syscall.ENOSPC,
		pb.Err(syscall.EDQUOT):    syscall.EDQUOT,
		errors.New("unreachable"): syscall.EIO,
	} {
		if err := (&Error{Path: "/f", Cause: cause, Kept: "/k"}); !errors.Is(err, want) {
			t.Errorf("%v: %v is not %v", cause, err, want)
		}
	}
}
