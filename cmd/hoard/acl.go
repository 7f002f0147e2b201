package main

import (
	"fmt"
	"github.com/hoardfs/hoard/client/admin"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client/pathfs"
)

// The access-control commands: whoami, acl, group, token revoke. Each
// asks the server, which decides.

func whoamiCmd() *cobra.Command {
	cmd := withAdmin("whoami", "say whom the server takes you to be", cobra.NoArgs, nil, func(c *pathfs.FS, args []string) error {
		id, err := c.Admin().WhoAmI()
		if err != nil {
			return err
		}
		fmt.Println(describeID(id))
		return nil
	})
	cmd.Example = "  hoard whoami --ca .hoard/server/cell/ca.crt"
	return cmd
}

func describeID(id access.Identity) string {
	if id.Anonymous() {
		return "anonymous (no token: you get what system:anyuser is granted)"
	}
	s := fmt.Sprintf("%s (uid %d", id.User, id.UID)
	if id.Admin {
		s += ", admin"
	}
	if len(id.Groups) > 0 {
		s += ", groups " + strings.Join(id.Groups, " ")
	}
	return s + ")"
}

func aclCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "acl", Short: "read and change directories' access control lists (AFS rights rlidwka)"}
	get := withAdmin("get PATH", "show the ACL governing a file or directory", cobra.ExactArgs(1), nil, func(c *pathfs.FS, args []string) error {
		a, err := c.Admin().GetACL(args[0])
		if err != nil {
			return err
		}
		printACL(a)
		return nil
	})
	get.Example = "  hoard acl get /projects"
	checkEntry := func(cmd *cobra.Command, args []string) error {
		if _, err := access.ParseRights(args[2]); err != nil {
			return usagef("rights %q: %v", args[2], err)
		}
		if strings.HasPrefix(args[1], "#") {
			return nil // a principal that no longer exists, by number: the server checks it
		}
		if err := access.CheckName(args[1]); err != nil {
			return usagef("%v", err)
		}
		return nil
	}
	set := withAdmin("set PATH WHO RIGHTS", "give a user or group rights in a directory (RIGHTS: letters of rlidwka, or read, write, all, none)", cobra.MatchAll(cobra.ExactArgs(3), checkEntry), nil, func(c *pathfs.FS, args []string) error {
		r, _ := access.ParseRights(args[2])
		a, err := c.Admin().SetACL(args[0], args[1], r)
		if err != nil {
			return err
		}
		printACL(a)
		sayUnreleased(c, args[0])
		return nil
	})
	set.Example = "  hoard acl set /projects/web alice write\n  hoard acl set /projects/web system:anyuser none\n  hoard acl set /projects/web alice:friends rl\n  hoard acl set /projects/web '#1042' none   # a deleted principal's entry"
	cmd.AddCommand(get, set)
	return cmd
}

func printACL(a admin.ACL) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WHO\tRIGHTS")
	for _, e := range a.Entries {
		fmt.Fprintf(tw, "%s\t%s\n", e.Who, e.Rights)
	}
	tw.Flush()
	fmt.Printf("your rights here: %s\n", a.Mine)
}

func groupCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "group", Short: "manage protection groups (AFS's pts): a user's are named USER:NAME, its owner changes it",
		Long: `Manage the cell's protection groups. Any user may make groups named after
themselves, USER:NAME (alice:friends); only admins make others (staff). A
group's owner or an admin adds and removes its members, who must be users
of the cell's registry. ACL entries name a group by its number, so a group
deleted and made again does not get the old one's rights back.`}
	change := func(use, short, example string, n int, kind admin.GroupChange) *cobra.Command {
		cmd := withAdmin(use, short, cobra.ExactArgs(n), nil, func(c *pathfs.FS, args []string) error {
			member := ""
			if n > 1 {
				member = args[1]
			}
			return c.Admin().ChangeGroup(kind, args[0], member)
		})
		cmd.Example = example
		return cmd
	}
	create := change("create GROUP", "make a group you own (yours: USER:NAME; others: admins)", "  hoard group create alice:friends", 1, admin.GroupCreate)
	del := change("delete GROUP", "delete a group", "  hoard group delete alice:friends", 1, admin.GroupDelete)
	add := change("add GROUP USER", "add a user to a group", "  hoard group add alice:friends bob", 2, admin.GroupAdd)
	rm := change("remove GROUP USER", "remove a user from a group", "  hoard group remove alice:friends bob", 2, admin.GroupRemove)
	list := withAdmin("list", "list the groups and their members", cobra.NoArgs, nil, func(c *pathfs.FS, args []string) error {
		gs, _, err := c.Admin().Groups()
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "GROUP\tOWNER\tMEMBERS")
		for _, g := range gs {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", g.Name, g.Owner, strings.Join(g.Members, " "))
		}
		return tw.Flush()
	})
	cmd.AddCommand(create, del, add, rm, list)
	return cmd
}

// userCmd registers and lists the cell's users (AFS's pts createuser).
func userCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "user", Short: "the cell's users: a name and a uid each, unique in the cell",
		Long: `The cell's registry gives every user one name and one uid, and no uid to two
names. A user is registered by the first use of their token, with the uid
it says; a token that names a registered user with another uid, or another
user's uid, is refused. Register a user ahead of that (to name them in an
ACL first) with hoard user create.`,
		Example: "  hoard user create alice --uid 1001\n  hoard user list"}
	var uid uint32
	create := withAdmin("create NAME --uid N", "register a user with their uid (admins)", cobra.ExactArgs(1),
		func(f *pflag.FlagSet) { f.Uint32Var(&uid, "uid", 0, "the user's uid (not 0 or 65534)") },
		func(c *pathfs.FS, args []string) error { return c.Admin().CreateUser(args[0], uid) })
	create.Example = "  hoard user create alice --uid 1001"
	list := withAdmin("list", "list the cell's users and their uids (admins)", cobra.NoArgs, nil, func(c *pathfs.FS, args []string) error {
		_, us, err := c.Admin().Groups()
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "USER\tUID\tID")
		for _, u := range us {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", u.Name, u.UID, u.ID)
		}
		return tw.Flush()
	})
	list.Example = "  hoard user list"
	cmd.AddCommand(create, list)
	return cmd
}

// tokenRevokeCmd revokes a token at a server: given the token itself (or
// a file holding it), its id and expiry are read from it.
func tokenRevokeCmd() *cobra.Command {
	var id string
	cmd := withAdmin("revoke [TOKEN|FILE]", "have the server refuse a token from now on (admins)", cobra.MaximumNArgs(1),
		func(f *pflag.FlagSet) {
			f.StringVar(&id, "id", "", "the token's id (as hoard token issue printed it), instead of the token")
		},
		func(c *pathfs.FS, args []string) error {
			var expires time.Time
			switch {
			case len(args) == 1 && id != "":
				return usagef("give the token or --id, not both")
			case len(args) == 1:
				tok := args[0]
				if b, err := os.ReadFile(tok); err == nil {
					tok = string(b)
				}
				claims, err := cell.Inspect(strings.TrimSpace(tok))
				if err != nil {
					return usagef("%s: neither a token nor a file holding one: %v", args[0], err)
				}
				id, expires = claims.ID, claims.Expires
			case id == "":
				return usagef("hoard token revoke: needs TOKEN, FILE or --id ID")
			}
			if err := c.Admin().RevokeToken(id, expires); err != nil {
				return err
			}
			fmt.Printf("token %s revoked\n", id)
			return nil
		})
	cmd.Example = "  hoard token revoke --id 3f2a...\n  hoard token revoke alice.token"
	return cmd
}
