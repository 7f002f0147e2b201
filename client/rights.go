package client

import (
	"fmt"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client/user"
	"github.com/hoardfs/hoard/node"
)

// Users. Every request that touches a file carries the token of the user
// it is made for, and the server checks that user's rights on it. The
// session, and what belongs to it (promises, delegations, their breaks,
// recalls, returns and renewals), is the client's own, as in AFS's cache
// manager, which serves each local user with that user's tokens.
//
// What the cache holds is shared among users, so a user's rights on a
// node are kept with the node (Node.rights), under the same promise as
// its status: learnt from the server's replies to that user's requests
// (Status.Rights is the requester's), dropped with the promise or when
// the status changes. Cached bytes, statuses and listings are served to a
// user only under a promise and with that user's rights known; otherwise
// the server is asked, as that user.

// checkToken refuses a request of u's once u's token has expired
// (EKEYEXPIRED), saying so in the log once per token: the server would
// refuse it, and a write accepted into the cache could not be stored.
func (c *Client) checkToken(u user.User) error {
	if !u.ExpiredAt(time.Now()) {
		return nil
	}
	expires := u.Expires().Format(time.RFC3339)
	if _, logged := c.expiredLogged.LoadOrStore(u.Key(), true); !logged {
		c.log.Warn("token expired: refusing its new requests until a new one is given (hoard login)",
			"user", u.Name(), "expired", expires)
	}
	return fmt.Errorf("token of %s expired at %s: %w", u.Name(), expires, syscall.EKEYEXPIRED)
}

// maxRightsUsers bounds the users whose rights a node keeps: a node
// rarely has more than a few users, and past the bound the map starts
// again (those users ask the server again).
const maxRightsUsers = 64

// setRightsLocked records u's rights r on n, if the server said them
// (mu held).
func (n *Node) setRightsLocked(u user.User, r uint8) {
	if r&node.RightsKnown == 0 {
		return
	}
	if n.rights == nil || len(n.rights) >= maxRightsUsers {
		n.rights = make(map[user.Key]uint8, 1)
	}
	n.rights[u.Key()] = r
}

// dropRights forgets every user's rights on n, and its extended
// attributes: its promise went.
func (n *Node) dropRights() {
	n.mu.Lock()
	n.rights, n.xattrs = nil, nil
	n.mu.Unlock()
}

// statusAs is n's status with u's rights in it, if they are known: the
// status is then u's to be served (under a promise: cachedAs).
//
// An expired token's rights are not known: the server, asked, refuses
// it, so that an expired token gets nothing from the cache either.
func (n *Node) statusAs(u user.User) (node.Status, bool) {
	if u.ExpiredAt(time.Now()) {
		return node.Status{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.rights[u.Key()]
	if !ok {
		return node.Status{}, false
	}
	st := n.statusLocked()
	st.Rights = r
	return st, true
}

// cachedAs is n's status for u when it may be served from the cache: a
// promise or delegation is held and u's rights are known (not for a nil
// n: a node not known).
func (c *Client) cachedAs(n *Node, u user.User) (node.Status, bool) {
	if n == nil || !c.current(n) {
		return node.Status{}, false
	}
	return n.statusAs(u)
}

// allows reports whether the rights in st (its user's) grant need. A
// status the server gave no rights with (one the client made itself)
// allows: the server decides then.
func allows(st node.Status, need access.Rights) bool {
	return st.Rights&node.RightsKnown == 0 || access.Rights(st.Rights)&need == need
}

// writerOf is whom n's unstored writes are stored as: the user who made
// the last of them, or the client's own for writes it found in the cache
// at its start.
func (c *Client) writerOf(n *Node) user.User {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.wrote {
		return n.writer
	}
	return c.self
}
