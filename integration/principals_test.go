package integration

import (
	"errors"
	cadmin "github.com/hoardfs/hoard/client/admin"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/internal/testkit"
)

// The cell's principals are one registry: a name is one user's or one
// group's, a uid one user's, and ACL entries name principals by number.
// Each attack here once took another user's rights.

// A group named after a user is refused: bob cannot become alice by
// making a group "alice" and joining it. His own groups are "bob:NAME".
func TestSecurityGroupNamedAfterUser(t *testing.T) {
	w := newSecureWorld(t)
	writeAs(t, w.alice, "/alice/secret", "alice's secret")
	if err := w.bob.Admin().ChangeGroup(cadmin.GroupCreate, "alice", ""); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("bob makes a group named alice: %v, want it refused", err)
	}
	if err := w.bob.Admin().ChangeGroup(cadmin.GroupCreate, "staff", ""); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("bob makes an unprefixed group: %v, want it refused (admins only)", err)
	}
	// Not even an admin can make a group of a user's name.
	if err := w.admin.Admin().ChangeGroup(cadmin.GroupCreate, "alice", ""); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("an admin makes a group named alice: %v, want EEXIST", err)
	}
	// Through the CLI, as the attack was made.
	cmd := exec.Command(hoardBin, "group", "create", "alice", "--server", w.srv.addr, "--cache", "")
	cmd.Env = append(os.Environ(), "HOARD_TOKEN="+w.bobTok)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "bob:NAME") {
		t.Fatalf("hoard group create alice as bob: %v: %s; want it refused, naming bob's own prefix", err, out)
	}
	if err := w.bob.Admin().ChangeGroup(cadmin.GroupCreate, "bob:alice", ""); err != nil {
		t.Fatal(err)
	}
	if err := w.bob.Admin().ChangeGroup(cadmin.GroupAdd, "bob:alice", "bob"); err != nil {
		t.Fatal(err)
	}
	bob := dialAs(t, w.srv.addr, w.bobTok) // a new session: its identity is read anew
	if _, err := testkit.TryRead(bob, "/alice/secret"); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("bob in bob:alice reads alice's secret: %v", err)
	}
	if _, err := bob.Admin().SetACL("/alice", "bob", access.All); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("bob in bob:alice changes alice's ACL: %v", err)
	}
	// A group deleted and made again is a new principal: the old one's
	// entries do not come back to it.
	if err := w.alice.Admin().ChangeGroup(cadmin.GroupCreate, "alice:friends", ""); err != nil {
		t.Fatal(err)
	}
	mustACL(t, w.alice, "/alice", "alice:friends", access.Read|access.Lookup)
	if err := w.alice.Admin().ChangeGroup(cadmin.GroupDelete, "alice:friends", ""); err != nil {
		t.Fatal(err)
	}
	a, err := w.alice.Admin().GetACL("/alice")
	if err != nil {
		t.Fatal(err)
	}
	var old access.Entry
	for _, e := range a.Entries {
		if strings.HasPrefix(e.Who, "#") {
			old = e
		}
	}
	if old.ID == 0 || old.Rights != access.Read|access.Lookup {
		t.Fatalf("the deleted group's entry: %v", a.Entries)
	}
	if err := w.alice.Admin().ChangeGroup(cadmin.GroupCreate, "alice:friends", ""); err != nil {
		t.Fatal(err)
	}
	if a, _ := w.alice.Admin().GetACL("/alice"); strings.Contains(a.Entries.String(), "alice:friends") {
		t.Fatalf("a group made again took the old one's entry: %v", a.Entries)
	}
}

// A uid is one user's, and uid 0 nobody's but the admins': a token that
// names another user's uid, or uid 0 without the admin flag, is refused
// on every request, so its bearer owns nothing of anyone's.
func TestSecurityUIDIsNoOwnership(t *testing.T) {
	w := newSecureWorld(t)
	// alice's own directory, owned by her uid: its owner may change its
	// ACL.
	if err := w.alice.Mkdir("/alice/own", 0o755); err != nil {
		t.Fatal(err)
	}
	if st, err := w.admin.Lstat("/alice/own"); err != nil || st.UID != 1001 {
		t.Fatalf("alice's directory: %+v, %v", st, err)
	}
	for _, c := range []struct {
		user string
		uid  int
		say  string
	}{
		{"carol", 1001, "uid 1001 belongs to alice"},
		{"mallory", 0, "uid 0 is no user's"},
		{"alice", 1009, "alice has uid 1001"},
	} {
		tok := issue(t, c.user, c.uid)
		cl, err := cellDial(client.Options{Server: w.srv.addr, Token: tok, CacheSize: 16 << 20, DialTimeout: 5 * time.Second, RPCTimeout: 10 * time.Second,
			NoDelegations: true, NoDirDelegations: true})
		if err == nil {
			_, err = cl.Admin().SetACL("/alice/own", c.user, access.All)
			if err == nil {
				_, err = cl.Admin().SetACL("/", c.user, access.All)
			}
			cl.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.say) {
			t.Errorf("%s with uid %d: %v; want refused, saying %q", c.user, c.uid, err, c.say)
		}
	}
	if a, err := w.admin.Admin().GetACL("/"); err != nil || strings.Contains(a.Entries.String(), "mallory") {
		t.Fatalf("the root's ACL: %v, %v", a.Entries, err)
	}
	if a, err := w.admin.Admin().GetACL("/alice/own"); err != nil || strings.Contains(a.Entries.String(), "carol") {
		t.Fatalf("alice's ACL: %v, %v", a.Entries, err)
	}
}

// token issue --out writes the token readable by its owner alone, from
// the start, and will not replace a file; a client switched to plaintext
// by the environment says so loudly, as --insecure on a server does.
func TestTokenOutAndInsecureWarning(t *testing.T) {
	file := filepath.Join(t.TempDir(), "alice.token")
	if out, err := exec.Command(hoardBin, "token", "issue", "--cell", testCell.dir, "--user", "alice", "--uid", "1001", "--out", file).CombinedOutput(); err != nil {
		t.Fatalf("token issue --out: %v: %s", err, out)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() < 100 {
		t.Fatalf("the token file: %v, %v; want 0600 with a token in it", fi, err)
	}
	if out, err := exec.Command(hoardBin, "token", "issue", "--cell", testCell.dir, "--user", "alice", "--uid", "1001", "--out", file).CombinedOutput(); err == nil {
		t.Fatalf("token issue --out replaced a file: %s", out)
	}
	cmd := exec.Command(hoardBin, "ls", "/", "--server", "127.0.0.1:1")
	cmd.Env = append(os.Environ(), "HOARD_INSECURE=true")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "WARNING: insecure (from env HOARD_INSECURE)") {
		t.Fatalf("a client made insecure by the environment: %s; want a warning", out)
	}
}
