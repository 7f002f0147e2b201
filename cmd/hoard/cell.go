package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/mount/loginsock"
)

func cellCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cell", Short: "make a cell's identity: its CA, and certificates for its servers and proxies",
		Example: `  hoard cell init --dir /etc/hoard/cell --name lab
  hoard cell cert --dir /etc/hoard/cell --proxy edge1 --host edge1.example.com`}
	cmd.AddCommand(cellInitCmd(), cellCertCmd())
	return cmd
}

func cellInitCmd() *cobra.Command {
	var dir, name, admin string
	var hosts []string
	var expires time.Duration
	cmd := &cobra.Command{
		Use:   "init --dir DIR [--name NAME] [--host H]... [--admin NAME]",
		Short: "make a new cell in DIR: its CA, this host's server certificate, and a token for its first admin",
		Example: `  hoard cell init --dir /etc/hoard/cell
  hoard cell init --dir ./cell --name lab --host files.lab.example.com --host 10.0.0.5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usagef("--dir DIR is required")
			}
			if expires <= 0 {
				return usagef("--admin-expires %v: want a positive duration", expires)
			}
			if err := cell.Init(dir, cell.InitOptions{Name: name, Hosts: hosts, Admin: admin, AdminExpires: expires}); err != nil {
				return err
			}
			id, err := cell.Load(dir)
			if err != nil {
				return err
			}
			token := filepath.Join(dir, cell.AdminTokenFile)
			data, err := os.ReadFile(token)
			if err != nil {
				return err
			}
			c, err := cell.Inspect(strings.TrimSpace(string(data)))
			if err != nil {
				return fmt.Errorf("%s: %v", token, err)
			}
			fmt.Printf("cell %s made in %s:\n", id.Cell, dir)
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "  %s\tthe cell's CA certificate: give it to its users\n", cell.CAFile)
			fmt.Fprintf(tw, "  %s\tthe CA's key: it signs certificates and tokens, keep it secret\n", cell.CAKeyFile)
			fmt.Fprintf(tw, "  %s, %s\tthis host's server certificate (%s, valid for %s)\n", cell.CertFile, cell.KeyFile,
				id.Name, strings.Join(sanList(id), ", "))
			fmt.Fprintf(tw, "  %s\ta token for %s, an admin, until %s\n", cell.AdminTokenFile, c.User, c.Expires.Format(time.RFC3339))
			tw.Flush()
			fmt.Printf("\nNext: serve with `hoard server --data D --cell %s`, and log in as %s with `hoard login --ca %s --file %s`.\n",
				dir, c.User, filepath.Join(dir, cell.CAFile), token)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory for the cell's files (created 0700)")
	f.StringVar(&name, "name", "", "the cell's name (default: this host's name and four random hex digits, e.g. files-3fa2)")
	f.StringSliceVar(&hosts, "host", nil, "another DNS name or IP address the server certificate is valid for (repeatable)")
	f.StringVar(&admin, "admin", "admin", "the first admin's user name")
	f.DurationVar(&expires, "admin-expires", 8760*time.Hour, "how long the admin token lasts")
	return cmd
}

// sanList is the names and addresses id's certificate is valid for.
func sanList(id *cell.Identity) []string {
	l := append([]string(nil), id.Cert.Leaf.DNSNames...)
	for _, ip := range id.Cert.Leaf.IPAddresses {
		l = append(l, ip.String())
	}
	return l
}

func cellCertCmd() *cobra.Command {
	var dir, server, proxy, out string
	var hosts []string
	cmd := &cobra.Command{
		Use:   "cert --dir CELLDIR (--server NAME | --proxy NAME) [--host H]... [--out OUTDIR]",
		Short: "make a certificate for another server or a proxy of the cell",
		Long: `Make a certificate for another server or a proxy of the cell, signed by the
cell's CA, into OUTDIR (default CELLDIR/servers/NAME or CELLDIR/proxies/NAME):
the CA certificate, the certificate and its key. Copy OUTDIR to the host that
runs it. Without --host the certificate is valid for NAME, localhost,
127.0.0.1 and ::1; with it, for NAME and the hosts given.`,
		Example: `  hoard cell cert --dir /etc/hoard/cell --server files2 --host files2.example.com
  hoard cell cert --dir /etc/hoard/cell --proxy edge1 --host 10.1.0.9 --out /tmp/edge1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usagef("--dir CELLDIR is required")
			}
			if (server == "") == (proxy == "") {
				return usagef("give one of --server NAME and --proxy NAME")
			}
			role, name, sub := cell.RoleServer, server, "servers"
			if proxy != "" {
				role, name, sub = cell.RoleProxy, proxy, "proxies"
			}
			if out == "" {
				out = filepath.Join(dir, sub, name)
			}
			if err := cell.IssueCert(dir, out, role, name, hosts); err != nil {
				return err
			}
			id, err := cell.Load(out)
			if err != nil {
				return err
			}
			fmt.Printf("%s %s of cell %s: certificate in %s, valid for %s until %s\n", role, name, id.Cell, out,
				strings.Join(sanList(id), ", "), id.Cert.Leaf.NotAfter.Format(time.RFC3339))
			fmt.Printf("Copy %s to the host that runs it, and give it there as its cell directory (--cell).\n", out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the cell's directory (made by hoard cell init; it holds the CA key)")
	f.StringVar(&server, "server", "", "make a server's certificate, for the server NAME")
	f.StringVar(&proxy, "proxy", "", "make a proxy's certificate, for the proxy NAME")
	f.StringSliceVar(&hosts, "host", nil, "a DNS name or IP address the certificate is valid for (repeatable)")
	f.StringVar(&out, "out", "", "directory to write into (default CELLDIR/servers/NAME or CELLDIR/proxies/NAME)")
	return cmd
}

// tokenCmd is the parent of the token commands.
func tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "issue and revoke the cell's users' tokens",
		Example: `  hoard token issue --cell /etc/hoard/cell --user alice --uid 1001 --out alice.token`}
	cmd.AddCommand(tokenIssueCmd(), tokenRevokeCmd())
	return cmd
}

func tokenIssueCmd() *cobra.Command {
	var dir, user, out string
	var uid uint32
	var expires time.Duration
	var admin bool
	cmd := &cobra.Command{
		Use:   "issue --cell DIR --user NAME --uid N [--expires 720h] [--admin]",
		Short: "issue a token to a user: printed on stdout, for hoard login",
		Long: `Issue a token to a user, signed by the cell's CA key (so where the cell was
made). The token alone is printed on stdout; what it says goes to stderr.
--uid is the user's number in the cell; an admin's defaults to 0.`,
		Example: `  hoard token issue --cell /etc/hoard/cell --user alice --uid 1001 --out alice.token
  hoard token issue --cell /etc/hoard/cell --user ops --admin --expires 24h | ssh ops@desk hoard login`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" || user == "" {
				return usagef("--cell DIR and --user NAME are required")
			}
			// uid 0 is root's: no token gets it by default but an admin's.
			if !admin && !cmd.Flags().Changed("uid") {
				return usagef("--uid N is required (but for an --admin token, 0 by default)")
			}
			if expires <= 0 {
				return usagef("--expires %v: want a positive duration", expires)
			}
			iss, err := cell.LoadIssuer(dir)
			if err != nil {
				return usageError{err}
			}
			token, c, err := iss.Issue(cell.Claims{User: user, UID: uid, Admin: admin}, expires)
			if err != nil {
				return err
			}
			if out != "" {
				// 0600 from the start: a shell's > makes it 0644 first.
				if err := writePrivate(out, []byte(token+"\n")); err != nil {
					return err
				}
			} else {
				fmt.Println(token)
			}
			what := ""
			if c.Admin {
				what = ", admin"
			}
			fmt.Fprintf(os.Stderr, "token for %s (uid %d%s) of cell %s, id %s, expires %s\n", c.User, c.UID, what, c.Cell, c.ID, c.Expires.Format(time.RFC3339))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "cell", "", "the cell's directory (made by hoard cell init; it holds the CA key)")
	f.StringVar(&user, "user", "", "the user's name")
	f.Uint32Var(&uid, "uid", 0, "the user's number")
	f.DurationVar(&expires, "expires", 720*time.Hour, "how long the token lasts")
	f.BoolVar(&admin, "admin", false, "the user administers the cell")
	f.StringVar(&out, "out", "", "write the token to this file, readable by its owner alone (0600), instead of stdout")
	return cmd
}

// writePrivate writes b to path, made 0600 before a byte is in it, and
// refuses to replace a file that is there.
func writePrivate(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return usageError{err}
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

func loginCmd() *cobra.Command {
	var file, caFile string
	cmd := &cobra.Command{
		Use:   "login [--file F] [--ca FILE]",
		Short: "store a token (from F or stdin), so hoard's clients act as its user",
		Long: `Store a token, read from F or stdin, with the cell's CA certificate if given,
under the user's configuration directory ($XDG_CONFIG_HOME/hoard or
~/.config/hoard). Its cell becomes the default one. The mounts running on
this machine are told too (as AFS's aklog tells its cache manager): from
then on they act for the user who runs this with the token.`,
		Example: `  hoard login --ca /etc/hoard/cell/ca.crt --file /etc/hoard/cell/admin.token
  hoard token issue --cell /etc/hoard/cell --user alice --uid 1001 | hoard login`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			base, err := cell.ConfigDir()
			if err != nil {
				return err
			}
			var caPEM []byte
			if caFile != "" {
				if _, err := cell.LoadCA(caFile); err != nil {
					return usageError{err}
				}
				if caPEM, err = os.ReadFile(caFile); err != nil {
					return err
				}
			}
			token, err := readToken(file)
			if err != nil {
				return err
			}
			l, err := cell.SaveLogin(base, token, caPEM)
			if err != nil {
				return err
			}
			fmt.Printf("logged in to cell %s as %s until %s\n", l.Cell, l.Claims.User, l.Claims.Expires.Format(time.RFC3339))
			if n := tellMounts(loginsock.Request{Op: "login", Token: token}); n > 0 {
				return fmt.Errorf("the token is stored, but %d running mount(s) could not be told it (above): run hoard login again", n)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&file, "file", "", "read the token from this file (default: stdin)")
	cmd.Flags().StringVar(&caFile, "ca", "", "the cell's CA certificate (its ca.crt), to check its servers by")
	return cmd
}

// readToken reads a token from file, or stdin if file is "": a line
// typed at a terminal, else all of it.
func readToken(file string) (string, error) {
	var r io.Reader = os.Stdin
	from := "stdin"
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return "", usagef("--file %s: %v", file, err)
		}
		defer f.Close()
		r, from = f, file
	} else if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		fmt.Fprint(os.Stderr, "token: ")
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && err != io.EOF {
			return "", err
		}
		r = strings.NewReader(line)
	}
	// A token is short: more than a few of them is not one.
	data, err := io.ReadAll(io.LimitReader(r, 4*cell.MaxToken))
	if err != nil {
		return "", fmt.Errorf("%s: %v", from, err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("no token in %s", from)
	}
	return token, nil
}

func tokensCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "tokens",
		Short:   "list the stored logins: a token for each cell",
		Example: `  hoard tokens`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			base, err := cell.ConfigDir()
			if err != nil {
				return err
			}
			ls, err := cell.Logins(base)
			if err != nil {
				return err
			}
			if len(ls) == 0 {
				fmt.Println("no tokens: run hoard login")
				return nil
			}
			def, _, err := cell.DefaultLogin(base)
			if err != nil {
				return err
			}
			now := time.Now()
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "CELL\tUSER\tUID\tADMIN\tEXPIRES")
			for _, l := range ls {
				var marks []string
				if l.Cell == def.Cell {
					marks = append(marks, "(default)")
				}
				if !now.Before(l.Claims.Expires) {
					marks = append(marks, "expired")
				}
				adm := "no"
				if l.Claims.Admin {
					adm = "yes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s", l.Cell, l.Claims.User, l.Claims.UID, adm, l.Claims.Expires.Format(time.RFC3339))
				if len(marks) > 0 {
					fmt.Fprintf(tw, "\t%s", strings.Join(marks, " "))
				}
				fmt.Fprintln(tw)
			}
			return tw.Flush()
		},
	}
}

func logoutCmd() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "logout [--cell NAME]",
		Short: "forget the token of a cell (the default one if none is named); the mounts of that cell running here forget it too",
		Example: `  hoard logout
  hoard logout --cell lab`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			base, err := cell.ConfigDir()
			if err != nil {
				return err
			}
			if name == "" {
				l, ok, err := cell.DefaultLogin(base)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("no default login to forget: name the cell with --cell (hoard tokens lists them)")
				}
				name = l.Cell
			}
			if err := cell.Logout(base, name); err != nil {
				return err
			}
			fmt.Printf("logged out of cell %s\n", name)
			if n := tellMounts(loginsock.Request{Op: "logout", Cell: name}); n > 0 {
				return fmt.Errorf("%d running mount(s) could not be told (above) and still act with the token: run hoard logout again, or revoke the token", n)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "cell", "", "the cell to log out of (default: the default cell)")
	return cmd
}

// tellMounts hands req to every mount running here that this user may
// reach, saying which it told, and returns how many running mounts it
// could not tell: one that does not answer (busy). A mount's refusal (a
// mount of another cell, say) and a socket nobody listens on any more (a
// mount that died) are noted.
func tellMounts(req loginsock.Request) (untold int) {
	for _, sock := range loginsock.Sockets() {
		rep, err := loginsock.Tell(sock, req)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, fs.ErrNotExist):
			fmt.Fprintf(os.Stderr, "hoard: note: no mount listens on %s any more; skipped\n", sock)
		case err != nil:
			if u := errors.Unwrap(err); u != nil {
				err = u
			}
			fmt.Fprintf(os.Stderr, "hoard: the mount socket %s does not answer (%v)\n", sock, err)
			untold++
		case rep.Error != "":
			fmt.Fprintf(os.Stderr, "hoard: note: the mount at %s: %s\n", first(rep.Mount, sock), rep.Error)
		default:
			fmt.Printf("told the mount at %s\n", rep.Mount)
		}
	}
	return untold
}
