package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hoardfs/hoard/access"
	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/client"
)

// The access-control commands: whoami, acl, group, token revoke. Each
// asks the server, which decides.

func whoamiCmd() *cobra.Command {
	cmd := withAdmin("whoami", "say whom the server takes you to be", cobra.NoArgs, nil, func(c *client.Client, args []string) error {
		id, err := c.WhoAmI()
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
	get := withAdmin("get PATH", "show the ACL governing a file or directory", cobra.ExactArgs(1), nil, func(c *client.Client, args []string) error {
		a, err := c.GetACL(args[0])
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
		if err := access.CheckName(args[1]); err != nil {
			return usagef("%v", err)
		}
		return nil
	}
	set := withAdmin("set PATH WHO RIGHTS", "give a user or group rights in a directory (RIGHTS: letters of rlidwka, or read, write, all, none)", cobra.MatchAll(cobra.ExactArgs(3), checkEntry), nil, func(c *client.Client, args []string) error {
		r, _ := access.ParseRights(args[2])
		a, err := c.SetACL(args[0], args[1], r)
		if err != nil {
			return err
		}
		printACL(a)
		return nil
	})
	set.Example = "  hoard acl set /projects/web alice write\n  hoard acl set /projects/web system:anyuser none\n  hoard acl set /projects/web staff rl"
	cmd.AddCommand(get, set)
	return cmd
}

func printACL(a client.ACL) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WHO\tRIGHTS")
	for _, e := range a.Entries {
		fmt.Fprintf(tw, "%s\t%s\n", e.Who, e.Rights)
	}
	tw.Flush()
	fmt.Printf("your rights here: %s\n", a.Mine)
}

func groupCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "group", Short: "manage protection groups (AFS's pts): any user may make one, its owner changes it"}
	change := func(use, short, example string, n int, kind client.GroupChange) *cobra.Command {
		cmd := withAdmin(use, short, cobra.ExactArgs(n), nil, func(c *client.Client, args []string) error {
			member := ""
			if n > 1 {
				member = args[1]
			}
			return c.ChangeGroup(kind, args[0], member)
		})
		cmd.Example = example
		return cmd
	}
	create := change("create GROUP", "make a group you own", "  hoard group create staff", 1, client.GroupCreate)
	del := change("delete GROUP", "delete a group", "  hoard group delete staff", 1, client.GroupDelete)
	add := change("add GROUP USER", "add a user to a group", "  hoard group add staff alice", 2, client.GroupAdd)
	rm := change("remove GROUP USER", "remove a user from a group", "  hoard group remove staff alice", 2, client.GroupRemove)
	list := withAdmin("list", "list the groups and their members", cobra.NoArgs, nil, func(c *client.Client, args []string) error {
		gs, err := c.Groups()
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

// tokenRevokeCmd revokes a token at a server: given the token itself (or
// a file holding it), its id and expiry are read from it.
func tokenRevokeCmd() *cobra.Command {
	var id string
	cmd := withAdmin("revoke [TOKEN|FILE]", "have the server refuse a token from now on (admins)", cobra.MaximumNArgs(1),
		func(f *pflag.FlagSet) {
			f.StringVar(&id, "id", "", "the token's id (as hoard token issue printed it), instead of the token")
		},
		func(c *client.Client, args []string) error {
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
			if err := c.RevokeToken(id, expires); err != nil {
				return err
			}
			fmt.Printf("token %s revoked\n", id)
			return nil
		})
	cmd.Example = "  hoard token revoke --id 3f2a...\n  hoard token revoke alice.token"
	return cmd
}
