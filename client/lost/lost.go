// Package lost keeps writes a client could not deliver to its server,
// where the user finds them (`hoard cache lost`): never dropped silently.
package lost

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	pb "github.com/hoardfs/hoard/hoardpb"
)

// Record describes local writes that could not be delivered to the server.
// Their bytes are kept in Data, a sparse file holding each range at its
// offset.
type Record struct {
	Path     string     `json:"path"`
	FID      string     `json:"fid"`
	Ranges   [][2]int64 `json:"ranges"`
	Size     int64      `json:"size"`
	Truncate *uint64    `json:"truncate,omitempty"`
	Error    string     `json:"error"`
	Time     time.Time  `json:"time"`
	Data     string     `json:"data"`
	// Sealed: Data is encrypted with the key of the encrypted cache of the
	// client that kept it (hoard mount --cache-encrypt), which only that
	// process held: nothing is written in clear beside an encrypted cache.
	Sealed bool `json:"sealed,omitempty"`
	// ID names the record in its lost directory (List, Get, Remove).
	ID string `json:"-"`
}

// Dir is where undeliverable writes are kept: lost/ in the cache
// directory, or in the system's temporary directory for a memory cache.
func Dir(cacheDir string) string {
	if cacheDir == "" {
		return filepath.Join(os.TempDir(), "hoard-lost-"+strconv.Itoa(os.Getuid()))
	}
	return filepath.Join(cacheDir, "lost")
}

// Sealer wraps the data file Save writes, named name, so that its bytes
// on disk are encrypted (sealed) or not (cache.Cache.Seal).
type Sealer func(f *os.File, name string) (w io.WriterAt, sealed bool, err error)

// Save writes r's ranges (read through read) into a sparse data file in a
// directory of its own under the lost directory of cacheDir, through seal
// if not nil, with an info.json describing them, and returns that
// directory. It fills in r's Time, Data and Sealed.
func Save(cacheDir string, r Record, read func(p []byte, off int64) error, seal Sealer) (string, error) {
	r.Time = time.Now()
	dir := filepath.Join(Dir(cacheDir), fmt.Sprintf("%d-%s", r.Time.UnixNano(), r.FID))
	r.Data = filepath.Join(dir, "data")
	rec, ranges := r, r.Ranges
	err := func() error {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		data, err := os.OpenFile(rec.Data, os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		defer data.Close()
		var w io.WriterAt = data
		if seal != nil {
			if w, rec.Sealed, err = seal(data, filepath.Base(dir)); err != nil {
				return err
			}
		}
		if _, err := CopyRanges(ranges, read, func(p []byte, off int64) error {
			_, err := w.WriteAt(p, off)
			return err
		}); err != nil {
			return err
		}
		if err := data.Sync(); err != nil {
			return err
		}
		js, _ := json.MarshalIndent(rec, "", "  ")
		return os.WriteFile(filepath.Join(dir, "info.json"), js, 0o600)
	}()
	if err != nil {
		return "", err
	}
	return dir, nil
}

// CopyRanges copies the byte ranges (offset, length) through read and
// write a MiB at a time, as Save keeps writes and a restore stores them
// again, and returns the bytes copied.
func CopyRanges(ranges [][2]int64, read, write func(p []byte, off int64) error) (int64, error) {
	var n int64
	buf := make([]byte, 1<<20)
	for _, r := range ranges {
		for off := r[0]; off < r[0]+r[1]; {
			p := buf[:min(int64(len(buf)), r[0]+r[1]-off)]
			if err := read(p, off); err != nil {
				return n, err
			}
			if err := write(p, off); err != nil {
				return n, err
			}
			off += int64(len(p))
			n += int64(len(p))
		}
	}
	return n, nil
}

// Error is what the application hears of writes that could not be
// stored: Path's writes failed with Cause, and are kept in Kept (empty:
// they stay in the cache).
type Error struct {
	Path, Kept string
	Cause      error
}

func (e *Error) Error() string {
	if e.Kept == "" {
		return fmt.Sprintf("could not store %s (%v); the data stays in the cache", e.Path, e.Cause)
	}
	return fmt.Sprintf("could not store %s (%v); the data is kept in %s (hoard cache lost)", e.Path, e.Cause, e.Kept)
}

// Unwrap gives the application an errno: the server's own answer when it
// refused the data for a reason the application can act on, EIO otherwise.
func (e *Error) Unwrap() error {
	switch errno := pb.Errno(e.Cause); errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EROFS, syscall.EACCES, syscall.EPERM, syscall.ESTALE:
		return errno
	}
	return syscall.EIO
}

// List reads the lost directory of cacheDir, oldest first.
func List(cacheDir string) ([]Record, error) {
	dir := Dir(cacheDir)
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "info.json"))
		if err != nil {
			continue
		}
		var l Record
		if json.Unmarshal(b, &l) == nil {
			l.ID = e.Name()
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, nil
}

// Get reads the record id of cacheDir's lost directory.
func Get(cacheDir, id string) (Record, error) {
	if err := checkID(id); err != nil {
		return Record{}, err
	}
	b, err := os.ReadFile(filepath.Join(Dir(cacheDir), id, "info.json"))
	if os.IsNotExist(err) {
		return Record{}, fmt.Errorf("no lost writes %q in %s (hoard cache lost lists them)", id, Dir(cacheDir))
	}
	if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("lost writes %s: %v", id, err)
	}
	r.ID = id
	return r, nil
}

// Remove discards the record id, with its data.
func Remove(cacheDir, id string) error {
	if _, err := Get(cacheDir, id); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(Dir(cacheDir), id))
}

// checkID refuses an id that is not one name in the lost directory.
func checkID(id string) error {
	if id == "" || id == "." || id == ".." || filepath.Base(id) != id {
		return fmt.Errorf("lost writes %q: not an id hoard cache lost lists", id)
	}
	return nil
}
