// Package principal is the cell's one registry of principals: its users
// and groups, each with a unique name and a number (access.ID) that ACL
// entries name them by, and the tokens revoked before their time. It is
// AFS's protection server (pts) kept in etcd with the rest of the cell's
// shared state, so every server of the cell sees one registry.
//
// The rules are a pure machine (State): a change is computed from a copy
// of the registry as a Change, a set of keys to write guarded by the
// values they must still have, and the store commits it atomically or
// not at all (an etcd transaction in a cell, Memory in tests). Every
// server's copy learns the committed keys through Apply, its own changes
// and other servers' alike.
package principal

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
)

// Prefix is where the registry's keys live, below the cell's prefix.
const Prefix = "/hoard/principal/"

// The keys, below Prefix.
const (
	idKeys      = "id/"      // id → Principal (JSON)
	nameKeys    = "name/"    // name → id: what keeps names unique
	uidKeys     = "uid/"     // uid → id: what keeps uids unique
	revokedKeys = "revoked/" // token id → when it expires (Unix ns)
	nextKey     = "next"     // the lowest id never given
)

// Bounds on what one user may make or be made part of.
const (
	MaxOwned      = 64   // groups one user owns (AFS's group quota is 20)
	MaxMembers    = 4096 // members of one group
	MaxMembership = 256  // groups one user is a member of
	maxRevoked    = 1 << 16
)

// Reserved uids: no user's. Root's 0 is the cell admins' default (their
// rights come from the token's admin flag, never from the number), and
// nobody's is what anonymous callers' files get.
const (
	RootUID   = 0
	NobodyUID = 65534
)

// Kind is what a principal is.
type Kind string

// The kinds of principal.
const (
	User  Kind = "user"
	Group Kind = "group"
)

// Principal is a user or a group.
type Principal struct {
	ID   access.ID `json:"id"`
	Name string    `json:"name"`
	Kind Kind      `json:"kind"`
	// UID is a user's number in the cell: its files' owner. An admin with
	// RootUID shares it with the other admins and holds no uid key.
	UID uint32 `json:"uid,omitempty"`
	// Owner is who made a group and may change it; Members its users,
	// sorted.
	Owner   access.ID   `json:"owner,omitempty"`
	Members []access.ID `json:"members,omitempty"`
	Created time.Time   `json:"created"`
}

// Cond is a key's value a change expects ("": absent).
type Cond struct{ Key, Value string }

// Change is one atomic change of the registry: every Expect must hold,
// then every Put is written and every Delete removed, all at once.
type Change struct {
	Expect []Cond
	Put    map[string]string
	Delete []string
}

func (c *Change) put(key, value string) {
	if c.Put == nil {
		c.Put = map[string]string{}
	}
	c.Put[key] = value
}

// Caller is who asks for a change: a registered user, or an admin.
type Caller struct {
	ID    access.ID
	Name  string
	Admin bool
}

// State is a copy of the registry: the keys as committed, and what they
// say, indexed. It does no I/O and reads no clock; its zero value is
// empty, ready for Apply.
type State struct {
	kv       map[string]string
	byID     map[access.ID]*Principal
	byName   map[string]access.ID
	byUID    map[uint32]access.ID
	memberOf map[access.ID][]access.ID // user → groups
	owned    map[access.ID]int         // user → groups owned
	revoked  map[string]int64
	next     access.ID
}

func (s *State) init() {
	if s.kv == nil {
		s.kv, s.byID, s.byName, s.byUID = map[string]string{}, map[access.ID]*Principal{}, map[string]access.ID{}, map[uint32]access.ID{}
		s.memberOf, s.owned, s.revoked = map[access.ID][]access.ID{}, map[access.ID]int{}, map[string]int64{}
	}
}

// Reset empties s, for a load from scratch.
func (s *State) Reset() { *s = State{} }

// Value is key's committed value ("" when absent).
func (s *State) Value(key string) string { return s.kv[key] }

// Apply makes s hold key's committed value (deleted: its removal). Keys
// outside Prefix and values that do not parse are ignored. narrowed
// reports whether the change may take rights from someone: a token
// revoked, a group deleted or a member removed from it.
func (s *State) Apply(key string, value []byte, deleted bool) (narrowed bool) {
	s.init()
	rel, ok := strings.CutPrefix(key, Prefix)
	if !ok {
		return false
	}
	if deleted {
		delete(s.kv, key)
	} else {
		s.kv[key] = string(value)
	}
	switch {
	case strings.HasPrefix(rel, idKeys):
		id, err := strconv.ParseUint(rel[len(idKeys):], 10, 32)
		if err != nil {
			return false
		}
		old, had := s.byID[access.ID(id)]
		s.unindex(access.ID(id))
		var p Principal
		if deleted || json.Unmarshal(value, &p) != nil || p.ID != access.ID(id) {
			return had
		}
		s.index(&p)
		if had {
			for _, m := range old.Members {
				if _, still := slices.BinarySearch(p.Members, m); !still {
					return true
				}
			}
		}
	case strings.HasPrefix(rel, revokedKeys):
		tok := rel[len(revokedKeys):]
		ns, err := strconv.ParseInt(string(value), 10, 64)
		if deleted || err != nil {
			delete(s.revoked, tok)
			return false
		}
		s.revoked[tok] = ns
		return true
	case rel == nextKey:
		n, _ := strconv.ParseUint(string(value), 10, 32)
		s.next = access.ID(n)
		if deleted {
			s.next = 0
		}
	}
	return false
}

func (s *State) index(p *Principal) {
	s.byID[p.ID] = p
	s.byName[p.Name] = p.ID
	switch p.Kind {
	case User:
		if p.UID != RootUID {
			s.byUID[p.UID] = p.ID
		}
	case Group:
		s.owned[p.Owner]++
		for _, m := range p.Members {
			s.memberOf[m] = append(s.memberOf[m], p.ID)
		}
	}
}

func (s *State) unindex(id access.ID) {
	p, ok := s.byID[id]
	if !ok {
		return
	}
	delete(s.byID, id)
	if s.byName[p.Name] == id {
		delete(s.byName, p.Name)
	}
	if s.byUID[p.UID] == id {
		delete(s.byUID, p.UID)
	}
	if p.Kind == Group {
		if s.owned[p.Owner]--; s.owned[p.Owner] <= 0 {
			delete(s.owned, p.Owner)
		}
		for _, m := range p.Members {
			gs := slices.DeleteFunc(s.memberOf[m], func(g access.ID) bool { return g == id })
			if len(gs) == 0 {
				delete(s.memberOf, m)
			} else {
				s.memberOf[m] = gs
			}
		}
	}
}

// Lookup is the principal named name: the system groups too, with no
// entry in the registry.
func (s *State) Lookup(name string) (Principal, bool) {
	if id, ok := access.SystemID(name); ok {
		return Principal{ID: id, Name: name, Kind: Group}, true
	}
	if id, ok := s.byName[name]; ok {
		return s.copyOf(id), true
	}
	return Principal{}, false
}

// ByID is the principal numbered id.
func (s *State) ByID(id access.ID) (Principal, bool) {
	switch id {
	case access.AnyUserID:
		return Principal{ID: id, Name: access.AnyUser, Kind: Group}, true
	case access.AuthUserID:
		return Principal{ID: id, Name: access.AuthUser, Kind: Group}, true
	case access.AdministratorsID:
		return Principal{ID: id, Name: access.Administrators, Kind: Group}, true
	}
	if _, ok := s.byID[id]; !ok {
		return Principal{}, false
	}
	return s.copyOf(id), true
}

func (s *State) copyOf(id access.ID) Principal {
	p := *s.byID[id]
	p.Members = slices.Clone(p.Members)
	return p
}

// Name is id's name, or "#N" for a principal that no longer exists.
func (s *State) Name(id access.ID) string {
	if p, ok := s.ByID(id); ok {
		return p.Name
	}
	return "#" + strconv.FormatUint(uint64(id), 10)
}

// GroupsOf is the groups user is a member of, sorted by ID.
func (s *State) GroupsOf(user access.ID) []access.ID {
	gs := slices.Clone(s.memberOf[user])
	slices.Sort(gs)
	return gs
}

// All is every principal of kind k, sorted by name.
func (s *State) All(k Kind) []Principal {
	var out []Principal
	for id, p := range s.byID {
		if p.Kind == k {
			out = append(out, s.copyOf(id))
		}
	}
	slices.SortFunc(out, func(a, b Principal) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Revoked reports whether token id was revoked and has not expired by now.
func (s *State) Revoked(tok string, now time.Time) bool {
	ns, ok := s.revoked[tok]
	return ok && now.UnixNano() < ns
}

// Errors of the rules: each wraps the errno a client is told.
func denied(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, syscall.EPERM)...)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, syscall.EINVAL)...)
}

// CheckUserName refuses a name no user may have: access.CheckName's
// rules, and no ':' (a user's groups are "user:name").
func CheckUserName(name string) error {
	if err := access.CheckName(name); err != nil {
		return err
	}
	if strings.ContainsRune(name, ':') {
		return invalid("user name %q: ':' is for groups (owner:name)", name)
	}
	return nil
}

// CheckGroupName refuses a group name by: a user's groups are named
// "their-name:group", as AFS's pts has it; only admins make others. The
// system groups are not made.
func CheckGroupName(by Caller, name string) error {
	if err := access.CheckName(name); err != nil {
		return err
	}
	if access.IsSystem(name) {
		return invalid("group %q: system groups are not made", name)
	}
	owner, rest, prefixed := strings.Cut(name, ":")
	if prefixed && (owner == "" || rest == "" || strings.ContainsRune(rest, ':')) {
		return invalid("group %q: want owner:name", name)
	}
	if by.Admin {
		return nil
	}
	if !prefixed || owner != by.Name {
		return denied("group %q: a user's groups are named %s:NAME; only admins make others", name, by.Name)
	}
	return nil
}

func idKey(id access.ID) string    { return Prefix + idKeys + strconv.FormatUint(uint64(id), 10) }
func nameKey(name string) string   { return Prefix + nameKeys + name }
func uidKey(uid uint32) string     { return Prefix + uidKeys + strconv.FormatUint(uint64(uid), 10) }
func revokedKey(tok string) string { return Prefix + revokedKeys + tok }

func encode(p Principal) string {
	b, _ := json.Marshal(p)
	return string(b)
}

// newID is the next id to give, and the change's claim on it.
func (s *State) newID(c *Change) access.ID {
	id := max(s.next, access.FirstID)
	c.Expect = append(c.Expect, Cond{Prefix + nextKey, s.kv[Prefix+nextKey]})
	c.put(Prefix+nextKey, strconv.FormatUint(uint64(id)+1, 10))
	return id
}

// Bind is the user a token names: registered at its first sight with the
// token's uid, which then stays that name's alone. A token whose uid is
// another user's, or another uid than the name has, is refused; so is a
// reserved uid on a token without the admin flag. The change is empty
// when the user is registered already.
func (s *State) Bind(name string, uid uint32, admin bool, now time.Time) (Principal, Change, error) {
	var c Change
	if err := CheckUserName(name); err != nil {
		return Principal{}, c, err
	}
	if !admin && (uid == RootUID || uid == NobodyUID) {
		return Principal{}, c, denied("user %s: uid %d is no user's (uid 0 is not an admin by number: an admin's token says so)", name, uid)
	}
	if p, ok := s.Lookup(name); ok {
		switch {
		case p.Kind != User:
			return Principal{}, c, denied("user %s: that name is a group's", name)
		case p.UID != uid && !(admin && uid == RootUID):
			return Principal{}, c, denied("user %s has uid %d in the cell's registry; this token says %d", name, p.UID, uid)
		}
		return p, c, nil
	}
	if other, ok := s.byUID[uid]; ok && uid != RootUID {
		return Principal{}, c, denied("uid %d belongs to %s in the cell's registry, not to %s", uid, s.Name(other), name)
	}
	p := Principal{ID: s.newID(&c), Name: name, Kind: User, UID: uid, Created: now}
	c.Expect = append(c.Expect, Cond{nameKey(name), ""})
	c.put(nameKey(name), strconv.FormatUint(uint64(p.ID), 10))
	if uid != RootUID {
		c.Expect = append(c.Expect, Cond{uidKey(uid), ""})
		c.put(uidKey(uid), strconv.FormatUint(uint64(p.ID), 10))
	}
	c.put(idKey(p.ID), encode(p))
	return p, c, nil
}

// CreateGroup makes group name, owned by its maker.
func (s *State) CreateGroup(by Caller, name string, now time.Time) (Principal, Change, error) {
	var c Change
	if err := CheckGroupName(by, name); err != nil {
		return Principal{}, c, err
	}
	if _, ok := s.Lookup(name); ok {
		return Principal{}, c, fmt.Errorf("%q: a user or group of that name exists: %w", name, syscall.EEXIST)
	}
	if !by.Admin && s.owned[by.ID] >= MaxOwned {
		return Principal{}, c, fmt.Errorf("%s owns %d groups, the most a user may: %w", by.Name, MaxOwned, syscall.EDQUOT)
	}
	p := Principal{ID: s.newID(&c), Name: name, Kind: Group, Owner: by.ID, Created: now}
	c.Expect = append(c.Expect, Cond{nameKey(name), ""})
	c.put(nameKey(name), strconv.FormatUint(uint64(p.ID), 10))
	c.put(idKey(p.ID), encode(p))
	return p, c, nil
}

// group is the group name that by may change: its owner's or an admin's.
func (s *State) group(by Caller, name string) (Principal, error) {
	p, ok := s.Lookup(name)
	switch {
	case !ok || p.Kind != Group:
		return Principal{}, fmt.Errorf("group %q: %w", name, syscall.ENOENT)
	case p.ID < access.FirstID:
		return Principal{}, denied("group %s: system groups are not changed", name)
	case p.Owner != by.ID && !by.Admin:
		return Principal{}, denied("group %s is %s's: only its owner or an admin changes it", name, s.Name(p.Owner))
	}
	return p, nil
}

// DeleteGroup removes group name. Its ID is never given again, so ACL
// entries naming it grant nothing from then on.
func (s *State) DeleteGroup(by Caller, name string) (Change, error) {
	var c Change
	p, err := s.group(by, name)
	if err != nil {
		return c, err
	}
	c.Expect = append(c.Expect, Cond{idKey(p.ID), s.kv[idKey(p.ID)]})
	c.Delete = []string{idKey(p.ID), nameKey(p.Name)}
	return c, nil
}

// SetMember adds user to group (in) or removes them.
func (s *State) SetMember(by Caller, group, user string, in bool) (Change, error) {
	var c Change
	g, err := s.group(by, group)
	if err != nil {
		return c, err
	}
	u, ok := s.Lookup(user)
	if !ok || u.Kind != User {
		return c, fmt.Errorf("user %q: not in the cell's registry (a user is registered by the first use of their token, or by hoard user create): %w", user, syscall.ENOENT)
	}
	i, found := slices.BinarySearch(g.Members, u.ID)
	switch {
	case in == found:
		return c, nil
	case in && len(g.Members) >= MaxMembers:
		return c, fmt.Errorf("group %s has %d members, the most it may: %w", group, MaxMembers, syscall.EMLINK)
	case in && len(s.memberOf[u.ID]) >= MaxMembership:
		return c, fmt.Errorf("%s is in %d groups, the most a user may be: %w", user, MaxMembership, syscall.EMLINK)
	case in:
		g.Members = slices.Insert(g.Members, i, u.ID)
	default:
		g.Members = slices.Delete(g.Members, i, i+1)
	}
	c.Expect = append(c.Expect, Cond{idKey(g.ID), s.kv[idKey(g.ID)]})
	c.put(idKey(g.ID), encode(g))
	return c, nil
}

// Revoke refuses token tok until it expires anyway. Past maxRevoked
// unexpired revocations, the cell needs a new CA, not a longer list.
func (s *State) Revoke(tok string, expires time.Time) (Change, error) {
	var c Change
	if tok == "" || len(tok) > 64 || strings.ContainsRune(tok, '/') {
		return c, invalid("token id of %d bytes", len(tok))
	}
	if len(s.revoked) >= maxRevoked {
		return c, fmt.Errorf("%d tokens revoked and not yet expired: %w", maxRevoked, syscall.ENOSPC)
	}
	c.put(revokedKey(tok), strconv.FormatInt(expires.UnixNano(), 10))
	return c, nil
}

// Prune forgets revocations of tokens expired by now.
func (s *State) Prune(now time.Time) Change {
	var c Change
	for tok, ns := range s.revoked {
		if now.UnixNano() >= ns {
			c.Delete = append(c.Delete, revokedKey(tok))
		}
	}
	return c
}

// Commit applies c if every condition of c holds in s, as a store's
// commit would (ok), and says whether it may have taken rights from
// someone (Apply).
func (s *State) Commit(c Change) (ok, narrowed bool) {
	if !s.Holds(c) {
		return false, false
	}
	for k, v := range c.Put {
		narrowed = s.Apply(k, []byte(v), false) || narrowed
	}
	for _, k := range c.Delete {
		narrowed = s.Apply(k, nil, true) || narrowed
	}
	return true, narrowed
}

// Holds reports whether every condition of c holds in s.
func (s *State) Holds(c Change) bool {
	for _, e := range c.Expect {
		if s.kv[e.Key] != e.Value {
			return false
		}
	}
	return true
}
