package integration

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	cadmin "github.com/hoardfs/hoard/client/admin"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/pathfs"
	"github.com/hoardfs/hoard/internal/poll"
	"github.com/hoardfs/hoard/internal/testkit"
)

// etcdProc is a running `hoard etcd` member.
type etcdProc struct {
	cmd    *exec.Cmd
	args   []string // hoard's, to start it again
	client string   // its client URL
	logs   *logBuf
}

// launch starts the member; ready gets i once it serves.
func (m *etcdProc) launch(t *testing.T, i int, ready chan<- int) {
	m.cmd = exec.Command(hoardBin, m.args...)
	stderr, _ := m.cmd.StderrPipe()
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			m.logs.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "serving clients") {
				ready <- i
			}
		}
	}()
}

// startEtcd starts a cluster of n members, secured with the tests'
// cell, and waits until each serves.
func startEtcd(t *testing.T, n int) []*etcdProc {
	t.Helper()
	names := make([]string, n)
	peers := make([]string, n)
	clients := make([]string, n)
	var cluster []string
	for i := range n {
		names[i], peers[i], clients[i] = fmt.Sprintf("e%d", i+1), freeAddr(t), freeAddr(t)
		cluster = append(cluster, names[i]+"=https://"+peers[i])
	}
	ms := make([]*etcdProc, n)
	ready := make(chan int, n)
	for i := range n {
		m := &etcdProc{client: "https://" + clients[i], logs: &logBuf{}, args: []string{"etcd", "--name", names[i], "--data", t.TempDir(),
			"--cell", testCell.dir, "--client", clients[i], "--peer", peers[i], "--cluster", strings.Join(cluster, ",")}}
		m.launch(t, i, ready)
		ms[i] = m
		t.Cleanup(func() {
			m.kill9()
			if t.Failed() {
				t.Logf("etcd %s log:\n%s", names[i], m.logs)
			}
		})
	}
	for range n {
		select {
		case <-ready:
		case <-time.After(time.Minute):
			t.Fatal("the etcd cluster did not come up within a minute")
		}
	}
	return ms
}

func (m *etcdProc) kill9() {
	if m.cmd != nil && m.cmd.Process != nil {
		m.cmd.Process.Signal(syscall.SIGKILL)
		m.cmd.Wait()
		m.cmd = nil
	}
}

// cellOf3 starts three file servers, s1 to s3, on a three-member etcd
// cluster; s1 first, so that it holds the root volume.
func cellOf3(t *testing.T, extra ...string) ([]*etcdProc, []*serverProc) {
	t.Helper()
	members := startEtcd(t, 3)
	urls := make([]string, len(members))
	for i, m := range members {
		urls[i] = m.client
	}
	var srvs []*serverProc
	for i := range 3 {
		srvs = append(srvs, startServer(t, t.TempDir(), append([]string{"--etcd", strings.Join(urls, ","), "--name", fmt.Sprintf("s%d", i+1)}, extra...)...))
	}
	return members, srvs
}

// waitAlive waits until the cell lists want servers, all alive.
func waitAlive(t *testing.T, c *pathfs.FS, want int) {
	t.Helper()
	var ss []cadmin.Server
	var err error
	if !poll.Until(15*time.Second, func() bool {
		ss, err = c.Admin().Servers()
		alive := 0
		for _, s := range ss {
			if s.Alive {
				alive++
			}
		}
		return err == nil && alive == want && len(ss) == want
	}) {
		t.Fatalf("servers: %+v %v; want %d alive", ss, err, want)
	}
}

// Three servers, one namespace: a volume on each, reached through one
// mount dialled to one of them; the location database survives one etcd
// member's death (a volume is still made), and with two dead, location
// changes fail in a line while file I/O on resolved volumes goes on.
func TestCellThreeServers(t *testing.T) {
	needFuse(t)
	members, srvs := cellOf3(t)
	c := dial(t, srvs[0].addr, "mem", 16<<20)
	waitAlive(t, c, 3)
	for i := range 3 {
		name := fmt.Sprintf("v%d", i+1)
		if _, err := c.Admin().CreateVolumeOn(name, fmt.Sprintf("s%d", i+1)); err != nil {
			t.Fatal(err)
		}
		if err := c.Admin().MountVolume("/"+name, name); err != nil {
			t.Fatal(err)
		}
	}
	// The mount goes to s2, which holds neither the root nor v1 nor v3.
	m := startMount(t, srvs[1], t.TempDir())
	// 100 KiB each: past the inline size, so a data file at its server.
	body := func(round, p string) string { return strings.Repeat(round+p, 100<<10/len(round+p)+1) }
	write := func(round string) {
		t.Helper()
		for i := range 3 {
			p := m.path(fmt.Sprintf("v%d/%s", i+1, round))
			f, err := os.Create(p)
			if err == nil {
				_, err = f.WriteString(body(round, p))
			}
			if err == nil {
				err = f.Sync() // at its server now, not only in the cache
			}
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		for i := range 3 {
			p := m.path(fmt.Sprintf("v%d/%s", i+1, round))
			if b, err := os.ReadFile(p); err != nil || string(b) != body(round, p) {
				t.Fatalf("read %s: %d bytes, %v", p, len(b), err)
			}
		}
	}
	write("first")
	// Each volume's bytes are at its own server, and only there.
	for i := range 3 {
		info, err := c.Admin().Examine(fmt.Sprintf("v%d", i+1))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("s%d", i+1); info.RW.Name != want || info.Used == 0 || info.Files != 2 {
			t.Fatalf("v%d: %+v; want at %s with one file", i+1, info, want)
		}
		for j, s := range srvs {
			_, err := os.Stat(filepath.Join(s.data, "data", fmt.Sprint(info.Volume.ID)))
			if j == i && err != nil || j != i && err == nil {
				t.Fatalf("v%d (id %d) at server s%d: %v", i+1, info.Volume.ID, j+1, err)
			}
		}
	}
	// A mount point to a volume no server has is refused.
	if err := c.Admin().MountVolume("/nowhere", "nowhere"); !os.IsNotExist(err) {
		t.Fatalf("mount point to no volume: %v", err)
	}

	members[0].kill9()
	if _, err := c.Admin().CreateVolume("after-one"); err != nil {
		t.Fatalf("a volume made with one etcd member of three dead: %v", err)
	}
	if _, err := c.Admin().MoveVolume("v3", "s1"); err != nil {
		t.Fatalf("a move with one etcd member of three dead: %v", err)
	}
	write("second")

	members[1].kill9()
	start := time.Now()
	out, code := run(t, "vol", "create", "after-two", "--server", srvs[0].addr, "--cache", "")
	if code != 1 || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, "location database") {
		t.Fatalf("vol create with two etcd members of three dead: exit %d: %q", code, out)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("the refusal took %v", took)
	}
	write("third")

	// Without a quorum no lease is kept, nor can one expire: liveness is
	// unknown, and said so, once the answering server lost its own.
	list := func() string {
		out, _ := run(t, "server", "list", "--server", srvs[0].addr)
		return out
	}
	var out2 string
	if !poll.Until(45*time.Second, func() bool { out2 = list(); return strings.Contains(out2, "liveness unknown") }) {
		t.Fatalf("server list with two etcd members of three dead:\n%s", out2)
	}
	if strings.Contains(out2, " yes ") {
		t.Errorf("server list says a server is alive without a quorum:\n%s", out2)
	}
	// A quorum back, each server says its lease is back, and the list
	// knows again.
	back := make(chan int, 1)
	members[1].launch(t, 1, back)
	select {
	case <-back:
	case <-time.After(time.Minute):
		t.Fatal("the etcd member did not come back within a minute")
	}
	poll.Wait(t, 45*time.Second, "every server's lease back", func() bool {
		for _, s := range srvs {
			if !strings.Contains(s.logs.String(), "lease in the location database back") {
				return false
			}
		}
		return true
	})
	if !poll.Until(30*time.Second, func() bool { out2 = list(); return strings.Count(out2, " yes ") == 3 }) {
		t.Errorf("server list with the quorum back:\n%s", out2)
	}
}

// The cell's administration answers through any server with the root
// volume's server down: the commands that need no path do not look for
// the root, and a volume list shows what the dead server holds without
// its sizes, saying why.
func TestCellAdminRootServerDown(t *testing.T) {
	_, srvs := cellOf3(t)
	admin := dial(t, srvs[1].addr, "mem", 16<<20)
	waitAlive(t, admin, 3)
	if _, err := admin.Admin().CreateVolumeOn("v2", "s2"); err != nil {
		t.Fatal(err)
	}
	srvs[0].kill9() // s1, the root volume's
	via := []string{"--server", srvs[1].addr}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"server", "list"}, []string{"s1", "s2", "s3"}},
		{[]string{"vol", "list"}, []string{"v2", "root", "sizes shown as ?: ", "s1"}},
		{[]string{"vol", "examine", "v2"}, []string{"volume v2", "read-write at s2"}},
	} {
		out, code := run(t, append(c.args, via...)...)
		for _, w := range c.want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("hoard %v with s1 down: exit %d, want %q in:\n%s", c.args, code, w, out)
				break
			}
		}
	}
	// A mount needs the root volume: it says whose, and how to do
	// without it.
	out, code := run(t, "mount", "--server", srvs[1].addr, "--cache", t.TempDir(), t.TempDir())
	if code == 0 || !strings.Contains(out, "hoard vol addsite root") {
		t.Errorf("hoard mount with the root volume's server down: exit %d:\n%s", code, out)
	}
}

// Bad input to the cell's commands: one line, exit 1 or 2, nothing made.
func TestCellBadInput(t *testing.T) {
	srv := startServer(t, t.TempDir())
	hoard := func(args ...string) (string, int) {
		return run(t, append(args, "--server", srv.addr, "--cache", "")...)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"vol", "create", "x", "--on", "nosuch"}, 1, "no server nosuch"},
		{[]string{"vol", "create", "root"}, 1, "exists"},
		{[]string{"vol", "create", "bad/name"}, 1, "bad name"},
		{[]string{"vol", "remove", "nosuch"}, 1, "no such"},
		{[]string{"vol", "remove", "root"}, 1, "not removed"},
		{[]string{"vol", "examine", "nosuch"}, 1, "no such"},
		{[]string{"vol", "move", "root", "--to", "nosuch"}, 1, "no server nosuch"},
		{[]string{"vol", "addsite", "root", "nosuch"}, 1, "no server nosuch"},
		{[]string{"vol", "remsite", "root", "nosuch"}, 1, "not a read-only site"},
		{[]string{"vol", "release", "root"}, 1, "no read-only sites"},
		{[]string{"vol", "release", "nosuch"}, 1, "no such"},
		{[]string{"vol", "create", "x.readonly"}, 1, "read-only copies"},
		{[]string{"vol", "addsite", "root"}, 2, "needs NAME and SERVER"},
	} {
		out, code := hoard(tc.args...)
		if code != tc.code || strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.Contains(out, tc.says) {
			t.Errorf("hoard %s: exit %d, %q; want exit %d saying %q", strings.Join(tc.args, " "), code, out, tc.code, tc.says)
		}
	}
	out, _ := hoard("vol", "list")
	if strings.Count(strings.TrimSpace(out), "\n") != 1 {
		t.Fatalf("after bad input, volumes besides root:\n%s", out)
	}
	// An etcd nobody serves: the server does not start, and says why.
	out, code := run(t, "server", "--data", t.TempDir(), "--listen", freeAddr(t), "--cell", testCell.dir, "--etcd", "https://"+freeAddr(t))
	if code == 0 || !strings.Contains(out, "does not answer") {
		t.Fatalf("server with a dead --etcd: exit %d: %s", code, out)
	}
}

// A proxy in front of a cell: dialled to one server, it resolves every
// volume like a client, fetches each from its own server, and passes on
// the breaks each server sends.
func TestCellProxy(t *testing.T) {
	_, srvs := cellOf3(t)
	admin := dial(t, srvs[0].addr, "mem", 16<<20)
	waitAlive(t, admin, 3)
	for i := range 3 {
		name := fmt.Sprintf("v%d", i+1)
		if _, err := admin.Admin().CreateVolumeOn(name, fmt.Sprintf("s%d", i+1)); err != nil {
			t.Fatal(err)
		}
		if err := admin.Admin().MountVolume("/"+name, name); err != nil {
			t.Fatal(err)
		}
		testkit.WriteFile(t, admin, "/"+name+"/f", []byte("one "+name))
	}
	px := startProxy(t, srvs[1], t.TempDir())
	a := dial(t, px.addr, t.TempDir(), 64<<20)
	for i := range 3 {
		p := fmt.Sprintf("/v%d/f", i+1)
		if got := string(testkit.ReadFile(t, a, p)); got != fmt.Sprintf("one v%d", i+1) {
			t.Fatalf("read %s through the proxy: %q", p, got)
		}
	}
	// A change at s3 (dialled there directly) breaks the proxy's promise
	// and its client's before it returns; one through the proxy reaches s1.
	direct := dial(t, srvs[2].addr, "mem", 16<<20)
	testkit.WriteFile(t, direct, "/v3/f", []byte("two"))
	if got := string(testkit.ReadFile(t, a, "/v3/f")); got != "two" {
		t.Fatalf("after a change at s3, the proxy's client read %q", got)
	}
	testkit.WriteFile(t, a, "/v1/g", []byte("made through the proxy"))
	info, err := admin.Admin().Examine("v1")
	if err != nil || info.Files != 3 {
		t.Fatalf("v1 at s1 after a create through the proxy: %+v %v", info, err)
	}
	if err := a.Rename("/v1/g", "/v2/g"); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename across volumes through the proxy: %v, want EXDEV", err)
	}
}

// A volume moved while three clients (two library clients dialled to
// other servers, one FUSE mount) open, read, write, truncate and rename
// its files: the history across the move is close-to-open consistent, no
// acknowledged change is lost, and afterwards the volume is at its new
// server only.
func TestCellMoveConsistency(t *testing.T) {
	needFuse(t)
	_, srvs := cellOf3(t)
	admin := dial(t, srvs[0].addr, "mem", 16<<20)
	waitAlive(t, admin, 3)
	if _, err := admin.Admin().CreateVolumeOn("mv", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Admin().MountVolume("/mv", "mv"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Mkdir("/mv/d", 0o755); err != nil {
		t.Fatal(err)
	}
	m := startMount(t, srvs[2], t.TempDir())
	clients := []consFS{
		libFS{dialConsWith(t, srvs[1], t.Name()+"-c0", client.Options{DirBackoff: time.Millisecond}), "/mv/d", srvs[1]},
		libFS{dialConsWith(t, srvs[2], t.Name()+"-c1", client.Options{DirBackoff: time.Millisecond}), "/mv/d", srvs[2]},
		osFS{m.path("mv/d")},
	}
	var rep cadmin.MoveReport
	consRun(t, srvs[0], clients, 6*time.Second, false, func() {
		var err error
		if rep, err = admin.Admin().MoveVolume("mv", "s2"); err != nil {
			t.Errorf("move under load: %v", err)
		}
	})
	t.Logf("moved in %d passes, %d bytes, changes held back %v, %v in all", rep.Passes, rep.Bytes, rep.Freeze, rep.Took)
	// Every client goes on at the new server: what one writes, the next
	// reads.
	for i, fs := range clients {
		name := fmt.Sprintf("after-%d", i)
		f, _, err := fs.open(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err == nil {
			_, err = f.WriteAt([]byte(name), 0)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			t.Fatalf("client %d after the move: %v", i, err)
		}
		r, _, err := clients[(i+1)%len(clients)].open(name, os.O_RDONLY)
		if err != nil {
			t.Fatalf("client %d after the move: %v", (i+1)%len(clients), err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(b) != name {
			t.Fatalf("client %d read %q (%v) after client %d wrote %q", (i+1)%len(clients), b, err, i, name)
		}
	}
	info, err := admin.Admin().Examine("mv")
	if err != nil || info.RW.Name != "s2" || info.Moving != "" {
		t.Fatalf("after the move: %+v %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(srvs[0].data, "data", fmt.Sprint(info.Volume.ID))); err == nil {
		t.Fatal("the source kept the moved volume's data")
	}
}

// A mover killed mid-move leaves the volume readable and writable at its
// source once the source stops waiting for it (--move-hold); run again,
// the move finishes; a move killed on its way elsewhere is undone by
// moving the volume to where it is.
func TestCellMoveInterrupted(t *testing.T) {
	_, srvs := cellOf3(t, "--move-hold", "2s")
	admin := dial(t, srvs[0].addr, "mem", 16<<20)
	waitAlive(t, admin, 3)
	if _, err := admin.Admin().CreateVolumeOn("big", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Admin().MountVolume("/big", "big"); err != nil {
		t.Fatal(err)
	}
	data := testkit.Pattern(192<<20, 7)
	testkit.WriteFile(t, dial(t, srvs[0].addr, "mem", 256<<20), "/big/f", data)
	hoard := func(args ...string) *exec.Cmd {
		return exec.Command(hoardBin, append(args, "--server", srvs[0].addr, "--cache", "")...)
	}
	// killMover starts a move to to and kills it once the move is recorded.
	killMover := func(to string) {
		t.Helper()
		moveAndKill(t, admin, srvs[0].addr, to, func(mover *exec.Cmd) { mover.Process.Signal(syscall.SIGKILL) })
	}
	writable := func(what string) {
		t.Helper()
		c := dial(t, srvs[1].addr, "mem", 16<<20)
		start := time.Now()
		testkit.WriteFile(t, c, "/big/w", []byte(what))
		if got := string(testkit.ReadFile(t, admin, "/big/w")); got != what {
			t.Fatalf("read %q after writing %q", got, what)
		}
		t.Logf("%s: written after %v", what, time.Since(start))
	}
	killMover("s2")
	writable("after the mover died")
	if info, err := admin.Admin().Examine("big"); err != nil || info.RW.Name != "s1" {
		t.Fatalf("after the mover died: %+v %v", info, err)
	}
	// Run again: it finishes.
	if out, err := hoard("vol", "move", "big", "--to", "s2").CombinedOutput(); err != nil {
		t.Fatalf("move run again: %v: %s", err, out)
	}
	examined(t, admin, "big", "at s2, not moving", func(info cadmin.VolumeInfo) bool { return info.RW.Name == "s2" && info.Moving == "" })
	if got := testkit.ReadFile(t, dial(t, srvs[2].addr, "mem", 256<<20), "/big/f"); !bytes.Equal(got, data) {
		t.Fatal("the moved file's bytes differ")
	}
	writable("at s2")
	// Killed on its way to s3, undone by a move to where it is.
	killMover("s3")
	out, err := hoard("vol", "move", "big", "--to", "s2").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "undone") {
		t.Fatalf("undo: %v: %s", err, out)
	}
	examined(t, admin, "big", "at s2, not moving", func(info cadmin.VolumeInfo) bool { return info.RW.Name == "s2" && info.Moving == "" })
	if _, err := os.Stat(filepath.Join(srvs[2].data, "data", "2")); err == nil {
		t.Fatal("s3 kept the copy of an undone move")
	}
	writable("after the undo")
}

// A move whose target or source is killed fails, and leaves the volume
// readable and writable at exactly one server: killed target, the source
// goes on and the target drops its partial copy when it starts again;
// killed source, it serves the volume again when it starts, and the move
// is undone by moving the volume to where it is.
func TestCellMoveServerDies(t *testing.T) {
	_, srvs := cellOf3(t)
	admin := dial(t, srvs[2].addr, "mem", 16<<20) // s3 stays up
	waitAlive(t, admin, 3)
	if _, err := admin.Admin().CreateVolumeOn("big", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Admin().MountVolume("/big", "big"); err != nil {
		t.Fatal(err)
	}
	data := testkit.Pattern(192<<20, 9)
	testkit.WriteFile(t, dial(t, srvs[2].addr, "mem", 256<<20), "/big/f", data)
	// killDuring starts a move to to, kills victim once it is recorded,
	// and returns the mover's outcome.
	killDuring := func(to string, victim *serverProc) error {
		t.Helper()
		return moveAndKill(t, admin, srvs[2].addr, to, func(*exec.Cmd) { victim.kill9() })
	}
	at := func(want string) {
		t.Helper()
		info, err := admin.Admin().Examine("big")
		if err != nil || info.RW.Name != want {
			t.Fatalf("volume at %+v (%v), want %s", info.Location, err, want)
		}
		c := dial(t, srvs[2].addr, "mem", 16<<20)
		testkit.WriteFile(t, c, "/big/w", []byte("at "+want))
		if got := string(testkit.ReadFile(t, admin, "/big/w")); got != "at "+want {
			t.Fatalf("read %q", got)
		}
	}
	if err := killDuring("s2", srvs[1]); err == nil {
		t.Fatal("a move whose target died succeeded")
	}
	at("s1")
	srvs[1].restart()
	if _, err := os.Stat(filepath.Join(srvs[1].data, "data", "2")); err == nil {
		t.Fatal("the restarted target kept a partial copy")
	}
	if _, err := admin.Admin().MoveVolume("big", "s2"); err != nil {
		t.Fatalf("the move again: %v", err)
	}
	at("s2")
	if err := killDuring("s1", srvs[1]); err == nil {
		t.Fatal("a move whose source died succeeded")
	}
	srvs[1].restart()
	at("s2")
	if rep, err := admin.Admin().MoveVolume("big", "s2"); err != nil || !rep.Undone {
		t.Fatalf("undo: %+v %v", rep, err)
	}
	if info, err := admin.Admin().Examine("big"); err != nil || info.Moving != "" {
		t.Fatalf("after the undo: %+v %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(srvs[0].data, "data", "2")); err == nil {
		t.Fatal("s1 kept the copy of an undone move")
	}
	if got := testkit.ReadFile(t, dial(t, srvs[0].addr, "mem", 256<<20), "/big/f"); !bytes.Equal(got, data) {
		t.Fatal("the file's bytes differ after two failed moves")
	}
}

// moveAndKill runs hoard vol move of volume big to to (dialled to addr),
// calls kill once admin sees the move recorded, and returns the mover's
// outcome.
func moveAndKill(t *testing.T, admin *pathfs.FS, addr, to string, kill func(mover *exec.Cmd)) error {
	t.Helper()
	mover := exec.Command(hoardBin, "vol", "move", "big", "--to", to, "--server", addr, "--cache", "")
	var out bytes.Buffer
	mover.Stdout, mover.Stderr = &out, &out
	if err := mover.Start(); err != nil {
		t.Fatal(err)
	}
	if !poll.Until(10*time.Second, func() bool { info, err := admin.Admin().Examine("big"); return err == nil && info.Moving == to }) {
		mover.Process.Kill()
		mover.Wait()
		t.Fatalf("the move to %s was never recorded: %s", to, out.String())
	}
	kill(mover)
	err := mover.Wait()
	t.Logf("mover: %v: %s", err, out.String())
	return err
}

// Writes a client left to write-back, in a file it made under a
// directory delegation, are at the new server when the move is done:
// recalled, the directory's delegation comes back only once they are
// stored, since a moving volume grants the settled file none of its own.
func TestCellMoveWriteBack(t *testing.T) {
	_, srvs := cellOf3(t)
	admin := dial(t, srvs[2].addr, "mem", 16<<20)
	waitAlive(t, admin, 3)
	if _, err := admin.Admin().CreateVolumeOn("wb", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Admin().MountVolume("/wb", "wb"); err != nil {
		t.Fatal(err)
	}
	data := testkit.Pattern(64<<20, 5)
	testkit.WriteFile(t, dial(t, srvs[0].addr, "mem", 128<<20), "/wb/f", data) // closed, not synced
	if _, err := admin.Admin().MoveVolume("wb", "s2"); err != nil {
		t.Fatal(err)
	}
	if got := testkit.ReadFile(t, dial(t, srvs[2].addr, "mem", 128<<20), "/wb/f"); !bytes.Equal(got, data) {
		t.Fatalf("after the move: %d bytes, want the %d written before it", len(got), len(data))
	}
}
