package access

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestRightsString(t *testing.T) {
	for _, c := range []struct {
		r    Rights
		want string
	}{
		{0, "none"},
		{Read, "r"},
		{Lookup, "l"},
		{Read | Lookup, "rl"},
		{Administer | Read, "ra"},
		{Lock | Insert, "ik"},
		{All &^ Administer, "rlidwk"},
		{All, "rlidwka"},
		{All | 0x80, "rlidwka"},
		{0x80, "none"},
	} {
		if got := c.r.String(); got != c.want {
			t.Errorf("Rights(%#x).String() = %q, want %q", uint8(c.r), got, c.want)
		}
	}
}

func TestParseRights(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Rights
	}{
		{"r", Read},
		{"l", Lookup},
		{"i", Insert},
		{"d", Delete},
		{"w", Write},
		{"k", Lock},
		{"a", Administer},
		{"akwdilr", All},
		{"rr", Read},
		{"lr", Read | Lookup},
		{"read", Read | Lookup},
		{"write", Read | Lookup | Insert | Delete | Write | Lock},
		{"all", All},
		{"none", 0},
	} {
		got, err := ParseRights(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseRights(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "x", "rlx", "R", "rl ", "Read", "al l", "rlidwka\x00"} {
		_, err := ParseRights(in)
		if err == nil {
			t.Errorf("ParseRights(%q) accepted", in)
			continue
		}
		if !errors.Is(err, syscall.EINVAL) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseRights(%q): %v: want one line wrapping EINVAL", in, err)
		}
	}
	if _, err := ParseRights("rlq"); err == nil || !strings.Contains(err.Error(), "'q'") {
		t.Errorf("ParseRights(\"rlq\"): %v: should name 'q'", err)
	}
}

// Every set of rights survives String then ParseRights.
func TestRightsRoundTrip(t *testing.T) {
	for r := Rights(0); r <= All; r++ {
		got, err := ParseRights(r.String())
		if err != nil || got != r {
			t.Fatalf("%#x: %q parsed as %v, %v", uint8(r), r.String(), got, err)
		}
	}
}

func TestCheckName(t *testing.T) {
	good := []string{"alice", "a", "bob@EXAMPLE.ORG", "alice:friends", "x-y_z.1",
		strings.Repeat("n", 64), AnyUser, AuthUser, Administrators, "a-"}
	bad := []string{"", "-alice", strings.Repeat("n", 65), "al ice", "al/ice", "é", "a\x00",
		"system:", "system:foo", "system:anyusers", "a,b"}
	for _, n := range good {
		if err := CheckName(n); err != nil {
			t.Errorf("CheckName(%q): %v", n, err)
		}
	}
	for _, n := range bad {
		err := CheckName(n)
		if err == nil {
			t.Errorf("CheckName(%q) accepted", n)
		} else if !errors.Is(err, syscall.EINVAL) {
			t.Errorf("CheckName(%q): %v does not wrap EINVAL", n, err)
		}
	}
}

// Principals of the ACL tests, as the registry would number them.
const (
	alice ID = FirstID + iota
	bob
	carol
	dave
	friends // alice:friends
	staff
)

func TestACLSetGet(t *testing.T) {
	var a ACL
	b := a.Set(bob, Read|Lookup)
	if len(a) != 0 {
		t.Fatal("Set changed its receiver")
	}
	c := b.Set(alice, All).Set(carol, Lookup).Set(bob, Write)
	want := ACL{{ID: alice, Rights: All}, {ID: bob, Rights: Write}, {ID: carol, Rights: Lookup}}
	if !slices.Equal(c, want) {
		t.Fatalf("got %v, want %v", c, want)
	}
	if b.Get(bob) != Read|Lookup {
		t.Fatalf("Set changed an earlier ACL: %v", b)
	}
	d := c.Set(bob, 0)
	if !slices.Equal(d, ACL{{ID: alice, Rights: All}, {ID: carol, Rights: Lookup}}) || !slices.Equal(c, want) {
		t.Fatalf("removing bob: %v (from %v)", d, c)
	}
	if d.Set(dave, 0); len(d) != 2 {
		t.Fatal("removing a missing entry changed the ACL")
	}
	for who, r := range map[ID]Rights{alice: All, bob: Write, carol: Lookup, dave: 0, 0: 0} {
		if got := c.Get(who); got != r {
			t.Errorf("Get(%d) = %v, want %v", who, got, r)
		}
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if got := c.Set(dave, 0x80); len(got) != len(c) {
		t.Fatalf("rights outside All made an entry: %v", got)
	}
	if got := c.String(); got != "#1000 rlidwka, #1001 w, #1002 l" {
		t.Fatalf("String: %q", got)
	}
}

func TestACLCheck(t *testing.T) {
	for name, a := range map[string]ACL{
		"unsorted":   {{ID: bob, Rights: Read}, {ID: alice, Rights: Read}},
		"duplicate":  {{ID: alice, Rights: Read}, {ID: alice, Rights: Write}},
		"no rights":  {{ID: alice}},
		"extra bits": {{ID: alice, Rights: 0x80 | Read}},
		"id 0":       {{ID: 0, Rights: Read}},
		"too many":   manyEntries(MaxEntries + 1),
	} {
		if err := a.Check(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s: Check = %v, want EINVAL", name, err)
		}
		if _, err := DecodeACL(a.Encode()); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if err := manyEntries(MaxEntries).Check(); err != nil {
		t.Fatal(err)
	}
}

func manyEntries(n int) ACL {
	var a ACL
	for i := range n {
		a = append(a, Entry{ID: FirstID + ID(i), Rights: Read})
	}
	return a
}

func TestEncodeDecode(t *testing.T) {
	for _, a := range []ACL{{}, DefaultACL(), manyEntries(MaxEntries),
		{{ID: AnyUserID, Rights: Lookup}, {ID: ^ID(0), Rights: All}}} {
		b := a.Encode()
		got, err := DecodeACL(b)
		if err != nil || !slices.Equal(got, a) {
			t.Fatalf("%v: decoded as %v, %v", a, got, err)
		}
	}
	for _, b := range [][]byte{nil, {}, {3}, {2, 1}, {2, 1, 0, 0, 0}, {2, 0, 0, 0, 0, 9}, {2, 1, 0, 0, 0, 0}} {
		if a, err := DecodeACL(b); err == nil {
			t.Errorf("%q decoded as %v", b, a)
		}
	}
}

// An ACL of the first form, which named its principals, is refused by
// DecodeACL with ErrNamedACL and read by NamedACL, for its migration.
func TestNamedACL(t *testing.T) {
	old := []byte{1, byte(Read | Lookup), 5, 'a', 'l', 'i', 'c', 'e', byte(All), 21}
	old = append(old, Administrators...)
	if _, err := DecodeACL(old); !errors.Is(err, ErrNamedACL) {
		t.Fatalf("DecodeACL of a named ACL: %v", err)
	}
	got, err := NamedACL(old)
	want := []Named{{"alice", Read | Lookup}, {Administrators, All}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("NamedACL = %v, %v; want %v", got, err, want)
	}
	for _, b := range [][]byte{nil, {2}, {1, 1}, {1, 1, 5, 'a'}, {1, 1, 3, 'a', ' ', 'b'}} {
		if a, err := NamedACL(b); err == nil {
			t.Errorf("%q read as %v", b, a)
		}
	}
}

func TestDefaultACL(t *testing.T) {
	d := DefaultACL()
	if err := d.Check(); err != nil {
		t.Fatal(err)
	}
	if d.Get(AdministratorsID) != All || d.Get(AuthUserID) != Read|Lookup || len(d) != 2 {
		t.Fatalf("default ACL %v", d)
	}
}

func TestIdentity(t *testing.T) {
	if !Anonymous().Anonymous() || Anonymous().String() != "anonymous" {
		t.Fatal("Anonymous is not anonymous")
	}
	id := Identity{User: "alice", UID: 7}
	if id.Anonymous() || id.String() != "alice" {
		t.Fatalf("%v", id)
	}
}

func TestOf(t *testing.T) {
	a := ACL{}.
		Set(AnyUserID, Lookup).
		Set(AuthUserID, Read).
		Set(alice, Write).
		Set(friends, Insert).
		Set(staff, Delete|Lock).
		Set(bob, Administer)
	for _, c := range []struct {
		name string
		id   Identity
		want Rights
	}{
		{"anonymous: anyuser only", Anonymous(), Lookup},
		{"anonymous with groups: anyuser only", Identity{GroupIDs: []ID{staff}}, Lookup},
		{"anonymous with admin flag: anyuser only", Identity{Admin: true}, Lookup},
		{"stranger: anyuser and authuser", Identity{User: "zed", ID: dave}, Lookup | Read},
		{"user entry", Identity{User: "alice", ID: alice}, Lookup | Read | Write},
		{"user and groups", Identity{User: "alice", ID: alice, GroupIDs: []ID{friends, staff}}, Lookup | Read | Write | Insert | Delete | Lock},
		{"unsorted groups still count", Identity{User: "zed", ID: dave, GroupIDs: []ID{staff, friends}}, Lookup | Read | Insert | Delete | Lock},
		{"unknown group", Identity{User: "zed", ID: dave, GroupIDs: []ID{9999}}, Lookup | Read},
		{"a name is nothing: the number is", Identity{User: "bob", ID: dave}, Lookup | Read},
		{"no number: no entry of one's own", Identity{User: "bob"}, Lookup | Read},
		{"admin", Identity{User: "root", Admin: true}, All},
	} {
		if got := a.Of(c.id); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if got := (ACL{}).Of(Identity{User: "alice", ID: alice}); got != 0 {
		t.Errorf("empty ACL grants %v", got)
	}
	if got := (ACL{}).Of(Identity{User: "root", Admin: true}); got != All {
		t.Errorf("empty ACL grants an admin %v", got)
	}
	if got := DefaultACL().Of(Anonymous()); got != 0 {
		t.Errorf("default ACL grants anonymous %v", got)
	}
	if got := DefaultACL().Of(Identity{User: "x", ID: dave}); got != Read|Lookup {
		t.Errorf("default ACL grants a user %v", got)
	}
}

func TestEffective(t *testing.T) {
	alice := Identity{User: "alice", UID: 100}
	bob := Identity{User: "bob", UID: 200}
	anon := Anonymous() // UID 0
	admin := Identity{User: "root", UID: 1, Admin: true}
	rlw := Read | Lookup | Write
	for _, c := range []struct {
		name string
		id   Identity
		dir  Rights
		obj  Object
		want Rights
	}{
		{"file 0644 passes all", bob, All &^ Administer, Object{Mode: 0o644, UID: 100}, All &^ Administer},
		{"file without 0400 loses r", bob, rlw, Object{Mode: 0o244, UID: 100}, Lookup | Write},
		{"file without 0200 loses w", bob, rlw, Object{Mode: 0o444, UID: 100}, Read | Lookup},
		{"file 0000 loses r and w", bob, All, Object{Mode: 0, UID: 100}, All &^ (Read | Write)},
		{"owner bits restrict the owner too", alice, rlw, Object{Mode: 0o044, UID: 100}, Lookup},
		{"group and other bits do not matter", bob, rlw, Object{Mode: 0o600, UID: 100}, rlw},
		{"mode bits grant nothing", bob, 0, Object{Mode: 0o777, UID: 100}, 0},
		{"file owner gets no implicit a", alice, Read, Object{Mode: 0o644, UID: 100}, Read},
		{"dir: mode bits do not restrict", bob, rlw, Object{Dir: true, Mode: 0, UID: 100}, rlw},
		{"dir owner gets a", alice, Lookup, Object{Dir: true, Mode: 0o755, UID: 100}, Lookup | Administer},
		{"dir non-owner gets no a", bob, Lookup, Object{Dir: true, Mode: 0o755, UID: 100}, Lookup},
		{"anonymous owns nothing, even uid 0", anon, Lookup, Object{Dir: true, Mode: 0o755, UID: 0}, Lookup},
		{"anonymous on a file", anon, Read | Lookup, Object{Mode: 0o644}, Read | Lookup},
		{"admin on a 0000 file", admin, 0, Object{Mode: 0}, All},
		{"admin on a dir", admin, 0, Object{Dir: true}, All},
		{"bits outside All dropped", bob, 0xff &^ Administer, Object{Dir: true, UID: 100}, All &^ Administer},
	} {
		if got := Effective(c.id, c.dir, c.obj); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func FuzzDecodeACL(f *testing.F) {
	f.Add([]byte(nil))
	f.Add([]byte{1})
	f.Add(DefaultACL().Encode())
	f.Add(manyEntries(MaxEntries).Encode())
	f.Add([]byte{1, 3, 1, 'a', 3, 1, 'a'})
	f.Add([]byte{1, 0xff, 0xff})
	f.Add([]byte{2, 3, 0, 0, 3, 232})
	f.Fuzz(func(t *testing.T, b []byte) {
		NamedACL(b) // never panics
		a, err := DecodeACL(b)
		if err != nil {
			return
		}
		if err := a.Check(); err != nil {
			t.Fatalf("%q decoded to a bad ACL %v: %v", b, a, err)
		}
		e := a.Encode()
		if !bytes.Equal(e, b) {
			t.Fatalf("%q decoded to %v, which encodes as %q", b, a, e)
		}
		again, err := DecodeACL(e)
		if err != nil || !slices.Equal(again, a) {
			t.Fatalf("%v re-decoded as %v, %v", a, again, err)
		}
	})
}
