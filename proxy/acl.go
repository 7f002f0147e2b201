package proxy

import (
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/client"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/server"
)

// Access control through a proxy. The proxy acts at its origin with its
// own certificate, which the cell trusts as it trusts a server; it checks
// its clients' rights itself, against the origin's ACLs, which it keeps
// while it holds promises on the file and its directory: an ACL change
// breaks the promises on the directory and its entries, and so empties
// the proxy's copy before the change is acknowledged.

// maxACLs bounds the ACLs kept; past it they are all dropped.
const maxACLs = 1 << 16

type aclCopy struct {
	dir node.FID
	acl access.ACL
}

// GoverningACL implements server.Backend.
func (p *Proxy) GoverningACL(f node.FID) (node.FID, access.ACL, error) {
	p.mu.Lock()
	c, ok := p.acls[f]
	gen := p.aclGen
	p.mu.Unlock()
	if ok && p.promised(f) && p.promised(c.dir) {
		return c.dir, c.acl, nil
	}
	// Promises first, then the list: a change between the two breaks
	// them, and the generation shows it.
	if _, err := p.fids.Status(p.fids.Node(f)); err != nil {
		return node.FID{}, nil, err
	}
	a, err := p.fids.ACL(f)
	if err != nil {
		return node.FID{}, nil, unwrap(err)
	}
	if a.Dir != f {
		if _, err := p.fids.Status(p.fids.Node(a.Dir)); err != nil {
			return node.FID{}, nil, err
		}
	}
	p.mu.Lock()
	if p.aclGen == gen {
		if len(p.acls) >= maxACLs {
			p.acls = map[node.FID]aclCopy{}
		}
		p.acls[f] = aclCopy{dir: a.Dir, acl: a.Entries}
	}
	p.mu.Unlock()
	return a.Dir, a.Entries, nil
}

func (p *Proxy) promised(f node.FID) bool { return p.fids.PromiseLeft(p.fids.Node(f)) > 0 }

// forgetACLs drops the ACLs of fids, whose promises the origin broke.
func (p *Proxy) forgetACLs(fids []node.FID) {
	p.mu.Lock()
	p.aclGen++
	for _, f := range fids {
		delete(p.acls, f)
	}
	p.mu.Unlock()
}

// SetACLEntry implements server.Backend: the origin changes it.
func (p *Proxy) SetACLEntry(dir node.FID, who access.Entry, r access.Rights) (access.ACL, error) {
	a, err := p.fids.SetACL(dir, who.Who, r)
	if err != nil {
		return nil, unwrap(err)
	}
	return a.Entries, nil
}

// userTTL is how long the proxy trusts its origin's word on a token
// without hearing from it: a revocation or group change the origin tells
// of (rightsChanged) ends it at once.
const userTTL = time.Minute

// rightsChanged: the origin says someone may have lost rights in the
// cell. The proxy forgets what it was told of its clients' tokens and
// tells its own clients, as the origin told it.
func (p *Proxy) rightsChanged() {
	if s := p.srv.Load(); s != nil {
		s.RightsChanged()
	}
}

// Users says who a token's bearer is by asking the origin, which checks
// it against its revocations and groups.
func (p *Proxy) Users() server.Users { return originUsers{p.c} }

type originUsers struct{ c *client.Client }

func (u originUsers) Identify(token string) (access.Identity, time.Time, error) {
	id, err := u.c.Admin().WhoIs(token)
	if err != nil {
		return access.Identity{}, time.Time{}, unwrap(err)
	}
	return id, time.Now().Add(userTTL), nil
}
