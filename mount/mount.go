package mount

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/user"
	"github.com/hoardfs/hoard/fuseuring"
	"github.com/hoardfs/hoard/node"
)

// Options configure a mount.
type Options struct {
	// Passthrough lets the kernel read wholly cached files straight from
	// their cache files (Linux ≥ 6.9, root). Off: the page cache serves
	// repeated reads instead.
	Passthrough bool
	// Debug logs every FUSE request.
	Debug bool
	// SingleUser acts for every local user with the client's own token,
	// leaving them apart to the kernel's mode bits; otherwise each user
	// acts with the token they handed the mount (Login), and one with none
	// is anonymous. A mount a user other than root starts is single-user
	// (the kernel lets no other user in).
	SingleUser bool
	// IOUring serves the kernel's requests over io_uring, each CPU's on
	// that CPU, where the kernel offers it (Linux 6.14+, root, the fuse
	// module's enable_uring); otherwise over /dev/fuse.
	IOUring bool
	Logger  *slog.Logger
}

// Mount is a mounted hoard file system.
type Mount struct {
	c      *client.Nodes // the client's own user's
	users  *users
	single bool
	dir    string
	server *fuse.Server
	ring   *fuseuring.Transport // nil: requests come over /dev/fuse
	uring  bool                 // asked for
	noRing string               // why not over io_uring
	// ownMount: fuseuring mounted it, and go-fuse does not know where.
	ownMount bool
	log      *slog.Logger
	queue    *invalQueue

	passthrough bool
	ptCount     atomic.Int64

	mu sync.Mutex
	// inodes is each FID's current kernel inode, the one a lookup hands
	// out; older are the ones it replaced (kernelGen) that the kernel
	// still holds. Invalidations go to all of them.
	inodes map[node.FID]*hnode
	older  map[node.FID][]*hnode
	// withOlder is len(older), read without mu on every write.
	withOlder atomic.Int64
	// gens is the generation of each FID's current kernel inode, for
	// FIDs past the first.
	gens map[node.FID]uint64
	// refs counts the kernel inodes built on each Node: the Node is
	// released only when the last of them is forgotten.
	refs map[*client.Node]int

	// refused: what each user's last `hoard cache flush` found the
	// server refusing. A leaf lock.
	refusedMu sync.Mutex
	refused   map[user.User][]client.Refusal
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
	m := &Mount{log: o.Logger, inodes: map[node.FID]*hnode{}, older: map[node.FID][]*hnode{}, gens: map[node.FID]uint64{}, refs: map[*client.Node]int{}, passthrough: o.Passthrough, single: o.SingleUser, uring: o.IOUring}
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

// distrust marks the kernel inodes named in the directories among fids
// as reachable through names the kernel has not dropped yet, until the
// queue sent ticket seq: a request on one is answered ESTALE
// (hnode.stale), and the kernel looks the path up afresh.
func (m *Mount) distrust(fids []node.FID, seq uint64) {
	var dirs []*hnode
	m.mu.Lock()
	for _, f := range fids {
		for _, h := range m.kernelInodesLocked(f) {
			if h.IsDir() {
				dirs = append(dirs, h)
			}
		}
	}
	m.mu.Unlock()
	n := 0
	for _, d := range dirs {
		for _, c := range d.Children() {
			if ch, ok := c.Operations().(*hnode); ok {
				ch.distrustUntil(seq)
				n++
			}
		}
	}
	m.log.Debug("break acknowledged before the kernel dropped its names", "dirs", len(dirs), "inodes", n, "ticket", seq)
}

// untilLookup, as a distrust's ticket, is never sent: a file's inode so
// marked stays distrusted, a directory's until a lookup finds it by name
// (kernelGen). No invalidation is known to drop the name.
const untilLookup = math.MaxUint64

// kernelGen is the generation of f's kernel inode that the kernel is to
// be given by name now. Distrust is kept per kernel inode, since FUSE's
// OPEN does not say which name it came through: a file whose current
// inode is distrusted gets a new inode, so the name looked up leads to a
// trusted one while the names a break voided still lead to the old one
// until the kernel drops them. A directory keeps its inode (the kernel
// gives a directory one name, and working directories hold it), and the
// lookup ends its distrust.
func (m *Mount) kernelGen(f node.FID, dir bool) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.gens[f]
	cur := m.inodes[f]
	if cur == nil || cur.gen != g || !cur.late() {
		return g
	}
	if dir {
		cur.trust()
		return g
	}
	g++
	m.gens[f] = g
	return g
}

// stableAttr is go-fuse's identity of f's kernel inode of generation
// gen: another generation is another kernel inode (another node id) with
// the same inode number. Generations go above FID.Unique's bits, which a
// volume's counter of made files does not reach.
func stableAttr(st node.Status, gen uint64) fs.StableAttr {
	return fs.StableAttr{Mode: typeBits(st.Type), Ino: ino(st.FID), Gen: st.FID.Unique + gen<<48}
}

// wrote keeps the kernel's other inodes of h's file from serving pages
// from before a write through h: they share no page cache.
func (m *Mount) wrote(h *hnode) {
	if m.withOlder.Load() == 0 {
		return
	}
	f := h.n.FID()
	m.mu.Lock()
	other := len(m.older[f]) > 0
	m.mu.Unlock()
	if other {
		m.queue.add([]node.FID{f})
	}
}

// current is f's current kernel inode, or nil.
func (m *Mount) current(f node.FID) *hnode {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inodes[f]
}

// kernelInodesLocked is f's current kernel inode and the older ones the
// kernel still holds.
func (m *Mount) kernelInodesLocked(f node.FID) []*hnode {
	hs := append([]*hnode(nil), m.older[f]...)
	if h := m.inodes[f]; h != nil {
		hs = append(hs, h)
	}
	return hs
}

// notify runs on the queue's worker.
func (m *Mount) notify(f node.FID) {
	m.mu.Lock()
	hs := m.kernelInodesLocked(f)
	m.mu.Unlock()
	for _, h := range hs {
		h.invalidate()
	}
}

// track records h as the kernel's current inode for its FID. go-fuse
// calls OnAdd for every inode a lookup builds, also for one it then drops
// because it knows an inode of that identity already (another name of
// the file, or a racing lookup of the same one): an inode the kernel
// still holds is kept then, unless live says the kernel just used h,
// which makes h the one. An inode of a later generation replaces the
// current one, which is kept among the older while the kernel holds it.
func (m *Mount) track(h *hnode, live bool) {
	f := h.n.FID()
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.inodes[f]
	switch {
	case old == nil || old == h:
	case h.gen < old.gen:
		return
	case h.gen > old.gen:
		if !old.Forgotten() {
			m.older[f] = append(m.older[f], old)
			m.withOlder.Store(int64(len(m.older)))
		}
	case !live && !old.Forgotten():
		return
	}
	m.inodes[f] = h
}

func (m *Mount) untrack(h *hnode) {
	f := h.n.FID()
	m.mu.Lock()
	if m.inodes[f] == h {
		delete(m.inodes, f)
	}
	if old := slices.DeleteFunc(m.older[f], func(o *hnode) bool { return o == h }); len(old) > 0 {
		m.older[f] = old
	} else {
		delete(m.older, f)
	}
	m.withOlder.Store(int64(len(m.older)))
	m.refs[h.n]--
	last := m.refs[h.n] <= 0
	if last {
		delete(m.refs, h.n)
		delete(m.gens, f) // no inode of the kernel's is left to tell apart
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
// already a mount, or (unless nonEmpty) holds files, which the mount
// would hide until it is gone, with a message that says which.
func CheckMountpoint(dir string, nonEmpty bool) error {
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
	if !nonEmpty {
		f, err := os.Open(dir)
		if err != nil {
			return fmt.Errorf("mountpoint %s: %v", dir, errors.Unwrap(err))
		}
		names, _ := f.Readdirnames(1)
		f.Close()
		if len(names) > 0 {
			return fmt.Errorf("mountpoint %s is not empty (it holds %s): the mount would hide its files until unmounted; pass --nonempty to mount over them", dir, names[0])
		}
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
	asRoot := os.Geteuid() == 0
	m.c, m.dir = c.Nodes(), dir
	m.single = m.single || !asRoot
	m.users = newUsers(m.c, uint32(os.Getuid()), m.single)
	rn, err := m.c.Root()
	if err != nil {
		return err
	}
	root := &hnode{m: m, n: rn}
	rootSt, err := m.c.Getattr(rn)
	if err != nil {
		return err
	}
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
	server, err := m.mount(dir, root, opts, asRoot)
	if err != nil {
		return fmt.Errorf("mount %s: %w", dir, err)
	}
	m.server = server
	m.track(root, true)
	m.reportReadPath(asRoot)
	return nil
}

// mount mounts root at dir: over io_uring when asked and this kernel and
// user allow it, otherwise as go-fuse does, over /dev/fuse.
func (m *Mount) mount(dir string, root fs.InodeEmbedder, opts *fs.Options, asRoot bool) (*fuse.Server, error) {
	why := "off by option"
	if m.uring {
		why = "needs root"
		if asRoot {
			why = ""
			if err := fuseuring.Check(); err != nil {
				why = err.Error()
			}
		}
	}
	if why != "" {
		m.noRing = why
		if m.uring {
			m.log.Info("FUSE requests over /dev/fuse", "mountpoint", dir, "io_uring", why)
		}
		return fs.Mount(dir, root, opts)
	}
	server, ring, err := fuseuring.Mount(dir, fs.NewNodeFS(root, opts), &opts.MountOptions, fuseuring.Config{PerCPU: ringThreads})
	if server == nil {
		return nil, err
	}
	if err != nil {
		m.noRing = err.Error()
		m.log.Warn("FUSE requests over /dev/fuse: io_uring refused", "mountpoint", dir, "err", err)
	} else {
		m.log.Info("FUSE requests over io_uring", "mountpoint", dir, "queues", ring.Queues(), "threads_per_queue", ringThreads)
	}
	m.ring, m.ownMount = ring, true
	return server, nil
}

// ringThreads is how many requests each CPU's ring queue serves at once; a
// request waiting on the server holds one.
const ringThreads = 8

// Transport names how the kernel's requests reach this mount, and when
// not over io_uring, why.
func (m *Mount) Transport() (name, whyNotRing string) {
	if m.ring != nil {
		return "io_uring", ""
	}
	return "/dev/fuse", m.noRing
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

// as is the client's view for the caller of the kernel request of ctx.
func (m *Mount) as(ctx context.Context) *client.Nodes { return m.users.of(ctx) }

// SingleUser reports whether every local user acts with the mount's own
// token (Options.SingleUser).
func (m *Mount) SingleUser() bool { return m.single }

// Login has the local user uid act as u from now on (hoard login). On a
// single-user mount only the uid that started it may, for everyone.
func (m *Mount) Login(uid uint32, u user.User) error { return m.users.set(uid, u) }

// Logout makes the local user uid anonymous from now on (hoard logout).
func (m *Mount) Logout(uid uint32) error { return m.users.drop(uid) }

// Passthrough reports whether passthrough opens are in use.
func (m *Mount) Passthrough() bool { return m.passthrough }

// Wait blocks until the file system is unmounted.
func (m *Mount) Wait() {
	m.server.Wait()
	if m.ring != nil {
		m.ring.Wait()
	}
}

// Unmount unmounts and stops the invalidation worker.
func (m *Mount) Unmount() error {
	var err error
	if m.ownMount {
		err = fuseuring.Unmount(m.dir)
	} else {
		err = m.server.Unmount()
	}
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
