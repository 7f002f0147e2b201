package principal

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hoardfs/hoard/access"
)

var t0 = time.Unix(1_800_000_000, 0)

// commit applies c to s as a store would, checking its conditions.
func commit(t *testing.T, s *State, c Change) {
	t.Helper()
	if ok, _ := s.Commit(c); !ok {
		t.Fatalf("change %+v does not hold", c)
	}
}

func bind(t *testing.T, s *State, name string, uid uint32, admin bool) Principal {
	t.Helper()
	p, c, err := s.Bind(name, uid, admin, t0)
	if err != nil {
		t.Fatalf("bind %s uid %d: %v", name, uid, err)
	}
	commit(t, s, c)
	return p
}

func wantErr(t *testing.T, what string, err error, errno syscall.Errno, say string) {
	t.Helper()
	if !errors.Is(err, errno) || !strings.Contains(err.Error(), say) {
		t.Errorf("%s: %v; want %v saying %q", what, err, errno, say)
	}
}

// A token's name and uid bind at first sight; a uid is then one name's,
// and a name keeps its uid. Reserved uids are no user's.
func TestBind(t *testing.T) {
	var s State
	alice := bind(t, &s, "alice", 2001, false)
	if alice.ID < access.FirstID || alice.Kind != User || alice.UID != 2001 {
		t.Fatalf("alice: %+v", alice)
	}
	if again := bind(t, &s, "alice", 2001, false); again.ID != alice.ID {
		t.Fatalf("alice again: %+v", again)
	}
	_, c, err := s.Bind("carol", 2001, false, t0)
	wantErr(t, "a second name for alice's uid", err, syscall.EPERM, "uid 2001 belongs to alice")
	if len(c.Put) != 0 {
		t.Fatalf("a refused bind changes %v", c.Put)
	}
	_, _, err = s.Bind("alice", 2002, false, t0)
	wantErr(t, "alice with another uid", err, syscall.EPERM, "alice has uid 2001")
	_, _, err = s.Bind("mallory", 0, false, t0)
	wantErr(t, "uid 0 without the admin flag", err, syscall.EPERM, "uid 0 is no user's")
	_, _, err = s.Bind("mallory", NobodyUID, false, t0)
	wantErr(t, "nobody's uid", err, syscall.EPERM, "uid 65534 is no user's")
	_, _, err = s.Bind("a:b", 3000, false, t0)
	wantErr(t, "a user name with ':'", err, syscall.EINVAL, "':' is for groups")
	_, _, err = s.Bind(access.AnyUser, 3000, false, t0)
	wantErr(t, "a system name", err, syscall.EINVAL, "")

	// Admins share root's uid 0 and hold no uid key; a uid of their own
	// is theirs as any user's is.
	admin := bind(t, &s, "admin", 0, true)
	ops := bind(t, &s, "ops", 0, true)
	if admin.ID == ops.ID || s.Value(uidKey(0)) != "" {
		t.Fatalf("admins: %+v %+v, uid key 0 %q", admin, ops, s.Value(uidKey(0)))
	}
	_, _, err = s.Bind("root2", 2001, true, t0)
	wantErr(t, "an admin with alice's uid", err, syscall.EPERM, "belongs to alice")
	// A registered user's token with the admin flag and uid 0 is theirs.
	if p := bind(t, &s, "alice", 0, true); p.ID != alice.ID {
		t.Fatalf("alice as an admin: %+v", p)
	}
	// Ids are never given twice.
	seen := map[access.ID]bool{}
	for _, p := range s.All(User) {
		if seen[p.ID] {
			t.Fatalf("id %d given twice", p.ID)
		}
		seen[p.ID] = true
	}
}

// A change computed from a copy that another change overtook does not
// hold: two servers binding one uid to two names cannot both succeed.
func TestChangesCompare(t *testing.T) {
	var s State
	bind(t, &s, "alice", 2001, false)
	_, c1, _ := s.Bind("bob", 2002, false, t0)
	_, c2, _ := s.Bind("carol", 2002, false, t0)
	_, c3, _ := s.Bind("dave", 2003, false, t0)
	commit(t, &s, c1)
	if s.Holds(c2) {
		t.Fatal("carol's bind of bob's uid holds after bob's")
	}
	if s.Holds(c3) {
		t.Fatal("a change that read the old next id holds after another took it")
	}
	g, cg, _ := s.CreateGroup(Caller{ID: 1, Name: "alice"}, "alice:x", t0)
	commit(t, &s, cg)
	ca, _ := s.SetMember(Caller{ID: g.Owner, Name: "alice"}, "alice:x", "bob", true)
	cd, _ := s.DeleteGroup(Caller{ID: g.Owner, Name: "alice"}, "alice:x")
	commit(t, &s, ca)
	if s.Holds(cd) {
		t.Fatal("a delete computed before a member was added holds after it")
	}
}

// A user's groups are theirs by name (owner:name); only admins make
// others; no group takes a user's name; each change is its owner's or
// an admin's.
func TestGroupRules(t *testing.T) {
	var s State
	alice := bind(t, &s, "alice", 2001, false)
	bob := bind(t, &s, "bob", 2002, false)
	admin := bind(t, &s, "admin", 0, true)
	asAlice := Caller{ID: alice.ID, Name: "alice"}
	asBob := Caller{ID: bob.ID, Name: "bob"}
	asAdmin := Caller{ID: admin.ID, Name: "admin", Admin: true}

	for _, c := range []struct {
		by   Caller
		name string
		err  syscall.Errno
	}{
		{asBob, "alice", syscall.EPERM},           // the critical one: a group named after a user
		{asBob, "staff", syscall.EPERM},           // unprefixed: admins only
		{asBob, "alice:friends", syscall.EPERM},   // another user's prefix
		{asBob, "bob:", syscall.EINVAL},           // no name
		{asBob, ":x", syscall.EINVAL},             // no owner
		{asBob, "bob:a:b", syscall.EINVAL},        // two colons
		{asBob, "system:x", syscall.EINVAL},       // the system space
		{asAdmin, access.AnyUser, syscall.EINVAL}, // a system group
		{asAdmin, "alice", syscall.EEXIST},        // a user's name, even for an admin
		{asBob, "bad name:x", syscall.EINVAL},
	} {
		_, _, err := s.CreateGroup(c.by, c.name, t0)
		if !errors.Is(err, c.err) {
			t.Errorf("%s creates %q: %v, want %v", c.by.Name, c.name, err, c.err)
		}
	}
	g, c, err := s.CreateGroup(asBob, "bob:friends", t0)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, &s, c)
	if g.Owner != bob.ID {
		t.Fatalf("bob:friends owned by %d", g.Owner)
	}
	_, c, err = s.CreateGroup(asAdmin, "staff", t0)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, &s, c)
	// A user cannot be registered under a group's name.
	_, _, err = s.Bind("staff", 3000, false, t0)
	wantErr(t, "a user named after a group", err, syscall.EPERM, "a group's")

	_, err = s.SetMember(asAlice, "bob:friends", "alice", true)
	wantErr(t, "alice adds herself to bob's group", err, syscall.EPERM, "bob's")
	_, err = s.SetMember(asBob, "staff", "bob", true)
	wantErr(t, "bob adds himself to an admin's group", err, syscall.EPERM, "")
	_, err = s.SetMember(asBob, "bob:friends", "nobody-yet", true)
	wantErr(t, "an unregistered member", err, syscall.ENOENT, "not in the cell's registry")
	_, err = s.SetMember(asBob, "bob:friends", "staff", true)
	wantErr(t, "a group as a member", err, syscall.ENOENT, "")
	_, err = s.SetMember(asAdmin, access.AuthUser, "bob", true)
	wantErr(t, "a system group's members", err, syscall.EPERM, "system groups")
	c, err = s.SetMember(asBob, "bob:friends", "alice", true)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, &s, c)
	if gs := s.GroupsOf(alice.ID); !slices.Equal(gs, []access.ID{g.ID}) {
		t.Fatalf("alice's groups: %v", gs)
	}
	if c, err := s.SetMember(asBob, "bob:friends", "alice", true); err != nil || len(c.Put) != 0 {
		t.Fatalf("adding a member twice: %v, %v", c, err)
	}
	_, err = s.DeleteGroup(asAlice, "bob:friends")
	wantErr(t, "alice deletes bob's group", err, syscall.EPERM, "")
	c, err = s.DeleteGroup(asBob, "bob:friends")
	if err != nil {
		t.Fatal(err)
	}
	commit(t, &s, c)
	if gs := s.GroupsOf(alice.ID); len(gs) != 0 {
		t.Fatalf("alice is still in %v", gs)
	}
	// Made again, it is a new principal: the old one's ACL entries are
	// not its.
	g2, c, err := s.CreateGroup(asBob, "bob:friends", t0)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, &s, c)
	if g2.ID == g.ID {
		t.Fatalf("a group made again got the old id %d", g.ID)
	}
	if s.Name(g.ID) != "#"+formatID(g.ID) {
		t.Fatalf("a deleted group's name: %q", s.Name(g.ID))
	}
}

func formatID(id access.ID) string { return strconv.FormatUint(uint64(id), 10) }

// One user can own, and be put in, only so many groups.
func TestGroupBounds(t *testing.T) {
	var s State
	bob := bind(t, &s, "bob", 2002, false)
	victim := bind(t, &s, "victim", 2003, false)
	asBob := Caller{ID: bob.ID, Name: "bob"}
	for i := range MaxOwned {
		_, c, err := s.CreateGroup(asBob, "bob:g"+formatID(access.ID(i)), t0)
		if err != nil {
			t.Fatal(err)
		}
		commit(t, &s, c)
	}
	_, _, err := s.CreateGroup(asBob, "bob:one-more", t0)
	wantErr(t, "past the groups a user may own", err, syscall.EDQUOT, "owns")
	admin := bind(t, &s, "admin", 0, true)
	asAdmin := Caller{ID: admin.ID, Name: "admin", Admin: true}
	for i := range MaxMembership {
		name := "g" + formatID(access.ID(i))
		_, c, err := s.CreateGroup(asAdmin, name, t0)
		if err != nil {
			t.Fatal(err)
		}
		commit(t, &s, c)
		c, err = s.SetMember(asAdmin, name, "victim", true)
		if err != nil {
			t.Fatal(err)
		}
		commit(t, &s, c)
	}
	_, c, _ := s.CreateGroup(asAdmin, "last", t0)
	commit(t, &s, c)
	_, err = s.SetMember(asAdmin, "last", "victim", true)
	wantErr(t, "past the groups a user may be in", err, syscall.EMLINK, "victim is in")
	if n := len(s.GroupsOf(victim.ID)); n != MaxMembership {
		t.Fatalf("victim in %d groups", n)
	}
}

// Revocations hold until the token would have expired, and are pruned
// then.
func TestRevoke(t *testing.T) {
	var s State
	c, err := s.Revoke("abc", t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	commit(t, &s, c)
	if !s.Revoked("abc", t0) || s.Revoked("abd", t0) || s.Revoked("abc", t0.Add(time.Hour)) {
		t.Fatal("revocation not as recorded")
	}
	if c := s.Prune(t0); len(c.Delete) != 0 {
		t.Fatalf("pruned an unexpired revocation: %v", c.Delete)
	}
	commit(t, &s, s.Prune(t0.Add(2*time.Hour)))
	if _, ok := s.revoked["abc"]; ok {
		t.Fatal("an expired revocation was not pruned")
	}
	for _, bad := range []string{"", "a/b", strings.Repeat("x", 65)} {
		if _, err := s.Revoke(bad, t0); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Revoke(%q): %v", bad, err)
		}
	}
}

// A memory registry runs the rules with their commits, identifies
// tokens with their groups, and tells its watchers of every change.
func TestRegistry(t *testing.T) {
	r := New()
	changes, narrowed := 0, 0
	r.OnChange(func(n bool) {
		changes++
		if n {
			narrowed++
		}
	})
	ctx := context.Background()
	bob, err := r.Identify(ctx, "t1", "bob", 2002, false)
	if err != nil || bob.ID < access.FirstID || bob.UID != 2002 || bob.User != "bob" {
		t.Fatalf("bob: %+v, %v", bob, err)
	}
	if _, err := r.Identify(ctx, "t2", "carol", 2002, false); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("carol with bob's uid: %v", err)
	}
	by := Caller{ID: bob.ID, Name: "bob"}
	if err := r.CreateGroup(ctx, by, "bob:x"); err != nil {
		t.Fatal(err)
	}
	if err := r.SetMember(ctx, by, "bob:x", "bob", true); err != nil {
		t.Fatal(err)
	}
	bob, _ = r.Identify(ctx, "t1", "bob", 2002, false)
	g, _ := r.Lookup("bob:x")
	if !slices.Equal(bob.GroupIDs, []access.ID{g.ID}) || !slices.Equal(bob.Groups, []string{"bob:x"}) {
		t.Fatalf("bob's groups: %+v", bob)
	}
	if narrowed != 0 {
		t.Fatalf("registering, making a group and adding to it narrowed rights %d times", narrowed)
	}
	if err := r.Revoke(ctx, "t1", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if narrowed != 1 {
		t.Fatalf("a revocation narrowed rights %d times, want 1", narrowed)
	}
	if _, err := r.Identify(ctx, "t1", "bob", 2002, false); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("a revoked token: %v", err)
	}
	if changes < 4 {
		t.Fatalf("%d changes told", changes)
	}
	if err := r.SetMember(ctx, by, "bob:x", "bob", false); err != nil || narrowed != 2 {
		t.Fatalf("a member removed: %v; narrowed %d times, want 2", err, narrowed)
	}
	if err := r.DeleteGroup(ctx, by, "bob:x"); err != nil || narrowed != 3 {
		t.Fatalf("a group deleted: %v; narrowed %d times, want 3", err, narrowed)
	}
	if _, err := r.Create(ctx, "bob", 3000); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("creating bob again: %v", err)
	}
}

// Names and keys from anywhere never panic the rules or the copy, and
// whatever a change writes, the copy reads back the same.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"alice", "alice:friends", "system:anyuser", "a:b:c", ":", "-x", "x/y", "é"} {
		f.Add(s, uint32(1001), false)
	}
	f.Fuzz(func(t *testing.T, name string, uid uint32, admin bool) {
		var s State
		p, c, err := s.Bind(name, uid, admin, t0)
		if err != nil {
			return
		}
		if CheckUserName(name) != nil || strings.ContainsRune(name, ':') {
			t.Fatalf("bound a bad user name %q", name)
		}
		commit(t, &s, c)
		if got, ok := s.Lookup(name); !ok || got.ID != p.ID || got.UID != p.UID {
			t.Fatalf("%q bound as %+v, read back as %+v", name, p, got)
		}
		by := Caller{ID: p.ID, Name: name, Admin: admin}
		g, c, err := s.CreateGroup(by, name+":"+name, t0)
		if err == nil {
			commit(t, &s, c)
			if got, ok := s.Lookup(g.Name); !ok || got.Owner != p.ID {
				t.Fatalf("group %q read back as %+v", g.Name, got)
			}
		}
		s.Apply(Prefix+idKeys+name, []byte(name), false)
		s.Apply(Prefix+revokedKeys+name, []byte(name), false)
		s.Apply(Prefix+nextKey, []byte(name), false)
	})
}
