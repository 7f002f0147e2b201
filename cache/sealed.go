package cache

import (
	"crypto/aes"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"golang.org/x/crypto/xts"

	"github.com/hoardfs/hoard/node"
)

// Encrypted cache files (Options.Key). What is on the cache's disk is
// XTS-AES-256 in 4 KiB sectors, as disk encryption does it, with a key
// per cached file derived from the cache's key and the file's FID
// (HKDF-SHA256): a stolen disk gives up which files were cached and how
// large they are, not their bytes. The cache's key lives in the mount's
// memory only, so a cache opened with a key starts empty: what a previous
// process cached cannot be read again.
//
// A sector of zeros on disk is a hole (never written, or punched), and
// reads as zeros: a real sector encrypts to all zeros with probability
// 2^-32768.

const sector = 4096

// cacheFile is what an entry reads and writes its bytes through: the
// cache file itself, or a sealedFile over it.
type cacheFile interface {
	io.ReaderAt
	io.WriterAt
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
	Fd() uintptr
	Close() error
}

// sealer makes the ciphers of an encrypted cache's files.
type sealer struct{ key []byte }

// KeySize is the length of Options.Key.
const KeySize = 32

func newSealer(key []byte) (*sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("cache key of %d bytes, want %d", len(key), KeySize)
	}
	return &sealer{key: key}, nil
}

// seal wraps f, the cache file of fid.
func (s *sealer) seal(f *os.File, fid node.FID) (*sealedFile, error) {
	info := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte("hoard cache file "), fid.Volume), fid.Vnode), fid.Unique)
	return s.sealAs(f, string(info))
}

// sealAs wraps f with the key the cache's key derives for info: each
// file sealed gets its own.
func (s *sealer) sealAs(f *os.File, info string) (*sealedFile, error) {
	k, err := hkdf.Key(sha256.New, s.key, nil, info, 64)
	if err != nil {
		return nil, err
	}
	x, err := xts.NewCipher(aes.NewCipher, k)
	if err != nil {
		return nil, err
	}
	return &sealedFile{File: f, x: x}, nil
}

// Sealed is what Cache.Seal wraps a file in: its bytes are encrypted on
// disk, by the cache's key.
type Sealed interface {
	io.ReaderAt
	io.WriterAt
}

// Encrypted reports whether the cache's files are encrypted.
func (c *Cache) Encrypted() bool { return c.sealer != nil }

// Seal wraps f, a file the client keeps beside its cache (a write it
// could not deliver, kept in lost/), so that its bytes on disk are
// encrypted as the cache files are, with a key of its own derived for
// name; sealed is false, and f returned as it is, when the cache is not
// encrypted. Only this process, which holds the cache's key, can read
// them back.
func (c *Cache) Seal(f *os.File, name string) (w Sealed, sealed bool, err error) {
	if c.sealer == nil {
		return f, false, nil
	}
	sf, err := c.sealer.sealAs(f, "hoard kept file "+name)
	if err != nil {
		return nil, false, err
	}
	return sf, true, nil
}

// sealedFile is a cache file whose sectors are encrypted. Its length on
// disk is always whole sectors; bytes past the file's size in its last
// sector are zeros.
type sealedFile struct {
	*os.File
	x *xts.Cipher
}

// span is the sectors covering [off, off+n).
func span(off, n int64) (start, end int64) {
	return off &^ (sector - 1), (off + n + sector - 1) &^ (sector - 1)
}

// sectors reads and decrypts [start, end), sector-aligned; what lies past
// the end of the file reads as zeros, and have is how much did not.
func (s *sealedFile) sectors(start, end int64) (buf []byte, have int64, err error) {
	buf = make([]byte, end-start)
	n, err := s.File.ReadAt(buf, start)
	if err != nil && err != io.EOF {
		return nil, 0, err
	}
	for i := 0; i < n; i += sector {
		sec := buf[i:min(i+sector, len(buf))]
		if !isZero(sec) {
			s.x.Decrypt(sec, sec, uint64(start/sector)+uint64(i/sector))
		}
	}
	return buf, int64(n), nil
}

// ReadAt reads p at off as os.File does: short, with io.EOF, at the end.
func (s *sealedFile) ReadAt(p []byte, off int64) (int, error) {
	start, end := span(off, int64(len(p)))
	buf, have, err := s.sectors(start, end)
	if err != nil {
		return 0, err
	}
	n := copy(p, buf[off-start:])
	if avail := have - (off - start); avail < int64(n) {
		return int(max(0, avail)), io.EOF
	}
	return n, nil
}

// WriteAt writes p at off: the sectors it covers are read, changed and
// written whole.
func (s *sealedFile) WriteAt(p []byte, off int64) (int, error) {
	start, end := span(off, int64(len(p)))
	buf, _, err := s.sectors(start, end)
	if err != nil {
		return 0, err
	}
	copy(buf[off-start:], p)
	if err := s.put(buf, start); err != nil {
		return 0, err
	}
	return len(p), nil
}

// put encrypts buf, whole sectors from start, and writes it.
func (s *sealedFile) put(buf []byte, start int64) error {
	for i := 0; i < len(buf); i += sector {
		s.x.Encrypt(buf[i:i+sector], buf[i:i+sector], uint64(start/sector)+uint64(i/sector))
	}
	_, err := s.File.WriteAt(buf, start)
	return err
}

// Truncate cuts or extends the file to size; the rest of its last sector
// is zeroed, so that growing it again reads zeros there.
func (s *sealedFile) Truncate(size int64) error {
	if tail := size % sector; tail != 0 {
		start := size - tail
		buf, have, err := s.sectors(start, start+sector)
		if err != nil {
			return err
		}
		if have > 0 {
			clear(buf[tail:])
			if err := s.put(buf, start); err != nil {
				return err
			}
		}
	}
	_, end := span(0, size)
	return s.File.Truncate(end)
}
