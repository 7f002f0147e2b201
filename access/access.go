// Package access is hoard's authorization vocabulary: AFS's directory
// access rights, access control lists, and who a request acts for.
//
// As in AFS, rights are granted per directory: a directory's ACL governs
// the directory and the files in it, and a file's owner mode bits only
// narrow what the ACL grants (Effective). The package is pure: the server
// gets the identity from the token and the ACL from the store.
package access

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
)

// Rights is a set of AFS directory rights.
type Rights uint8

// The rights, in AFS's letter order "rlidwka".
const (
	Read       Rights = 1 << iota // r: read files' data
	Lookup                        // l: list the directory, look up and stat its entries
	Insert                        // i: create entries
	Delete                        // d: remove and rename away entries
	Write                         // w: change files' data and attributes
	Lock                          // k: take locks
	Administer                    // a: change the ACL

	// All is every right.
	All = Read | Lookup | Insert | Delete | Write | Lock | Administer
)

// letters are the rights' letters, bit i's at index i.
const letters = "rlidwka"

// String is AFS's letters in order "rlidwka" for the rights present
// ("none" when empty). Bits outside All are not shown.
func (r Rights) String() string {
	if r&All == 0 {
		return "none"
	}
	var b [len(letters)]byte
	n := 0
	for i := range len(letters) {
		if r&(1<<i) != 0 {
			b[n] = letters[i]
			n++
		}
	}
	return string(b[:n])
}

// ParseRights reads letters from "rlidwka" in any order, or the AFS words:
// "read" (rl), "write" (rlidwk), "all" (rlidwka), "none" (nothing). Its
// error is one line naming the bad letter, and wraps EINVAL.
func ParseRights(s string) (Rights, error) {
	switch s {
	case "read":
		return Read | Lookup, nil
	case "write":
		return All &^ Administer, nil
	case "all":
		return All, nil
	case "none":
		return 0, nil
	case "":
		return 0, fmt.Errorf("access rights: empty (use \"none\" for no rights): %w", syscall.EINVAL)
	}
	var r Rights
	for i := 0; i < len(s); i++ {
		j := strings.IndexByte(letters, s[i])
		if j < 0 {
			return 0, fmt.Errorf("access rights %q: %q is not one of %q: %w", s, s[i], letters, syscall.EINVAL)
		}
		r |= 1 << j
	}
	return r, nil
}

// Well-known principals (AFS's system groups).
const (
	AnyUser        = "system:anyuser"        // everyone, anonymous included
	AuthUser       = "system:authuser"       // everyone with a valid token
	Administrators = "system:administrators" // the cell's admins (tokens with the admin flag)
)

// MaxName is the longest user or group name, in bytes.
const MaxName = 64

const systemPrefix = "system:"

// CheckName validates a user or group name: 1..64 bytes of
// [a-zA-Z0-9._@:-], no leading '-' (it would read as an option on a
// command line); names starting with "system:" are only the three above.
// Its error wraps EINVAL.
func CheckName(who string) error {
	if who == "" {
		return fmt.Errorf("empty name: %w", syscall.EINVAL)
	}
	if len(who) > MaxName {
		return fmt.Errorf("name %q...: %d bytes, limit %d: %w", who[:16], len(who), MaxName, syscall.EINVAL)
	}
	if who[0] == '-' {
		return fmt.Errorf("name %q: may not start with '-': %w", who, syscall.EINVAL)
	}
	for i := 0; i < len(who); i++ {
		c := who[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '@' || c == ':' || c == '-'
		if !ok {
			return fmt.Errorf("name %q: %q is not a letter, digit or one of . _ @ : -: %w", who, c, syscall.EINVAL)
		}
	}
	if IsSystem(who) && who != AnyUser && who != AuthUser && who != Administrators {
		return fmt.Errorf("name %q: the only system names are %s, %s and %s: %w", who, AnyUser, AuthUser, Administrators, syscall.EINVAL)
	}
	return nil
}

// IsSystem reports whether who is in the reserved "system:" name space.
func IsSystem(who string) bool { return strings.HasPrefix(who, systemPrefix) }

// ID is a principal's number in the cell's registry (package principal).
// An ACL entry names its principal by ID, as AFS's do: a name deleted and
// made again is a new principal with a new ID, no heir to the old one's
// rights, and a name can never be re-bound to take an entry over.
type ID uint32

// The system groups' IDs; the registry gives others from FirstID on.
const (
	AnyUserID        ID = 1
	AuthUserID       ID = 2
	AdministratorsID ID = 3
	FirstID          ID = 1000
)

// SystemID is the ID of a system group's name.
func SystemID(name string) (ID, bool) {
	switch name {
	case AnyUser:
		return AnyUserID, true
	case AuthUser:
		return AuthUserID, true
	case Administrators:
		return AdministratorsID, true
	}
	return 0, false
}

// Entry grants Rights to a principal. Who is its name, for display: only
// the ID is stored and compared.
type Entry struct {
	ID     ID
	Who    string
	Rights Rights
}

// ACL is a directory's access control list, sorted by ID, one entry per
// principal, none with no rights.
type ACL []Entry

// MaxEntries is the most entries an ACL has (AFS allows 20 positive ones).
const MaxEntries = 64

func (a ACL) find(id ID) (int, bool) {
	return slices.BinarySearchFunc(a, id, func(e Entry, id ID) int { return cmp.Compare(e.ID, id) })
}

// Set returns a with id's rights replaced by r (removed when r == 0); a
// is not modified. Bits outside All are dropped.
func (a ACL) Set(id ID, r Rights) ACL {
	r &= All
	i, ok := a.find(id)
	out := make(ACL, 0, len(a)+1)
	out = append(out, a[:i]...)
	if r != 0 {
		out = append(out, Entry{ID: id, Rights: r})
	}
	if ok {
		i++
	}
	return append(out, a[i:]...)
}

// Get returns id's entry rights (0 if none).
func (a ACL) Get(id ID) Rights {
	if i, ok := a.find(id); ok {
		return a[i].Rights
	}
	return 0
}

// Check reports whether a is well formed: at most MaxEntries entries,
// IDs not 0, sorted and unique, each with some rights and none beyond
// All. Its error wraps EINVAL. Only a well-formed ACL is stored.
func (a ACL) Check() error {
	if len(a) > MaxEntries {
		return fmt.Errorf("acl of %d entries, limit %d: %w", len(a), MaxEntries, syscall.EINVAL)
	}
	for i, e := range a {
		if e.ID == 0 {
			return fmt.Errorf("acl: principal id 0: %w", syscall.EINVAL)
		}
		if e.Rights == 0 || e.Rights&^All != 0 {
			return fmt.Errorf("acl: #%d: rights %#x: %w", e.ID, uint8(e.Rights), syscall.EINVAL)
		}
		if i > 0 && a[i-1].ID >= e.ID {
			return fmt.Errorf("acl: #%d after #%d: not sorted and unique: %w", e.ID, a[i-1].ID, syscall.EINVAL)
		}
	}
	return nil
}

// String is the entries as "who rights" separated by ", ", for logs; an
// entry without a name shows its ID as "#N".
func (a ACL) String() string {
	var b strings.Builder
	for i, e := range a {
		if i > 0 {
			b.WriteString(", ")
		}
		if e.Who != "" {
			b.WriteString(e.Who)
		} else {
			fmt.Fprintf(&b, "#%d", e.ID)
		}
		b.WriteByte(' ')
		b.WriteString(e.Rights.String())
	}
	return b.String()
}

// The encoded forms' leading version byte: 1 named principals (stores
// written before the registry; NamedACL reads it for their migration),
// 2 numbers them.
const (
	aclNamed   = 1
	aclVersion = 2
)

// Encode is a's compact binary form for the store: a version byte, then
// per entry its rights and its ID (4 bytes, big-endian).
func (a ACL) Encode() []byte {
	b := make([]byte, 0, 1+5*len(a))
	b = append(b, aclVersion)
	for _, e := range a {
		b = append(b, byte(e.Rights))
		b = binary.BigEndian.AppendUint32(b, uint32(e.ID))
	}
	return b
}

var errBadACL = errors.New("bad encoded acl")

// ErrNamedACL is DecodeACL's error for an ACL of the first form, which
// named its principals: NamedACL reads it, and the registry numbers it.
var ErrNamedACL = errors.New("acl names its principals (written before the principal registry)")

// DecodeACL reads an ACL that Encode wrote, checking it as Check does; it
// never panics, whatever b is.
func DecodeACL(b []byte) (ACL, error) {
	if len(b) > 0 && b[0] == aclNamed {
		return nil, ErrNamedACL
	}
	if len(b) == 0 || b[0] != aclVersion || (len(b)-1)%5 != 0 {
		return nil, errBadACL
	}
	if n := (len(b) - 1) / 5; n > MaxEntries {
		return nil, fmt.Errorf("%w: %d entries, limit %d", errBadACL, n, MaxEntries)
	}
	a := ACL{}
	for b = b[1:]; len(b) > 0; b = b[5:] {
		a = append(a, Entry{ID: ID(binary.BigEndian.Uint32(b[1:5])), Rights: Rights(b[0])})
	}
	if err := a.Check(); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadACL, err)
	}
	return a, nil
}

// Named is an entry of an ACL of the first form.
type Named struct {
	Who    string
	Rights Rights
}

// NamedACL reads an ACL of the first form (ErrNamedACL); it never panics.
func NamedACL(b []byte) ([]Named, error) {
	if len(b) == 0 || b[0] != aclNamed {
		return nil, errBadACL
	}
	var out []Named
	for b = b[1:]; len(b) > 0; {
		if len(b) < 2 || len(b) < 2+int(b[1]) || len(out) == MaxEntries {
			return nil, errBadACL
		}
		end := 2 + int(b[1])
		e := Named{Who: string(b[2:end]), Rights: Rights(b[0]) & All}
		if CheckName(e.Who) != nil {
			return nil, errBadACL
		}
		out = append(out, e)
		b = b[end:]
	}
	return out, nil
}

// DefaultACL is a new volume root's: Administrators all, AuthUser "rl".
func DefaultACL() ACL {
	return ACL{}.Set(AdministratorsID, All).Set(AuthUserID, Read|Lookup)
}

// Identity is who a request acts for.
type Identity struct {
	User   string   // "" when anonymous
	ID     ID       // the user's principal (0 when anonymous, or a cell's server or proxy)
	UID    uint32   // the user's uid in the cell's registry (meaningless when anonymous)
	Admin  bool     // the token carries the admin flag
	Groups []string // the groups the user is a member of, by name, for display
	// GroupIDs are the same groups' IDs: what an ACL is checked against.
	GroupIDs []ID
}

// Anonymous is the identity of a request without a token.
func Anonymous() Identity { return Identity{} }

// Anonymous reports whether id is nobody in particular.
func (id Identity) Anonymous() bool { return id.User == "" }

// String is the user name, or "anonymous".
func (id Identity) String() string {
	if id.Anonymous() {
		return "anonymous"
	}
	return id.User
}

// admin is whether id is one of the cell's admins: an anonymous identity
// never is, whatever its flag says.
func (id Identity) admin() bool { return id.Admin && !id.Anonymous() }

// Of is what a grants id: the union of the entries for id.ID, each of
// id.GroupIDs, AnyUser, and AuthUser (unless anonymous). Admins get All
// (the cell's root: AFS gives system:administrators implicit a and l;
// hoard's admins are root-like, as uid 0 from the network means nothing
// otherwise). An anonymous identity's groups count for nothing.
func (a ACL) Of(id Identity) Rights {
	if id.admin() {
		return All
	}
	r := a.Get(AnyUserID)
	if id.Anonymous() {
		return r
	}
	r |= a.Get(AuthUserID)
	if id.ID != 0 {
		r |= a.Get(id.ID)
	}
	// Per group, not per entry, so that an unsorted GroupIDs still counts.
	for _, g := range id.GroupIDs {
		if r == All {
			break
		}
		r |= a.Get(g)
	}
	return r
}

// Object is what the mode-bit part of a check needs of a file or directory.
type Object struct {
	Dir  bool
	Mode uint32 // permission bits
	UID  uint32 // owner
}

// Effective is what id may do with obj, given dirRights = the ACL rights
// id has on the directory governing obj (the directory itself when obj is
// one). AFS semantics for files: the owner's mode bits restrict everyone —
// Read needs mode&0400, Write needs mode&0200; the other rights pass
// through from the directory. A directory's owner (id.UID == obj.UID, not
// anonymous) has Administer implicitly (as in AFS: the owner can always
// fix the ACL). Admins: All.
func Effective(id Identity, dirRights Rights, obj Object) Rights {
	if id.admin() {
		return All
	}
	r := dirRights & All
	if obj.Dir {
		if !id.Anonymous() && id.UID == obj.UID {
			r |= Administer
		}
		return r
	}
	if obj.Mode&0o400 == 0 {
		r &^= Read
	}
	if obj.Mode&0o200 == 0 {
		r &^= Write
	}
	return r
}
