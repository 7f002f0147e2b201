package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/principal"
	"github.com/hoardfs/hoard/vnode"
)

// Migrate hands what store kept of principals before the cell's registry
// over to reg, once: revocations as they were, groups as an admin's (their
// owners and members where the registry knows them), and ACLs numbered.
// What the registry cannot name is dropped and said in the log: an old
// ACL entry or member whose user has not been registered (hoard user
// create, then set it again). Later, a start finds nothing to move and
// prunes expired revocations.
func Migrate(store *vnode.Store, reg *principal.Registry) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	groups, revoked, err := store.OldPrincipals()
	if err != nil {
		return err
	}
	for tok, until := range revoked {
		if until.After(time.Now()) {
			if err := reg.Revoke(ctx, tok, until); err != nil {
				return err
			}
		}
	}
	admin := principal.Caller{Name: "server", Admin: true}
	for _, g := range groups {
		if _, ok := reg.Lookup(g.Name); !ok {
			if err := reg.CreateGroup(ctx, admin, g.Name); err != nil {
				slog.Warn("group not moved to the cell's registry", "group", g.Name, "err", err)
				continue
			}
		}
		for _, m := range g.Members {
			if err := reg.SetMember(ctx, admin, g.Name, m, true); err != nil {
				slog.Warn("group member not moved to the cell's registry", "group", g.Name, "member", m, "err", err)
			}
		}
	}
	dropped, err := store.NumberACLs(func(name string) (access.ID, bool) {
		p, ok := reg.Lookup(name)
		return p.ID, ok
	})
	if err != nil {
		return err
	}
	for _, name := range dropped {
		slog.Warn("ACL entries dropped: no user or group of this name in the cell's registry; register it (hoard user create) and set them again", "name", name)
	}
	if err := store.DropOldPrincipals(); err != nil {
		return err
	}
	return reg.Prune(ctx)
}
