package integration

import (
	"bytes"
	"fmt"
	cadmin "github.com/hoardfs/hoard/client/admin"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/internal/poll"
)

// One root mount serves every local user with that user's own token, as
// AFS's cache manager does: a user's `hoard login` hands the token to the
// running mount, and what the cache holds is served to a user only as the
// server says that user may.

// localUser runs commands as a local user other than root.
type localUser struct {
	t   *testing.T
	uid int
	env []string
	bin string
}

// sharedDir is a directory every local user may read, holding a copy of
// the hoard binary and the cell's CA (the tests' own are root's alone).
// It also opens the way to the tests' temporary directories, whose parent
// is root's (0700), where the mount point is.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{hoardBin: "hoard", filepath.Join(testCell.dir, cell.CAFile): cell.CAFile} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// asUser is the local user uid, with a home of its own for its logins.
func asUser(t *testing.T, uid int, shared string) *localUser {
	t.Helper()
	home := t.TempDir()
	if err := os.Chown(home, uid, uid); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"HOARD_CA=" + filepath.Join(shared, cell.CAFile)}
	return &localUser{t: t, uid: uid, env: env, bin: filepath.Join(shared, "hoard")}
}

// run runs name with args as u, with stdin, and returns its output and
// its error.
func (u *localUser) run(stdin, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = u.env
	cmd.Dir = "/"
	cmd.Stdin = strings.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.uid)}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// login runs hoard login as u with token, and checks that it told the
// mount at dir.
func (u *localUser) login(token, dir string) {
	u.t.Helper()
	out, err := u.run(token, u.bin, "login")
	if err != nil || !strings.Contains(out, "told the mount at "+dir+"\n") {
		u.t.Fatalf("hoard login as uid %d: %v: %s", u.uid, err, out)
	}
}

// logout runs hoard logout as u, and checks that it told the mount at dir.
func (u *localUser) logout(dir string) {
	u.t.Helper()
	out, err := u.run("", u.bin, "logout")
	if err != nil || !strings.Contains(out, "told the mount at "+dir+"\n") {
		u.t.Fatalf("hoard logout as uid %d: %v: %s", u.uid, err, out)
	}
}

// reads checks that u reads want from file.
func (u *localUser) reads(file, want string) {
	u.t.Helper()
	if out, err := u.run("", "cat", file); err != nil || out != want {
		u.t.Fatalf("uid %d: cat %s: %v: %q, want %q", u.uid, file, err, out, want)
	}
}

// refused checks that u's command fails, saying permission is denied (or
// that the operation is not permitted: EPERM, for a chmod of another's
// file), and does not show secret.
func (u *localUser) refused(secret, name string, args ...string) {
	u.t.Helper()
	out, err := u.run("", name, args...)
	if err == nil || strings.Contains(out, secret) || !strings.Contains(out, "Permission denied") && !strings.Contains(out, "Operation not permitted") {
		u.t.Errorf("uid %d: %s %s: %v: %q, want permission denied", u.uid, name, strings.Join(args, " "), err, out)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("HOARD_REQUIRE_FUSE") == "1" {
			t.Fatal("a multi-user mount needs root (HOARD_REQUIRE_FUSE=1)")
		}
		t.Skip("a multi-user mount needs root")
	}
}

// multiUserWorld is a secure world with a root mount of the admin's
// token, multi-user, and local users for bob (uid 1002) and alice (1001).
func multiUserWorld(t *testing.T) (*secureWorld, *mountProc, *localUser, *localUser, string) {
	t.Helper()
	needRoot(t)
	w := newSecureWorld(t)
	shared := sharedDir(t)
	// The mode bits let everyone in: the ACLs must keep alice out.
	for _, p := range []string{"/bob", "/pub"} {
		if err := w.admin.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	m := startMount(t, w.srv, t.TempDir(), mountDebug()...) // HOARD_TOKEN: the admin's
	bob, alice := asUser(t, 1002, shared), asUser(t, 1001, shared)
	bob.login(w.bobTok, m.dir)
	alice.login(w.aliceTok, m.dir)
	return w, m, bob, alice, shared
}

func TestMultiUserMount(t *testing.T) {
	w, m, bob, alice, shared := multiUserWorld(t)
	dir := filepath.Join(m.dir, "bob")
	secret := filepath.Join(dir, "secret")
	const text = "bob's secret"
	// Bob's reads fill the cache: the file's bytes, the directory's
	// listing, and the kernel's names and attributes.
	bob.reads(secret, text)
	if out, err := bob.run("", "ls", dir); err != nil || out != "secret\n" {
		t.Fatalf("bob lists his directory: %v: %q", err, out)
	}
	bob.reads(secret, text)
	// Alice gets none of it, cached or not.
	for i := 0; i < 2; i++ {
		alice.refused(text, "cat", secret)
		alice.refused(text, "ls", dir)
		alice.refused(text, "sh", "-c", "echo planted >> "+secret)
		alice.refused(text, "sh", "-c", "echo planted > "+filepath.Join(dir, "planted"))
		alice.refused(text, "rm", "-f", secret)
		alice.refused(text, "chmod", "777", secret)
	}
	// Nor does a local user who never logged in: anonymous.
	carol := asUser(t, 1003, shared)
	carol.refused(text, "cat", secret)
	carol.refused(text, "ls", dir)
	// A new token is a new user: nothing learnt under the old one is used.
	carol.login(w.bobTok, m.dir)
	carol.reads(secret, text)
	carol.login(w.aliceTok, m.dir)
	carol.refused(text, "cat", secret)
	carol.refused(text, "ls", dir)
	// A token another cell signed is refused by the mount, which keeps
	// the one it had.
	other := filepath.Join(t.TempDir(), "other")
	if out, err := exec.Command(hoardBin, "cell", "init", "--dir", other, "--name", "test", "--admin", "bob").CombinedOutput(); err != nil {
		t.Fatalf("a second cell: %v: %s", err, out)
	}
	forged, err := os.ReadFile(filepath.Join(other, cell.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := carol.run(string(forged), carol.bin, "login"); err != nil || !strings.Contains(out, "note: the mount at "+m.dir+": login: token not signed by this cell") || strings.Contains(out, "told the mount at "+m.dir) {
		t.Fatalf("a forged token's login: %v: %s", err, out)
	}
	carol.refused(text, "cat", secret)
	bob.reads(secret, text)
	// Bob logged out is anonymous at once.
	bob.logout(m.dir)
	bob.refused(text, "cat", secret)
	bob.refused(text, "ls", dir)
	// Root acts with the mount's own token, the admin's.
	if got, err := os.ReadFile(secret); err != nil || string(got) != text {
		t.Fatalf("root (the admin) reads %q, %v", got, err)
	}
	if st, err := w.admin.Lstat("/bob/secret"); err != nil || st.Size != uint64(len(text)) || st.Mode&0o777 != 0o666 {
		t.Fatalf("bob's secret changed: %+v, %v", st, err)
	}
	if ents, err := w.admin.ReadDir("/bob"); err != nil || len(ents) != 1 {
		t.Fatalf("bob's directory changed: %v, %v", ents, err)
	}
}

// An ACL change takes away one user's rights through the mount at once,
// even with the file cached and another user's promise on it renewed, and
// leaves another user's.
func TestMultiUserACLRevoked(t *testing.T) {
	w, m, bob, alice, _ := multiUserWorld(t)
	doc := filepath.Join(m.dir, "pub", "doc")
	const text = "for everyone"
	for _, u := range []*localUser{alice, bob, alice, bob} {
		u.reads(doc, text)
	}
	mustACL(t, w.admin, "/pub", "bob", access.Read|access.Lookup)
	mustACL(t, w.admin, "/pub", access.AuthUser, 0)
	// Bob first: his reads get a new promise, and fill the cache again.
	bob.reads(doc, text)
	alice.refused(text, "cat", doc)
	alice.refused(text, "ls", filepath.Join(m.dir, "pub"))
	bob.reads(doc, text)
	if out, err := bob.run("", "ls", filepath.Join(m.dir, "pub")); err != nil || out != "doc\n" {
		t.Fatalf("bob lists /pub: %v: %q", err, out)
	}
	alice.refused(text, "cat", doc)
	// Given back, alice reads again.
	mustACL(t, w.admin, "/pub", "alice", access.Read|access.Lookup)
	bob.reads(doc, text)
	alice.reads(doc, text)
}

// hoard cache flush on a shared mount is per user, as the rest of the
// mount is: a user sees and stores only the writes they made, the
// mount's owner every user's.
func TestMultiUserFlushIsPerUser(t *testing.T) {
	_, m, bob, alice, _ := multiUserWorld(t)
	file := filepath.Join(m.dir, "bob", "draft")
	if out, err := bob.run("bob's unstored draft", "sh", "-c", "cat > "+file); err != nil {
		t.Fatalf("bob writes: %v: %s", err, out)
	}
	// (A path alice may write: the flush is a setxattr, which the kernel
	// lets only a writer make.)
	out, err := alice.run("", alice.bin, "cache", "flush", filepath.Join(m.dir, "pub"))
	if err != nil || strings.Contains(out, "draft") || !strings.Contains(out, "of 0 files") {
		t.Fatalf("alice's flush: %v: %q; want nothing of bob's", err, out)
	}
	if out, _ := run(t, "cache", "flush", m.dir); !strings.Contains(out, "/bob/draft") {
		t.Fatalf("the mount owner's flush: %q; want bob's draft stored", out)
	}
}

// A revocation, a group deleted and a token expired reach the mount's
// cache at once: a user's rights learnt there are forgotten when the
// cell's registry takes some away (as an ACL change breaks a
// directory's promises), and an expired token gets nothing cached. The
// mount once served them 5-30 s more, bounded only by the promise.
func TestMultiUserRevocationReachesMount(t *testing.T) {
	w, m, bob, alice, shared := multiUserWorld(t)
	doc, secret := filepath.Join(m.dir, "pub", "doc"), filepath.Join(m.dir, "bob", "secret")
	const docText, secretText = "for everyone", "bob's secret"
	// alice reads bob's secret through a group.
	if err := w.admin.Admin().ChangeGroup(cadmin.GroupCreate, "readers", ""); err != nil {
		t.Fatal(err)
	}
	if err := w.admin.Admin().ChangeGroup(cadmin.GroupAdd, "readers", "alice"); err != nil {
		t.Fatal(err)
	}
	mustACL(t, w.admin, "/bob", "readers", access.Read|access.Lookup)
	// A token that expires soon: dave's.
	daveTok := issue(t, "dave", 1004, "--expires", "6s")
	dave := asUser(t, 1004, shared)
	dave.login(daveTok, m.dir)
	for range 2 {
		bob.reads(doc, docText)
		alice.reads(secret, secretText)
		dave.reads(doc, docText)
	}
	gone := func(u *localUser, file, text string, within time.Duration, say string) {
		t.Helper()
		poll.Wait(t, within, fmt.Sprintf("uid %d refused %s", u.uid, file), func() bool {
			out, err := u.run("", "cat", file)
			return err != nil && !strings.Contains(out, text)
		})
		if out, err := u.run("", "cat", file); err == nil || !strings.Contains(out, say) {
			t.Errorf("uid %d: cat %s: %v: %q, want %q", u.uid, file, err, out, say)
		}
	}
	claims, err := cell.Inspect(w.bobTok)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.admin.Admin().RevokeToken(claims.ID, claims.Expires); err != nil {
		t.Fatal(err)
	}
	gone(bob, doc, docText, 3*time.Second, "Permission denied")
	if err := w.admin.Admin().ChangeGroup(cadmin.GroupDelete, "readers", ""); err != nil {
		t.Fatal(err)
	}
	gone(alice, secret, secretText, 3*time.Second, "Permission denied")
	alice.reads(doc, docText) // her own rights stand
	exp, _ := cell.Inspect(daveTok)
	time.Sleep(time.Until(exp.Expires))
	gone(dave, doc, docText, time.Second, "Key has expired")
}
