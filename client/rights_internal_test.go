package client

import (
	"fmt"
	"testing"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/user"
	"github.com/hoardfs/hoard/node"
)

func TestNodeRights(t *testing.T) {
	n := &Node{st: node.Status{Type: node.TypeFile}}
	a, b := user.New("a"), user.New("b")
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
		n.setRightsLocked(user.New(fmt.Sprint("u", i)), node.RightsKnown)
	}
	n.mu.Unlock()
	if _, ok := n.statusAs(b); ok || len(n.rights) > maxRightsUsers {
		t.Fatalf("%d users' rights kept, b's among them", len(n.rights))
	}
	n.dropRights()
	if _, ok := n.statusAs(user.New("u63")); ok {
		t.Fatal("rights kept after they were dropped")
	}
}
