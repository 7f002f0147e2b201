package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cell"
	pb "github.com/hoardfs/hoard/hoardpb"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/principal"
)

// Who a request acts for, and what it may do (docs/security.md).
//
// The session is the machine's: callbacks and delegations belong to the
// client process. The user is the request's: a token the cell issued,
// sent with every request, as AFS's cache manager sends each user's token
// on that user's calls. A server without Users is insecure: every
// request acts as an admin, as before there was authentication.

// Users says whom a token makes its bearer, and until when that holds: a
// file server checks the token itself (CellUsers), a proxy asks its
// origin.
type Users interface {
	Identify(token string) (id access.Identity, until time.Time, err error)
}

// Tokens checks users' tokens (cell.Verifier).
type Tokens interface {
	Verify(token string) (cell.Claims, error)
}

// insecure is whom every request acts for on a server without Users.
var insecure = access.Identity{User: "insecure", Admin: true}

// CellUsers checks tokens with the cell's key, against the cell's
// principal registry: its revocations, the user the token names, and
// their groups.
func CellUsers(t Tokens, reg *principal.Registry) Users { return cellUsers{t, reg} }

type cellUsers struct {
	tokens Tokens
	reg    *principal.Registry
}

// identifyTimeout bounds a token's first sight, which may register its
// user in the cell's registry (an etcd transaction).
const identifyTimeout = 5 * time.Second

func (u cellUsers) Identify(token string) (access.Identity, time.Time, error) {
	c, err := u.tokens.Verify(token)
	if err != nil {
		return access.Identity{}, time.Time{}, badToken("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), identifyTimeout)
	defer cancel()
	id, err := u.reg.Identify(ctx, c.ID, c.User, c.UID, c.Admin)
	switch {
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL):
		return access.Identity{}, time.Time{}, badToken("%v", err)
	case err != nil:
		return access.Identity{}, time.Time{}, status.Errorf(codes.Unavailable, "token of %s: %v", c.User, err)
	}
	return id, c.Expires, nil
}

// maxUsers bounds the tokens whose verification is remembered: past it
// the memory starts again (a flood of tokens costs signature checks, not
// memory).
const maxUsers = 4096

// users remembers verified tokens, so a request costs a hash and a map
// lookup rather than a signature check. A change of the principal
// registry (a revocation, a group change) forgets them all.
type users struct {
	of  Users
	now func() time.Time

	mu   sync.Mutex
	seen map[[32]byte]user
}

type user struct {
	id    access.Identity
	until time.Time
}

func newUsers(of Users) *users {
	return &users{of: of, now: time.Now, seen: map[[32]byte]user{}}
}

// forget drops what is remembered: the principal registry changed.
func (u *users) forget() {
	if u == nil {
		return
	}
	u.mu.Lock()
	u.seen = map[[32]byte]user{}
	u.mu.Unlock()
}

// identify is who token makes its bearer: an error for a token that does
// not check out (malformed, forged, expired, revoked).
func (u *users) identify(token string) (access.Identity, error) {
	key := sha256.Sum256([]byte(token))
	u.mu.Lock()
	e, ok := u.seen[key]
	u.mu.Unlock()
	if ok && u.now().Before(e.until) {
		return e.id, nil
	}
	id, until, err := u.of.Identify(token)
	if err != nil {
		return access.Identity{}, err
	}
	u.mu.Lock()
	if len(u.seen) >= maxUsers {
		u.seen = map[[32]byte]user{}
	}
	u.seen[key] = user{id: id, until: until}
	u.mu.Unlock()
	return id, nil
}

// identify is who the request of ctx acts for: its token's user;
// anonymous without one, or, with no token on a connection whose
// certificate the cell signed, the cell's own server or proxy, trusted as
// an admin.
func (s *Server) identify(ctx context.Context) (access.Identity, error) {
	if s.users == nil {
		return insecure, nil
	}
	var tok string
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get(pb.UserMetadata); len(vals) > 0 {
		var ok bool
		if tok, ok = strings.CutPrefix(vals[0], "Bearer "); !ok || tok == "" {
			return access.Identity{}, badToken("malformed authorization: want \"Bearer <token>\"")
		}
	}
	var state *tls.ConnectionState
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			state = &ti.State
		}
	}
	return s.whoIs(tok, state)
}

// whoIs is who token (none: "") makes a request that came on a
// connection in state.
func (s *Server) whoIs(token string, state *tls.ConnectionState) (access.Identity, error) {
	switch {
	case s.users == nil:
		return insecure, nil
	case len(token) > cell.MaxToken:
		return access.Identity{}, badToken("%d bytes, more than %d", len(token), cell.MaxToken)
	case token != "":
		return s.users.identify(token)
	}
	if state != nil {
		if name, role, ok := cell.PeerRole(*state); ok {
			return access.Identity{User: string(role) + ":" + name, Admin: true}, nil
		}
	}
	return access.Anonymous(), nil
}

// badToken refuses a request whose token does not check out. Not
// UNAUTHENTICATED, which tells a client its session is gone (it then
// waits for a new one): PERMISSION_DENIED with EACCES, which a mount
// answers with.
func badToken(format string, args ...any) error {
	return pb.Err(fmt.Errorf("token refused: "+format+": %w", append(args, syscall.EACCES)...))
}

// refuse is the error for a caller who lacks need on f: EACCES, or
// EPERM for what only an admin may do.
func refuse(who access.Identity, what string, errno syscall.Errno) error {
	return pb.Err(fmt.Errorf("%s: not permitted to %s: %w", who, what, errno))
}

// rightsOf is what o's caller may do with the file or directory st is
// the status of (access.Effective). The governing directory's ACL rights
// are remembered for the rest of the request.
func (o *op) rightsOf(st node.Status) (access.Rights, error) {
	if o.who.Admin {
		return access.All, nil
	}
	dir, acl, err := o.s.store.GoverningACL(st.FID)
	if err != nil {
		return 0, err
	}
	r, ok := o.dirRights[dir]
	if !ok {
		r = acl.Of(o.who)
		if o.dirRights == nil {
			o.dirRights = map[node.FID]access.Rights{}
		}
		o.dirRights[dir] = r
	}
	return access.Effective(o.who, r, access.Object{Dir: st.Type == node.TypeDir, Mode: st.Mode, UID: st.UID}), nil
}

// may refuses the request unless its caller has every right of need on
// f (EACCES): what would be done with f is named by what.
func (o *op) may(f node.FID, need access.Rights, what string) error {
	if o.who.Admin {
		return nil
	}
	st, err := o.s.store.GetStatus(f)
	if err != nil {
		return o.s.wire(err)
	}
	return o.mayStatus(st, need, what)
}

// mayStatus is may for a file whose status is at hand.
func (o *op) mayStatus(st node.Status, need access.Rights, what string) error {
	r, err := o.rightsOf(st)
	if err != nil {
		return o.s.wire(err)
	}
	if r&need != need {
		return refuse(o.who, fmt.Sprintf("%s (needs %s, has %s)", what, need, r), syscall.EACCES)
	}
	return nil
}

// admin refuses the request unless its caller is an admin (EPERM).
func (o *op) admin(what string) error {
	if o.who.Admin {
		return nil
	}
	return refuse(o.who, what, syscall.EPERM)
}

// firstErr is the first of errs that is not nil.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// sameDir refuses a hard link of f into another directory than the one
// whose ACL governs it, as AFS does (EXDEV): its rights would then depend
// on which name was used, and outlive that directory. Admins may.
func (o *op) sameDir(f, dir node.FID) error {
	if o.who.Admin {
		return nil
	}
	gov, _, err := o.s.store.GoverningACL(f)
	if err != nil {
		return o.s.wire(err)
	}
	if gov != dir {
		return pb.Err(fmt.Errorf("link: a file's links stay in its own directory, whose ACL governs it: %w", syscall.EXDEV))
	}
	return nil
}

// nobody is the uid anonymous callers' files get.
const nobody = 65534

// mayCreate refuses a create of name in dir the caller may not make, and
// sets its owner: the caller's uid, not the one the client claims (a uid
// from the network means nothing unless a token says so).
func (o *op) mayCreate(dir node.FID, name string, t node.Type, a *node.Attr) error {
	if err := o.may(dir, access.Insert, "create "+name); err != nil {
		return err
	}
	return o.own(name, t, a)
}

// own refuses a new file of type t the caller may not make, whatever the
// directory, and makes it the caller's.
func (o *op) own(name string, t node.Type, a *node.Attr) error {
	if o.who.Admin {
		return nil
	}
	switch {
	case t == node.TypeCharDev || t == node.TypeBlockDev:
		return o.admin("make device node " + name)
	case t == node.TypeMountPoint:
		return o.admin("make volume mount point " + name)
	case a.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0:
		return o.admin("set the setuid or setgid bit on " + name)
	}
	a.UID = o.who.UID
	if o.who.Anonymous() {
		a.UID = nobody
	}
	return nil
}

// maySetAttr refuses a change of f's attributes the caller may not make:
// as Unix has it, only the owner changes the mode and times, only admins
// the owner and setuid bits; a size needs the right to write.
func (o *op) maySetAttr(f node.FID, req *pb.SetAttrRequest) error {
	if o.who.Admin {
		return nil
	}
	st, err := o.s.store.GetStatus(f)
	if err != nil {
		return o.s.wire(err)
	}
	r, err := o.rightsOf(st)
	if err != nil {
		return o.s.wire(err)
	}
	owner := !o.who.Anonymous() && o.who.UID == st.UID
	const (
		maskMode, maskUID, maskGID, maskSize, maskAtime, maskMtime = 1, 2, 4, 8, 16, 32
	)
	switch {
	case req.Mask&maskUID != 0 && req.Uid != st.UID:
		return o.admin("change the owner of a file")
	case req.Mask&maskMode != 0 && req.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0:
		return o.admin("set the setuid or setgid bit")
	case req.Mask&(maskMode|maskGID) != 0 && !owner:
		return refuse(o.who, "change the mode or group of a file it does not own", syscall.EPERM)
	case req.Mask&(maskMode|maskGID|maskAtime|maskMtime) != 0 && r&access.Lookup == 0:
		return refuse(o.who, "change a file in a directory it may not look in", syscall.EACCES)
	case req.Mask&maskSize != 0 && r&access.Write == 0:
		return refuse(o.who, "change the size of a file", syscall.EACCES)
	case req.Mask&(maskAtime|maskMtime) != 0 && !owner && r&access.Write == 0:
		return refuse(o.who, "change the times of a file", syscall.EACCES)
	}
	return nil
}

// mayStore refuses a store of f's data the caller may not make: it needs
// w, but its owner's own mode bits do not stop the owner, who may have
// made the file read-only while writing it (cp -p, tar): Unix checks the
// mode when a file is opened, and a server sees no opens.
func (o *op) mayStore(f node.FID) error {
	if o.who.Admin {
		return nil
	}
	st, err := o.s.store.GetStatus(f)
	if err != nil {
		return o.s.wire(err)
	}
	return o.mayStatus(o.ownersMode(st), access.Write, "write")
}

// ownersMode is st with the owner's write bit set when the caller owns
// it (mayStore).
func (o *op) ownersMode(st node.Status) node.Status {
	if !o.who.Anonymous() && o.who.UID == st.UID {
		st.Mode |= 0o200
	}
	return st
}

// mayOpen refuses an open the caller may not make: reading needs r,
// writing w; a directory opened for writing (a directory delegation,
// to make and remove files in it) needs i and d.
func (o *op) mayOpen(st node.Status, write bool) error {
	switch {
	case st.Type == node.TypeDir && write:
		return o.mayStatus(st, access.Lookup|access.Insert|access.Delete, "make files in a directory on its own")
	case st.Type == node.TypeDir:
		return o.mayStatus(st, access.Lookup, "open a directory")
	case write:
		return o.mayStatus(o.ownersMode(st), access.Write, "open for writing")
	}
	return o.mayStatus(st, access.Read, "open for reading")
}
