package principal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
)

// Store commits a change atomically: ok is false when an expected value
// no longer holds (another server changed the registry first). It returns
// once the registry's copy has applied the change (vldb.DB, which keeps
// the copy current from etcd's watch).
type Store interface {
	Commit(ctx context.Context, c Change) (ok bool, err error)
}

// Registry is one process's copy of the cell's registry and its way to
// change it. Reads are from memory. Its lock is a leaf but for the
// store's: a store applies committed keys under its own lock, and Apply
// takes the registry's inside it, so the registry never calls its store
// while holding its lock.
type Registry struct {
	store Store
	now   func() time.Time

	mu      sync.RWMutex
	st      State
	changed []func(narrowed bool)
}

// New is an empty registry kept in memory alone (tests, and a process
// that is the only one to use it); Keep gives it a shared store.
func New() *Registry { return &Registry{now: time.Now} }

// Keep has r's changes committed to store, which then tells r of them
// through Apply (vldb.Config.Mirrors).
func (r *Registry) Keep(store Store) { r.store = store }

// OnChange has f called after every change r learns of (outside r's lock;
// f must not call the store); narrowed: it may have taken rights from
// someone (State.Apply).
func (r *Registry) OnChange(f func(narrowed bool)) {
	r.mu.Lock()
	r.changed = append(r.changed, f)
	r.mu.Unlock()
}

// Prefix implements vldb.Mirror.
func (r *Registry) Prefix() string { return Prefix }

// Reset implements vldb.Mirror: the copy is loaded again from scratch.
func (r *Registry) Reset() {
	r.mu.Lock()
	r.st.Reset()
	r.mu.Unlock()
}

// Apply implements vldb.Mirror.
func (r *Registry) Apply(key string, value []byte, deleted bool) {
	r.mu.Lock()
	narrowed := r.st.Apply(key, value, deleted)
	fs := r.changed
	r.mu.Unlock()
	for _, f := range fs {
		f(narrowed)
	}
}

// commit is a memory registry's Store.
func (r *Registry) commit(c Change) bool {
	r.mu.Lock()
	ok, narrowed := r.st.Commit(c)
	fs := r.changed
	r.mu.Unlock()
	if ok {
		for _, f := range fs {
			f(narrowed)
		}
	}
	return ok
}

// tries bounds how often a change is computed again after another
// server's change overtook it.
const tries = 16

// ErrBusy: changes by other servers overtook this one every time.
var ErrBusy = errors.New("the principal registry changed under every try; try again")

// do computes a change from the copy with f and commits it, again while
// another change overtakes it.
func (r *Registry) do(ctx context.Context, f func(*State) (Change, error)) error {
	for range tries {
		r.mu.RLock()
		c, err := f(&r.st)
		r.mu.RUnlock()
		if err != nil || (len(c.Put) == 0 && len(c.Delete) == 0) {
			return err
		}
		ok := true
		if r.store == nil {
			ok = r.commit(c)
		} else if ok, err = r.store.Commit(ctx, c); err != nil {
			return fmt.Errorf("principal registry: %w", err)
		}
		if ok {
			return nil
		}
	}
	return ErrBusy
}

// read runs f on the copy.
func (r *Registry) read(f func(*State)) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	f(&r.st)
}

// Identify is who a verified token's claims make its bearer: the user
// the name is in the registry (registered now, at its first sight), with
// the groups they are in. A revoked token, or one whose uid does not
// agree with the registry, is refused (EACCES or EPERM).
func (r *Registry) Identify(ctx context.Context, tokenID, name string, uid uint32, admin bool) (access.Identity, error) {
	var revoked bool
	r.read(func(s *State) { revoked = s.Revoked(tokenID, r.now()) })
	if revoked {
		return access.Identity{}, fmt.Errorf("token %s of %s was revoked: %w", tokenID, name, syscall.EACCES)
	}
	var p Principal
	err := r.do(ctx, func(s *State) (c Change, err error) {
		p, c, err = s.Bind(name, uid, admin, r.now())
		return c, err
	})
	if err != nil {
		return access.Identity{}, err
	}
	id := access.Identity{User: p.Name, ID: p.ID, UID: uid, Admin: admin}
	if p.UID != RootUID {
		id.UID = p.UID
	}
	r.read(func(s *State) {
		for _, g := range s.GroupsOf(p.ID) {
			id.GroupIDs = append(id.GroupIDs, g)
			id.Groups = append(id.Groups, s.Name(g))
		}
	})
	return id, nil
}

// Lookup is the principal named name.
func (r *Registry) Lookup(name string) (p Principal, ok bool) {
	r.read(func(s *State) { p, ok = s.Lookup(name) })
	return p, ok
}

// Name is id's name ("#N" for one that no longer exists).
func (r *Registry) Name(id access.ID) (name string) {
	r.read(func(s *State) { name = s.Name(id) })
	return name
}

// All is every principal of kind k, by name.
func (r *Registry) All(k Kind) (ps []Principal) {
	r.read(func(s *State) { ps = s.All(k) })
	return ps
}

// Create registers user name with uid ahead of their token's first use
// (admins only: the caller checks).
func (r *Registry) Create(ctx context.Context, name string, uid uint32) (p Principal, err error) {
	err = r.do(ctx, func(s *State) (c Change, err error) {
		if _, ok := s.Lookup(name); ok {
			return c, fmt.Errorf("%q: a user or group of that name exists: %w", name, syscall.EEXIST)
		}
		p, c, err = s.Bind(name, uid, false, r.now())
		return c, err
	})
	return p, err
}

// CreateGroup makes group name, owned by by.
func (r *Registry) CreateGroup(ctx context.Context, by Caller, name string) error {
	return r.do(ctx, func(s *State) (c Change, err error) {
		_, c, err = s.CreateGroup(by, name, r.now())
		return c, err
	})
}

// DeleteGroup removes group name.
func (r *Registry) DeleteGroup(ctx context.Context, by Caller, name string) error {
	return r.do(ctx, func(s *State) (Change, error) { return s.DeleteGroup(by, name) })
}

// SetMember adds user to group (in) or removes them.
func (r *Registry) SetMember(ctx context.Context, by Caller, group, user string, in bool) error {
	return r.do(ctx, func(s *State) (Change, error) { return s.SetMember(by, group, user, in) })
}

// Revoke refuses token tok until expires.
func (r *Registry) Revoke(ctx context.Context, tok string, expires time.Time) error {
	return r.do(ctx, func(s *State) (Change, error) { return s.Revoke(tok, expires) })
}

// Prune forgets revocations of tokens that have expired.
func (r *Registry) Prune(ctx context.Context) error {
	return r.do(ctx, func(s *State) (Change, error) { return s.Prune(r.now()), nil })
}
