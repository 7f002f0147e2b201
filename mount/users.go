package mount

import (
	"context"
	"fmt"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/client/user"
)

// users is whom a mount acts for, per local user: a multi-user mount
// serves each uid with the token that uid handed it (hoard login, through
// the login socket), and the uid that started the mount with the mount's
// own; a uid with no token is anonymous, and gets what system:anyuser is
// granted. A single-user mount acts for every uid with the mount's token,
// and leaves local users apart to the kernel's mode bits.
type users struct {
	owner  uint32 // the uid that started the mount
	single bool
	anon   *client.Nodes

	mu    sync.RWMutex
	byUID map[uint32]*client.Nodes
}

// newUsers is the users of a mount whose own user's view is own, started
// by uid owner.
func newUsers(own *client.Nodes, owner uint32, single bool) *users {
	return &users{owner: owner, single: single, anon: own.As(user.User{}), byUID: map[uint32]*client.Nodes{owner: own}}
}

// of is the view of the client to serve the kernel request of ctx with:
// its caller's (anonymous if it has none).
func (r *users) of(ctx context.Context) *client.Nodes {
	c, ok := fuse.FromContext(ctx)
	switch {
	case r.single:
		return r.forUID(r.owner)
	case !ok:
		return r.anon
	}
	return r.forUID(c.Uid)
}

func (r *users) forUID(uid uint32) *client.Nodes {
	if r.single {
		uid = r.owner
	}
	r.mu.RLock()
	k := r.byUID[uid]
	r.mu.RUnlock()
	if k == nil {
		return r.anon
	}
	return k
}

// set makes u the user uid acts as from now on. What the cache learnt of
// uid's earlier user's rights is not used for u: rights are kept by token.
func (r *users) set(uid uint32, u user.User) error {
	if err := r.mayChange(uid); err != nil {
		return err
	}
	r.mu.Lock()
	r.byUID[uid] = r.anon.As(u)
	r.mu.Unlock()
	return nil
}

// drop makes uid anonymous from now on.
func (r *users) drop(uid uint32) error {
	if err := r.mayChange(uid); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.byUID, uid)
	r.mu.Unlock()
	return nil
}

// mayChange refuses to change uid's user on a single-user mount, unless
// uid started it: there the mount's token is everybody's.
func (r *users) mayChange(uid uint32) error {
	if r.single && uid != r.owner {
		return fmt.Errorf("a single-user mount takes tokens from uid %d only", r.owner)
	}
	return nil
}
