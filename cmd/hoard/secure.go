package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/credentials"

	"github.com/hoardfs/hoard/cell"
	"github.com/hoardfs/hoard/principal"
	"github.com/hoardfs/hoard/server"
)

// How the commands find their security (docs/security.md): a server or
// proxy its cell identity, a client the cell's CA and the user's token.

// insecureNote is what a process run with --insecure says, loudly, at start.
const insecureNote = "WARNING: --insecure: no TLS and no authentication; anyone who reaches %s can read, change and delete everything. For benchmarks on a machine of your own only."

// serverCell is the identity a server serves with: --cell DIR's, or the
// cell in DATA/cell, made there on the first start (so that one command
// starts a secure server). made reports that it was just made.
func serverCell(dir, data string, lis net.Listener) (id *cell.Identity, made bool, err error) {
	if dir == "" {
		dir = filepath.Join(data, "cell")
		if !cell.Exists(dir) {
			if err := cell.Init(dir, cell.InitOptions{Hosts: hostsOf(lis)}); err != nil {
				return nil, false, fmt.Errorf("making a cell in %s: %w", dir, err)
			}
			made = true
		}
	}
	id, err = cell.Load(dir)
	if err != nil {
		return nil, false, usageError{err}
	}
	return id, made, nil
}

// hostsOf is what a new cell's server certificate must be valid for,
// beyond the host's name and loopback: the address it listens on, or, on
// every interface, each interface's.
func hostsOf(lis net.Listener) []string {
	host, _, _ := net.SplitHostPort(lis.Addr().String())
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsUnspecified() {
		return []string{host}
	}
	var hosts []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			hosts = append(hosts, n.IP.String())
		}
	}
	return hosts
}

// secureServer has cfg check tokens of id's cell, against the cell's
// principal registry, and returns the gRPC credentials to serve with.
func secureServer(cfg *server.Config, id *cell.Identity, principals *principal.Registry) (credentials.TransportCredentials, error) {
	v, err := cell.NewVerifier(id.CA, nil)
	if err != nil {
		return nil, err
	}
	cfg.Users, cfg.Principals, cfg.TLS = server.CellUsers(v, principals), principals, id.ServerTLS()
	return credentials.NewTLS(id.ServerTLS()), nil
}

// madeNote tells whoever started a server that made its cell where its
// admin token is and how to use it.
func madeNote(id *cell.Identity, dir string) string {
	return fmt.Sprintf("made cell %q in %s; its admin token is %s: log in with\n  hoard login --ca %s --file %s",
		id.Cell, dir, filepath.Join(dir, cell.AdminTokenFile), filepath.Join(dir, cell.CAFile), filepath.Join(dir, cell.AdminTokenFile))
}

// securityFlags are a client's: where the cell's CA and the user's token
// are, or that the server is insecure.
type securityFlags struct {
	ca, token string
	insecure  bool
	// caCert is the CA resolve found (nil: insecure): a mount checks the
	// tokens its users hand it with it.
	caCert *x509.Certificate
}

func (sf *securityFlags) add(f *pflag.FlagSet) {
	f.StringVar(&sf.ca, "ca", "", "the cell's CA certificate (env HOARD_CA; default: the one hoard login stored)")
	f.StringVar(&sf.token, "token", "", "a file holding the user's token (env HOARD_TOKEN holds the token itself; default: hoard login's for the cell)")
	f.BoolVar(&sf.insecure, "insecure", false, "talk to a server run with --insecure: no TLS, no token (benchmarks only)")
}

// resolve finds the TLS config and token a client uses: the CA from
// --ca, $HOARD_CA or the default login; the token from --token,
// $HOARD_TOKEN or the login for the CA's cell (none: anonymous).
func (sf *securityFlags) resolve() (*tls.Config, string, error) {
	if sf.insecure {
		return nil, "", nil
	}
	base, _ := cell.ConfigDir()
	caFile := first(sf.ca, os.Getenv("HOARD_CA"))
	if caFile == "" && base != "" {
		if l, ok, err := cell.DefaultLogin(base); err == nil && ok {
			caFile = l.CAFile
		}
	}
	if caFile == "" {
		return nil, "", usagef("no cell CA certificate: give --ca FILE (the cell's ca.crt), or store one with hoard login --ca FILE; --insecure for a server run with --insecure")
	}
	ca, err := cell.LoadCA(caFile)
	if err != nil {
		return nil, "", usageError{err}
	}
	sf.caCert = ca
	tok := os.Getenv("HOARD_TOKEN")
	if sf.token != "" {
		b, err := os.ReadFile(sf.token)
		if err != nil {
			return nil, "", usagef("--token: %v", err)
		}
		tok = string(b)
	}
	if tok == "" && base != "" {
		if l, err := cell.LookupLogin(base, cellName(ca.Subject.CommonName)); err == nil {
			tok = l.Token
		} else if !errors.Is(err, fs.ErrNotExist) && !strings.Contains(err.Error(), "no login") {
			return nil, "", err
		}
	}
	return cell.UserTLS(ca), strings.TrimSpace(tok), nil
}

// cellName is the cell a CA certificate's common name names.
func cellName(cn string) string { return strings.TrimPrefix(cn, "hoard cell ") }

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
