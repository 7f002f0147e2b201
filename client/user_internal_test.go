package client

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/node"
)

func TestUserIsItsToken(t *testing.T) {
	if NewUser("") != (User{}) || !NewUser("").Anonymous() {
		t.Fatal("no token is not the anonymous user")
	}
	a, b := NewUser("secret-token-a"), NewUser("secret-token-b")
	if a != NewUser("secret-token-a") || a == b || a.Anonymous() {
		t.Fatal("users are not their tokens")
	}
	// Printed or logged, a user does not give its token away.
	for _, s := range []string{fmt.Sprint(a), fmt.Sprintf("%+v %#v %s", a, a, a), fmt.Sprintf("%v", struct{ U User }{a})} {
		if strings.Contains(s, "secret-token") {
			t.Errorf("a user printed with its token: %s", s)
		}
	}
}

func TestNodeRights(t *testing.T) {
	n := &Node{st: node.Status{Type: node.TypeFile}}
	a, b := NewUser("a"), NewUser("b")
	n.mu.Lock()
	n.setRightsLocked(a, uint8(access.Read|access.Lookup)) // not the server's word: ignored
	n.setRightsLocked(b, uint8(access.Read)|node.RightsKnown)
	n.mu.Unlock()
	if _, ok := n.statusAs(a); ok {
		t.Fatal("rights the server did not say were kept")
	}
	if st, ok := n.statusAs(b); !ok || !allows(st, access.Read) || allows(st, access.Write) {
		t.Fatalf("b's rights: %v %v", st.Rights, ok)
	}
	// Bounded: past maxRightsUsers the map starts again.
	n.mu.Lock()
	for i := range maxRightsUsers {
		n.setRightsLocked(NewUser(fmt.Sprint("u", i)), node.RightsKnown)
	}
	n.mu.Unlock()
	if _, ok := n.statusAs(b); ok || len(n.rights) > maxRightsUsers {
		t.Fatalf("%d users' rights kept, b's among them", len(n.rights))
	}
	n.dropRights()
	if _, ok := n.statusAs(NewUser("u63")); ok {
		t.Fatal("rights kept after they were dropped")
	}
}
