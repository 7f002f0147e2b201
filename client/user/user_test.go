package user

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hoardfs/hoard/cell"
)

func TestUserIsItsToken(t *testing.T) {
	if New("") != (User{}) || !New("").Anonymous() || New("").Key() != (Key{}) {
		t.Fatal("no token is not the anonymous user")
	}
	a, b := New("secret-token-a"), New("secret-token-b")
	if a != New("secret-token-a") || a == b || a.Anonymous() || a.Key() == b.Key() || a.Token() != "secret-token-a" {
		t.Fatal("users are not their tokens")
	}
	// Not a token of a cell: nothing is known of its user or expiry.
	if a.Name() != "" || !a.Expires().IsZero() || a.ExpiredAt(time.Now().Add(1000*time.Hour)) {
		t.Fatalf("an opaque token says %q, expiring %v", a.Name(), a.Expires())
	}
	// Printed or logged, a user does not give its token away.
	for _, s := range []string{fmt.Sprint(a), fmt.Sprintf("%+v %#v %s", a, a, a), fmt.Sprintf("%v", struct{ U User }{a})} {
		if strings.Contains(s, "secret-token") {
			t.Errorf("a user printed with its token: %s", s)
		}
	}
}

// A token of the cell names its user and expiry, unverified.
func TestUserOfCellToken(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cell")
	if err := cell.Init(dir, cell.InitOptions{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	iss, err := cell.LoadIssuer(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, cl, err := iss.Issue(cell.Claims{User: "alice", UID: 1001}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	u := New(tok)
	if u.Name() != "alice" || !u.Expires().Equal(cl.Expires) || u.ExpiredAt(cl.Expires.Add(-time.Second)) || !u.ExpiredAt(cl.Expires) {
		t.Fatalf("alice's token: %q, expiring %v (issued to expire %v)", u.Name(), u.Expires(), cl.Expires)
	}
}

// Writes wait for the flusher only while the token outlives the wait by
// margin: otherwise the close stores them.
func TestStorableFor(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	expiring := User{token: "t", expires: t0}
	for _, tc := range []struct {
		what string
		u    User
		now  time.Time
		age  time.Duration
		want bool
	}{
		{"no expiry", User{token: "t"}, t0, 1000 * time.Hour, true},
		{"anonymous", User{}, t0, time.Hour, true},
		{"well before", expiring, t0.Add(-time.Hour), 30 * time.Second, true},
		{"just within the margin", expiring, t0.Add(-margin - 31*time.Second), 30 * time.Second, true},
		{"at the margin", expiring, t0.Add(-margin - 30*time.Second), 30 * time.Second, false},
		{"inside the margin", expiring, t0.Add(-margin / 2), 0, false},
		{"expired", expiring, t0.Add(time.Second), 0, false},
	} {
		if got := tc.u.StorableFor(tc.now, tc.age); got != tc.want {
			t.Errorf("%s: StorableFor(%v, %v) = %v, want %v", tc.what, tc.now, tc.age, got, tc.want)
		}
	}
	if by := expiring.StoreBy(); !by.Equal(t0.Add(-margin)) {
		t.Errorf("StoreBy = %v, want %v", by, t0.Add(-margin))
	}
	if by := (User{token: "t"}).StoreBy(); !by.IsZero() {
		t.Errorf("StoreBy without expiry = %v", by)
	}
}
