package mount

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/node"
)

// Options configure a mount.
type Options struct {
	// Passthrough lets the kernel read wholly cached files straight from
	// their cache files (Linux ≥ 6.9, root). Off: the page cache serves
	// repeated reads instead.
	Passthrough bool
	// Debug logs every FUSE request.
	Debug  bool
	Logger *slog.Logger
}

// Mount is a mounted hoard file system.
type Mount struct {
	c      *client.Client
	dir    string
	server *fuse.Server
	log    *slog.Logger
	queue  *invalQueue

	passthrough bool
	ptCount     atomic.Int64

	mu     sync.Mutex
	inodes map[node.FID]*hnode
	// refs counts the kernel inodes built on each Node: the Node is
	// released only when the last of them is forgotten.
	refs map[*client.Node]int
	// lateNames: files the kernel may reach through names a break voided,
	// until the invalidation queue sent the ticket (distrust).
	lateNames map[node.FID]uint64
}

// InvalidateWait bounds how long a break waits for the kernel to drop its
// copies before the break is acknowledged anyway. The kernel takes a
// directory's lock to drop a name, and a FUSE request of this mount that
// holds it may be waiting on the server, which waits for this ack: waiting
// longer does not help then. It must fit well within the server's break
// timeout (2 s by default), after which the server resets the client.
const InvalidateWait = 500 * time.Millisecond

// New prepares a mount for c; hand its Invalidate to the client's
// Options.OnInvalidate before dialing, then call Serve.
func New(o Options) *Mount {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	m := &Mount{log: o.Logger, inodes: map[node.FID]*hnode{}, refs: map[*client.Node]int{}, lateNames: map[node.FID]uint64{}, passthrough: o.Passthrough}
	m.queue = newInvalQueue(m.notify)
	return m
}

// Invalidate is the client's OnInvalidate: it queues kernel invalidations
// for fids and waits, bounded, until they were sent. Past the bound the
// break is acknowledged with the kernel's names still in place, so the
// files they lead to are distrusted until the invalidation is through.
func (m *Mount) Invalidate(fids []node.FID) {
	seq := m.queue.add(fids)
	if !m.queue.wait(seq, InvalidateWait) {
		m.distrust(fids, seq)
	}
}

// distrust marks the files named in the directories among fids as
// reachable through names the kernel has not dropped yet, until the queue
// sent ticket seq: a request that may have come through one is answered
// ESTALE (hnode.stale), and the kernel looks the path up afresh.
func (m *Mount) distrust(fids []node.FID, seq uint64) {
	var dirs []*hnode
	m.mu.Lock()
	for _, f := range fids {
		if h := m.inodes[f]; h != nil && h.IsDir() {
			dirs = append(dirs, h)
		}
	}
	m.mu.Unlock()
	var named []node.FID
	for _, d := range dirs {
		for _, c := range d.Children() {
			if ch, ok := c.Operations().(*hnode); ok {
				named = append(named, ch.n.FID())
			}
		}
	}
	sent := m.queue.sent()
	m.mu.Lock()
	for f, s := range m.lateNames {
		if s <= sent {
			delete(m.lateNames, f) // through since
		}
	}
	m.mu.Unlock()
	for _, f := range named {
		m.lateUntil(f, seq)
	}
	m.log.Debug("break acknowledged before the kernel dropped its names", "dirs", len(dirs), "files", len(named), "ticket", seq)
}

// untilLookup, as lateUntil's ticket, distrusts a file until a lookup
// finds it by name (trusted): no invalidation is known to drop the name.
const untilLookup = math.MaxUint64

// lateUntil distrusts f until the invalidation queue sent ticket seq.
func (m *Mount) lateUntil(f node.FID, seq uint64) {
	m.mu.Lock()
	m.lateNames[f] = max(m.lateNames[f], seq)
	m.mu.Unlock()
}

// late reports whether the kernel may reach f through a name a break
// voided (distrust).
func (m *Mount) late(f node.FID) bool {
	m.mu.Lock()
	seq, ok := m.lateNames[f]
	m.mu.Unlock()
	if !ok {
		return false
	}
	if m.queue.sent() < seq {
		return true
	}
	m.trusted(f)
	return false
}

// trusted ends the distrust of f: the kernel was just given it by name.
func (m *Mount) trusted(f node.FID) {
	m.mu.Lock()
	delete(m.lateNames, f)
	m.mu.Unlock()
}

// notify runs on the queue's worker.
func (m *Mount) notify(f node.FID) {
	m.mu.Lock()
	h := m.inodes[f]
	m.mu.Unlock()
	if h != nil {
		h.invalidate()
	}
}

// track records h as the kernel's inode for its FID, where invalidations
// go. go-fuse calls OnAdd for every inode a lookup builds, also for one it
// then drops because it knows an inode of that number already (another
// name of the file, or a racing lookup of the same one): an inode the
// kernel still holds is kept then, unless live says the kernel just used
// h, which makes h the one.
func (m *Mount) track(h *hnode, live bool) {
	f := h.n.FID()
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.inodes[f]; old != nil && old != h && !live && !old.Forgotten() {
		return
	}
	m.inodes[f] = h
}

func (m *Mount) untrack(h *hnode) {
	m.mu.Lock()
	if m.inodes[h.n.FID()] == h {
		delete(m.inodes, h.n.FID())
	}
	m.refs[h.n]--
	last := m.refs[h.n] <= 0
	if last {
		delete(m.refs, h.n)
		delete(m.lateNames, h.n.FID()) // no name of the kernel's leads to it
	}
	m.mu.Unlock()
	if last {
		m.c.Release(h.n)
	}
}

// added counts a kernel inode built on h's Node. go-fuse also builds (and
// announces) inodes it then drops, which are never forgotten: their Nodes
// stay in memory, which costs memory only.
func (m *Mount) added(h *hnode) {
	m.mu.Lock()
	m.refs[h.n]++
	m.mu.Unlock()
	m.c.Hold(h.n)
}

func (m *Mount) countPassthrough() {
	m.c.Gauge("passthrough_opens", m.ptCount.Add(1))
}

// CheckMountpoint refuses a mountpoint that is missing, not a directory,
// or already a mount, with a message that says which.
func CheckMountpoint(dir string) error {
	var sfs syscall.Statfs_t
	fi, err := os.Stat(dir)
	if err == nil {
		// A dead FUSE mount may still answer stat from cached attributes;
		// statfs reaches the (missing) daemon.
		err = syscall.Statfs(dir, &sfs)
	}
	if errors.Is(err, syscall.ENOTCONN) {
		return fmt.Errorf("mountpoint %s: a dead mount is still there (transport endpoint is not connected); run: hoard umount %s", dir, dir)
	}
	if err != nil {
		if u := errors.Unwrap(err); u != nil {
			err = u
		}
		return fmt.Errorf("mountpoint %s: %v", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("mountpoint %s: not a directory", dir)
	}
	if mounted, _ := IsMounted(dir); mounted {
		return fmt.Errorf("mountpoint %s: already a mount", dir)
	}
	return nil
}

// IsMounted reports whether dir is a mount point, from /proc/self/mountinfo.
func IsMounted(dir string) (bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMount(f[4]) == abs {
			return true, nil
		}
	}
	return false, nil
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline
// and backslash.
func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// CheckFuse says clearly when /dev/fuse cannot be used.
func CheckFuse() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("/dev/fuse is not usable: %v (is the fuse module loaded, and is /dev/fuse available in this container?)", errors.Unwrap(err))
	}
	return f.Close()
}

// Serve mounts c's root volume at dir and serves it until Unmount.
func (m *Mount) Serve(c *client.Client, dir string, debug bool) error {
	m.c, m.dir = c, dir
	root := &hnode{m: m, n: c.Root()}
	rootSt, err := c.Getattr(c.Root())
	if err != nil {
		return err
	}
	asRoot := os.Geteuid() == 0
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:      "hoard",
			Name:        "hoard",
			DirectMount: asRoot,
			AllowOther:  asRoot,
			MaxWrite:    1 << 20,
			Options:     []string{"default_permissions"},
			Debug:       debug,
			// Straight to stderr: through log's default, slog would keep
			// FUSE's trace below its warn level.
			Logger: log.New(os.Stderr, "", log.Lmicroseconds),
		},
		RootStableAttr: &fs.StableAttr{Ino: ino(rootSt.FID), Gen: rootSt.FID.Unique},
	}
	if !m.passthrough {
		opts.MountOptions.DisabledCapabilities = fuse.CAP_PASSTHROUGH
	}
	if !asRoot {
		if _, err := findFusermount(); err != nil {
			return err
		}
	}
	server, err := fs.Mount(dir, root, opts)
	if err != nil {
		return fmt.Errorf("mount %s: %w", dir, err)
	}
	m.server = server
	m.track(root, true)
	m.reportReadPath(asRoot)
	return nil
}

// reportReadPath logs once which path cached reads take.
func (m *Mount) reportReadPath(asRoot bool) {
	kernel := m.server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0
	switch {
	case !m.passthrough:
		m.log.Info("cached reads: kernel page cache (passthrough off by option)", "mountpoint", m.dir)
	case !kernel:
		m.passthrough = false
		m.log.Info("cached reads: kernel page cache (this kernel has no FUSE passthrough)", "mountpoint", m.dir)
	case !asRoot:
		m.passthrough = false
		m.log.Info("cached reads: kernel page cache (passthrough needs root)", "mountpoint", m.dir)
	default:
		m.log.Info("cached reads: FUSE passthrough from the cache files", "mountpoint", m.dir)
	}
}

// Passthrough reports whether passthrough opens are in use.
func (m *Mount) Passthrough() bool { return m.passthrough }

// Wait blocks until the file system is unmounted.
func (m *Mount) Wait() { m.server.Wait() }

// Unmount unmounts and stops the invalidation worker.
func (m *Mount) Unmount() error {
	err := m.server.Unmount()
	m.queue.close()
	return err
}

func findFusermount() (string, error) {
	for _, name := range []string{"fusermount3", "fusermount"} {
		for _, dir := range filepath.SplitList(os.Getenv("PATH") + ":/bin:/usr/bin") {
			p := filepath.Join(dir, name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				return p, nil
			}
		}
	}
	return "", errors.New("mounting as a normal user needs fusermount3 (Debian package fuse3), which is not installed")
}

// Unmount unmounts dir, also when the daemon that served it died and left
// "transport endpoint is not connected" behind.
func Unmount(dir string) error {
	mounted, err := IsMounted(dir)
	if err != nil {
		return err
	}
	if !mounted {
		return fmt.Errorf("%s is not mounted", dir)
	}
	if os.Geteuid() == 0 {
		if err := syscall.Unmount(dir, 0); err == nil {
			return nil
		}
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("umount %s: %w", dir, err)
		}
		return nil
	}
	fm, err := findFusermount()
	if err != nil {
		return err
	}
	if out, err := exec.Command(fm, "-u", "-z", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("umount %s: %v: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}
