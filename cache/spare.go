package cache

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// spareCount is how many empty cache files are kept made ahead of need.
const spareCount = 64

// spares keeps empty files ready to become cache files. Creating a file
// can cost the kernel far more than renaming one (docs/architecture.md has
// this project's numbers), and a file's first fetch or write should not
// wait for that; OpenAFS's afsd makes its cache files ahead for the same
// reason. A goroutine replaces each spare taken; spares left at
// a stop are used at the next start.
type spares struct {
	dir   string
	ready chan string
	next  atomic.Uint64
	kick  chan struct{}
}

func newSpares(cacheDir string) (*spares, error) {
	s := &spares{dir: filepath.Join(cacheDir, "spare"), ready: make(chan string, spareCount), kick: make(chan struct{}, 1)}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("cache directory %s: %w", cacheDir, errors.Unwrap(err))
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("cache directory %s: %w", cacheDir, errors.Unwrap(err))
	}
	for _, e := range ents {
		p := filepath.Join(s.dir, e.Name())
		if info, err := e.Info(); err != nil || !info.Mode().IsRegular() || info.Size() != 0 || len(s.ready) == spareCount {
			os.Remove(p)
			continue
		}
		s.ready <- p
	}
	s.next.Store(uint64(time.Now().UnixNano()))
	return s, nil
}

// run makes spares until stop is closed.
func (s *spares) run(stop <-chan struct{}) {
	for {
		for len(s.ready) < spareCount {
			select {
			case <-stop:
				return
			default:
			}
			p := filepath.Join(s.dir, fmt.Sprint(s.next.Add(1)))
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				slog.Warn("cache: cannot make a spare file", "err", err)
				break // the next take tries again
			}
			f.Close()
			s.ready <- p
		}
		select {
		case <-stop:
			return
		case <-s.kick:
		}
	}
}

// create makes the empty cache file p from a spare if one is ready, and
// opens it.
func (s *spares) create(p string) (*os.File, error) {
	select {
	case sp := <-s.ready:
		select {
		case s.kick <- struct{}{}:
		default:
		}
		if inDir(p, func() error { return rename(sp, p) }) == nil {
			return os.OpenFile(p, os.O_RDWR, 0o600)
		}
		os.Remove(sp)
	default:
	}
	var f *os.File
	err := inDir(p, func() (err error) {
		f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		return err
	})
	return f, err
}

// inDir runs do, and again after creating p's directory if do found
// it missing.
func inDir(p string, do func() error) error {
	err := do()
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
			err = do()
		}
	}
	return err
}

// rename moves a spare to p, never over an existing file.
func rename(sp, p string) error {
	err := unix.Renameat2(unix.AT_FDCWD, sp, unix.AT_FDCWD, p, unix.RENAME_NOREPLACE)
	if err != nil {
		return &os.LinkError{Op: "rename", Old: sp, New: p, Err: err}
	}
	return nil
}
