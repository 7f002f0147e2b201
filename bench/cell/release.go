package cell

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/bench/harness"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
)

// releaseFile is the size of each file of the released volume: past the
// inline size, so each is a data file of its own.
const releaseFile = 96 << 10

// Release releases volumes of growing file counts to two read-only
// sites, then again with 1% of the files rewritten; then kills the site
// a reader of a 256 MiB file reads from, and times the failover.
func Release(e *harness.Env) error {
	bin, scratch := e.Bin, e.Scratch
	a, _, etcd, stopA, err := startCellServer(bin, filepath.Join(scratch, "rel-a"))
	if err != nil {
		return err
	}
	defer stopA()
	var pids []int
	for _, name := range []string{"b", "c"} {
		_, pid, stop, err := harness.StartHoard(bin, "server", "--insecure", "--data", filepath.Join(scratch, "rel-"+name), "--etcd", etcd, "--name", name)
		if err != nil {
			return err
		}
		defer stop()
		pids = append(pids, pid)
	}
	c, err := pathfs.Dial(client.Options{Server: a, CacheSize: 64 << 20})
	if err != nil {
		return err
	}
	defer c.Close()
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	fmt.Printf("\n## Releasing a volume to read-only sites\n\n")
	fmt.Printf("Three servers of one cell on loopback (`--insecure`): the volume at one, read-only sites at the two others. Files of %s each (data files, past the inline size). The second release follows a rewrite of 1%% of the files with new bytes. Metadata is sent whole at each of a release's three passes, to each site.\n\n", harness.Human(releaseFile))
	fmt.Println("| files | volume | first release (s) | second: changed | second: data sent | second: metadata sent | second: took (s) | second: changes held back (ms) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, n := range []int{e.Files / 4, e.Files / 2, e.Files} {
		name := fmt.Sprintf("rel%d", n)
		if _, err := c.Admin().CreateVolumeOn(name, a); err != nil {
			return err
		}
		if err := c.Admin().MountVolume("/%"+name, "%"+name); err != nil {
			return err
		}
		w, err := pathfs.Dial(client.Options{Server: a, CacheSize: 64 << 20})
		if err != nil {
			return err
		}
		for i := range n {
			if err := harness.WriteRemote(w, fmt.Sprintf("/%%%s/%05d", name, i), data[i%64:], releaseFile); err != nil {
				return err
			}
		}
		w.Close()
		for _, site := range []string{"b", "c"} {
			if err := c.Admin().AddSite(name, site); err != nil {
				return err
			}
		}
		first, err := c.Admin().Release(name)
		if err != nil {
			return err
		}
		w, err = pathfs.Dial(client.Options{Server: a, CacheSize: 64 << 20})
		if err != nil {
			return err
		}
		changed := 0
		for i := 0; i < n; i += 100 {
			if err := harness.WriteRemote(w, fmt.Sprintf("/%%%s/%05d", name, i), data[i%64+1:], releaseFile); err != nil {
				return err
			}
			changed++
		}
		w.Close()
		second, err := c.Admin().Release(name)
		if err != nil {
			return err
		}
		mb := func(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }
		fmt.Printf("| %d | %s | %.2f | %d files, %s | %s (%.2f× the changed bytes × 2 sites) | %s | %.2f | %.0f |\n", n, mb(int64(n)*releaseFile), first.Took.Seconds(),
			changed, mb(int64(changed)*releaseFile), mb(second.Bytes), float64(second.Bytes)/float64(2*int64(changed)*releaseFile),
			mb(second.MetaBytes), second.Took.Seconds(), ms(second.Freeze))
	}

	// Failover: a reader of a 256 MiB file of the copy, whose site dies.
	const foSize = 256 << 20
	if _, err := c.Admin().CreateVolumeOn("fo", a); err != nil {
		return err
	}
	if err := c.Admin().MountVolume("/fo", "fo"); err != nil {
		return err
	}
	w, err := pathfs.Dial(client.Options{Server: a, CacheSize: 64 << 20})
	if err != nil {
		return err
	}
	if err := harness.WriteRemote(w, "/fo/big", data, foSize); err != nil {
		return err
	}
	w.Close()
	for _, site := range []string{"b", "c"} {
		if err := c.Admin().AddSite("fo", site); err != nil {
			return err
		}
	}
	if _, err := c.Admin().Release("fo"); err != nil {
		return err
	}
	r, err := pathfs.Dial(client.Options{Server: a, CacheSize: 64 << 20})
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := r.Open("/fo/big", os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var read int64
	var normal, longest time.Duration
	for read < foSize {
		if read == foSize/4 {
			syscall.Kill(pids[0], syscall.SIGKILL) // b, the first site
		}
		start := time.Now()
		n, err := io.ReadFull(f, buf)
		took := time.Since(start)
		if off := read % int64(len(data)); !bytes.Equal(buf[:n], data[off:off+int64(n)]) {
			return fmt.Errorf("read at %d: the bytes differ from the file's", read)
		}
		if read < foSize/4 {
			normal = max(normal, took)
		} else {
			longest = max(longest, took)
		}
		if read += int64(n); err != nil && err != io.EOF && read < foSize {
			return fmt.Errorf("read at %d after the site died: %v", read, err)
		}
	}
	fmt.Printf("\nFailover: a library client reading a %s file of the copy from site b, which is killed (SIGKILL) a quarter of the way: the longest 1 MiB read after the kill took %.0f ms (the longest before it: %.0f ms); the reader got every byte. A site is given up after 1 s without an answer.\n",
		harness.Human(foSize), ms(longest), ms(normal))
	return nil
}
