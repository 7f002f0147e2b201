package cell

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"slices"
	"time"
)

// Identity is what a server or proxy proves itself with.
type Identity struct {
	Cell string // the cell's name (from the CA certificate's CommonName "hoard cell NAME")
	Name string // this host's CommonName
	Role Role
	CA   *x509.Certificate
	Pool *x509.CertPool // holds CA only
	Cert tls.Certificate
}

// Load reads an identity directory (CAFile, CertFile, KeyFile) and checks
// that the certificate is signed by the CA and not expired. Errors are one
// line and name the file, e.g. "cell DIR: host.crt: not signed by this cell's CA".
func Load(dir string) (*Identity, error) {
	fail := func(file, format string, args ...any) error {
		return fmt.Errorf("cell %s: %s: %s", dir, file, fmt.Sprintf(format, args...))
	}
	now := time.Now()
	ca, err := readCert(filepath.Join(dir, CAFile), "cell "+dir+": "+CAFile)
	if err != nil {
		return nil, err
	}
	name, err := cellName(ca)
	if err != nil {
		return nil, fail(CAFile, "%v", err)
	}
	if err := inTime(ca, now); err != nil {
		return nil, fail(CAFile, "%v", err)
	}
	cert, err := readCert(filepath.Join(dir, CertFile), "cell "+dir+": "+CertFile)
	if err != nil {
		return nil, err
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return nil, fail(CertFile, "not signed by this cell's CA")
	}
	if err := inTime(cert, now); err != nil {
		return nil, fail(CertFile, "%v", err)
	}
	role, ok := roleOf(cert)
	if !ok {
		return nil, fail(CertFile, "no role (OrganizationalUnit %q): want %s or %s", cert.Subject.OrganizationalUnit, RoleServer, RoleProxy)
	}
	key, err := readKey(filepath.Join(dir, KeyFile), "cell "+dir+": "+KeyFile)
	if err != nil {
		return nil, err
	}
	if pub, ok := cert.PublicKey.(ed25519.PublicKey); !ok || !pub.Equal(key.Public()) {
		return nil, fail(KeyFile, "not the key of %s", CertFile)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &Identity{
		Cell: name,
		Name: cert.Subject.CommonName,
		Role: role,
		CA:   ca,
		Pool: pool,
		Cert: tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert},
	}, nil
}

func inTime(c *x509.Certificate, now time.Time) error {
	if now.After(c.NotAfter) {
		return fmt.Errorf("expired on %s", c.NotAfter.Format(time.RFC3339))
	}
	if now.Before(c.NotBefore) {
		return fmt.Errorf("not valid until %s", c.NotBefore.Format(time.RFC3339))
	}
	return nil
}

// roleOf is the role a certificate gives its holder.
func roleOf(c *x509.Certificate) (Role, bool) {
	for _, ou := range c.Subject.OrganizationalUnit {
		if r := Role(ou); r == RoleServer || r == RoleProxy {
			return r, true
		}
	}
	return "", false
}

// ServerTLS serves TLS 1.3 only (MinVersion tls.VersionTLS13), with the
// identity's certificate; a client certificate is asked for and, when given,
// must be signed by the cell CA (tls.VerifyClientCertIfGiven, ClientCAs = Pool).
// NextProtos must include "h2" (gRPC needs it); the lead adds the data
// channel's protocol by copying the config.
func (id *Identity) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.Cert},
		// Users show no certificate (a token instead); servers and proxies do.
		ClientAuth: tls.VerifyClientCertIfGiven,
		ClientCAs:  id.Pool,
		NextProtos: []string{"h2"},
	}
}

// ClientTLS is the config a server or proxy dials others of the cell with:
// TLS 1.3, RootCAs = Pool, and the identity's certificate as client certificate.
func (id *Identity) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		RootCAs:      id.Pool,
		Certificates: []tls.Certificate{id.Cert},
	}
}

// UserTLS is the config a user's client (the library, the CLI, a mount)
// dials with: TLS 1.3, RootCAs = a pool holding ca, no client certificate.
func UserTLS(ca *x509.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	if ca != nil {
		pool.AddCert(ca)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}
}

// LoadCA reads a CA certificate file (PEM). One-line error naming the file.
func LoadCA(file string) (*x509.Certificate, error) {
	ca, err := readCert(file, file)
	if err != nil {
		return nil, err
	}
	if !ca.IsCA {
		return nil, fmt.Errorf("%s: not a CA certificate (CommonName %q)", file, ca.Subject.CommonName)
	}
	return ca, nil
}

// PeerRole is the verified role and name of a TLS peer's client
// certificate (ok false when the peer showed none). Use
// state.VerifiedChains; the role comes from OrganizationalUnit.
// A verified certificate that gives no role is ok false too: it proves
// nothing the cell grants.
func PeerRole(state tls.ConnectionState) (name string, role Role, ok bool) {
	i := slices.IndexFunc(state.VerifiedChains, func(c []*x509.Certificate) bool { return len(c) > 0 })
	if i < 0 {
		return "", "", false
	}
	leaf := state.VerifiedChains[i][0]
	if role, ok = roleOf(leaf); !ok {
		return "", "", false
	}
	return leaf.Subject.CommonName, role, true
}
