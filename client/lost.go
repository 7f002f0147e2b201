package client

import (
	"encoding/json"
	"fmt"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// Lost describes local writes that could not be delivered to the server.
// Their bytes are kept in Data, a sparse file holding each range at its
// offset.
type Lost struct {
	Path     string     `json:"path"`
	FID      string     `json:"fid"`
	Ranges   [][2]int64 `json:"ranges"`
	Size     int64      `json:"size"`
	Truncate *uint64    `json:"truncate,omitempty"`
	Error    string     `json:"error"`
	Time     time.Time  `json:"time"`
	Data     string     `json:"data"`
}

// LostDir is where undeliverable writes are kept: lost/ in the cache
// directory, or in the system's temporary directory for a memory cache.
func LostDir(cacheDir string) string {
	if cacheDir == "" {
		return filepath.Join(os.TempDir(), "hoard-lost-"+strconv.Itoa(os.Getuid()))
	}
	return filepath.Join(cacheDir, "lost")
}

// keepLost saves n's undelivered writes under the lost directory, drops
// them from the cache (they no longer describe anything the server will
// have) and returns the error for the application: EIO, saying where the
// data went.
func (c *Client) keepLost(n *Node, name string, cause error) error {
	var ranges [][2]int64
	for _, r := range n.entry.Dirty() {
		ranges = append(ranges, [2]int64{r.Off, r.Len})
	}
	est, _ := n.entry.Status()
	var trunc *uint64
	if cut, ok := n.entry.Cut(); ok {
		c := uint64(cut)
		trunc = &c
	}
	read := func(p []byte, off int64) error {
		k, err := n.entry.ReadAt(p, off)
		if k < len(p) {
			return fmt.Errorf("reading back local data at %d: %v", off, err)
		}
		return nil
	}
	dir, err := c.saveLost(name, n.fid, ranges, read, int64(est.Size), trunc, cause)
	if err != nil {
		// Could not save it elsewhere: keep it dirty in the cache, where
		// the next store of this file will carry it.
		c.log.Error("undelivered writes could not be saved; kept in the cache", "path", name, "err", err)
		return &lostError{path: name, cause: cause}
	}
	n.entry.Discard()
	n.valid.Store(false)
	c.stored(n)
	lerr := &lostError{path: name, cause: cause, kept: dir}
	n.mu.Lock()
	n.losses++
	n.lastLoss = lerr
	n.madeLost = nil
	n.mu.Unlock()
	return lerr
}

// saveLost writes ranges (read through read) into a sparse data file under
// the lost directory, with an info.json describing them, and returns the
// directory it made.
func (c *Client) saveLost(name string, fid node.FID, ranges [][2]int64, read func(p []byte, off int64) error, size int64, trunc *uint64, cause error) (string, error) {
	dir := filepath.Join(LostDir(c.opts.CacheDir), fmt.Sprintf("%d-%s", time.Now().UnixNano(), fid))
	rec := Lost{Path: name, FID: fid.String(), Ranges: ranges, Size: size, Truncate: trunc, Error: cause.Error(), Time: time.Now(), Data: filepath.Join(dir, "data")}
	err := func() error {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		data, err := os.OpenFile(rec.Data, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		defer data.Close()
		buf := make([]byte, 1<<20)
		for _, r := range ranges {
			for off := r[0]; off < r[0]+r[1]; {
				p := buf[:min(int64(len(buf)), r[0]+r[1]-off)]
				if err := read(p, off); err != nil {
					return err
				}
				if _, err := data.WriteAt(p, off); err != nil {
					return err
				}
				off += int64(len(p))
			}
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
	c.log.Error("writes could not be delivered to the server; kept locally", "path", name, "kept", dir, "err", cause)
	return dir, nil
}

type lostError struct {
	path, kept string
	cause      error
}

func (e *lostError) Error() string {
	if e.kept == "" {
		return fmt.Sprintf("could not store %s (%v); the data stays in the cache", e.path, e.cause)
	}
	return fmt.Sprintf("could not store %s (%v); the data is kept in %s (hoard cache lost)", e.path, e.cause, e.kept)
}

// Unwrap gives the application an errno: the server's own answer when it
// refused the data for a reason the application can act on, EIO otherwise.
func (e *lostError) Unwrap() error {
	switch errno := pb.Errno(e.cause); errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EROFS, syscall.EACCES, syscall.EPERM, syscall.ESTALE:
		return errno
	}
	return syscall.EIO
}

// recoverDirty deals with writes a crashed client left in the cache: they
// are based on versions nobody can vouch for any more, so they are not
// stored blindly but kept as lost data for the user to look at.
func (c *Client) recoverDirty() error {
	for _, fid := range c.cache.Entries() {
		e, ok := c.cache.Lookup(fid)
		if !ok || e.DirtyBytes() == 0 {
			continue
		}
		n := c.node(fid)
		n.mu.Lock()
		n.entry = e
		n.mu.Unlock()
		name := e.Policy("path")
		if name == "" {
			name = "fid " + fid.String()
		}
		c.keepLost(n, name, fmt.Errorf("client stopped before storing them"))
	}
	return nil
}

// ListLost reads the lost directory, oldest first.
func ListLost(cacheDir string) ([]Lost, error) {
	dir := LostDir(cacheDir)
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Lost
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "info.json"))
		if err != nil {
			continue
		}
		var l Lost
		if json.Unmarshal(b, &l) == nil {
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, nil
}
