// Package user is whom a client's request acts for: a token of the cell,
// kept opaque (printed or logged, a User never gives it away), named in
// the rights a client caches by the token's hash, and with what the token
// says of its expiry, past which the server refuses it. The rights
// themselves are the client's (Node's), under its locks.
package user

import (
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/hoardfs/hoard/cell"
)

// User is whom a request acts for: an opaque credential made from a token
// of the cell. The zero User is anonymous: it gets what the ACLs grant
// system:anyuser. Users are comparable: equal tokens make equal Users.
type User struct {
	token string
	key   Key
	// name and expires are what the token says (unverified: the server
	// checks it), for refusing new writes once it expired and for logs;
	// expires is zero if the token says nothing readable.
	name    string
	expires time.Time
}

// Key names a user in the nodes' rights: the token's SHA-256 (the zero
// key is anonymous). A new token is a new key, so nothing learnt under
// another token of the same person is used for it.
type Key [32]byte

// New is the user of token ("": anonymous).
func New(token string) User {
	if token == "" {
		return User{}
	}
	u := User{token: token, key: sha256.Sum256([]byte(token))}
	if cl, err := cell.Inspect(token); err == nil {
		u.name, u.expires = cl.User, cl.Expires
	}
	return u
}

// Token is what u's requests carry.
func (u User) Token() string { return u.token }

// Key is u's key.
func (u User) Key() Key { return u.key }

// Name is the user the token says it is, unverified, for logs; "" if it
// says nothing readable.
func (u User) Name() string { return u.name }

// Expires is when the token says it expires, zero if it says nothing.
func (u User) Expires() time.Time { return u.expires }

// ExpiredAt reports whether u's token has expired at now.
func (u User) ExpiredAt(now time.Time) bool {
	return !u.expires.IsZero() && !now.Before(u.expires)
}

// margin is how long before a token expires the writes made with it are
// stored: the server refuses a store made with an expired token, and
// writes a close acknowledged must still reach it.
const margin = 15 * time.Second

// StoreBy is when the writes u makes must be stored by: margin before
// the token expires. Zero if the token says no expiry.
func (u User) StoreBy() time.Time {
	if u.expires.IsZero() {
		return time.Time{}
	}
	return u.expires.Add(-margin)
}

// StorableFor reports whether writes u makes at now can wait age for the
// flusher: they are stored by StoreBy. Otherwise a close stores them at
// once, while the token still holds.
func (u User) StorableFor(now time.Time, age time.Duration) bool {
	by := u.StoreBy()
	return by.IsZero() || now.Add(age).Before(by)
}

// Anonymous reports whether u has no token.
func (u User) Anonymous() bool { return u.token == "" }

// String names u without its token: a short prefix of its key.
func (u User) String() string {
	if u.Anonymous() {
		return "anonymous"
	}
	return fmt.Sprintf("user %x", u.key[:6])
}

// GoString is String, for %#v.
func (u User) GoString() string { return u.String() }
