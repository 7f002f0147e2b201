// Package cell is a hoard cell's identity: its certificate authority, the
// certificates of its servers and proxies, and the tokens it issues to users.
package cell

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Files of an identity directory. A cell directory (Init) has all of them;
// a server's or proxy's directory (IssueCert) has CAFile, CertFile, KeyFile.
const (
	CAFile         = "ca.crt"      // the cell CA's certificate (PEM)
	CAKeyFile      = "ca.key"      // its Ed25519 private key (PEM PKCS#8, 0600): signs certificates and tokens
	CertFile       = "host.crt"    // this server's or proxy's certificate
	KeyFile        = "host.key"    // its key (0600)
	AdminTokenFile = "admin.token" // a token for the cell's first admin (0600)
)

// Role is what a certificate's holder is in the cell: it is written in the
// certificate's Subject.OrganizationalUnit.
type Role string

// The roles a certificate can give.
const (
	RoleServer Role = "server"
	RoleProxy  Role = "proxy"
)

// InitOptions says how Init makes a cell; the zero value is a cell named
// after this host (defaultName).
type InitOptions struct {
	Name         string        // the cell's name; default: defaultName
	Hosts        []string      // more names or IP addresses the server certificate is valid for
	Admin        string        // the admin user's name; default "admin"
	AdminExpires time.Duration // the admin token's lifetime; default 8760h (a year)
}

const (
	caPrefix     = "hoard cell " // a CA's CommonName: the prefix, then the cell's name
	caLifetime   = 10 * 365 * 24 * time.Hour
	certLifetime = 2 * 365 * 24 * time.Hour
	skew         = time.Hour // NotBefore is this far back, for clocks behind ours
)

// nameRE is a cell's, server's or proxy's name: it becomes a directory
// name and a certificate's CommonName, so nothing that could be a path.
var nameRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,64}$`)

// hostRE is a DNS name a certificate is valid for (a leading "*." for a
// wildcard).
var hostRE = regexp.MustCompile(`^(\*\.)?[a-zA-Z0-9_]([a-zA-Z0-9._-]{0,252})$`)

func checkName(what, name string) error {
	if !nameRE.MatchString(name) || name == "." || name == ".." {
		return fmt.Errorf("%s name %q: want 1 to 64 of a-z, A-Z, 0-9, '.', '_', '-'", what, name)
	}
	return nil
}

// defaultName is the name of a cell made on host without one: the host's
// name and four random hex digits. Two cells made on one machine (a
// test's and make run's) then differ, and so do the logins kept by
// cell name, one of which would otherwise replace the other.
func defaultName(host string) string {
	var b [2]byte
	rand.Read(b[:])
	if len(host) > 59 {
		host = host[:59]
	}
	return fmt.Sprintf("%s-%x", host, b)
}

// Init makes a new cell in dir (created 0700 if missing): a CA (Ed25519,
// self-signed, CommonName "hoard cell NAME", valid 10 years, IsCA, MaxPathLen 0),
// a server certificate for this host (CommonName = the host name, role server,
// SANs: "localhost", the host name, 127.0.0.1, ::1, and o.Hosts; valid 2 years),
// and an admin token (user o.Admin, uid 0, Admin true). It refuses, changing
// nothing, when dir already holds a CA (CAFile or CAKeyFile): error
// "cell already initialised in DIR". Files are written atomically (temp + rename).
func Init(dir string, o InitOptions) error {
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("the host name: %v", err)
	}
	host = strings.ToLower(host)
	if o.Name == "" {
		o.Name = defaultName(host)
	}
	if err := checkName("cell", o.Name); err != nil {
		return err
	}
	if o.Admin == "" {
		o.Admin = "admin"
	}
	if err := checkUser(o.Admin); err != nil {
		return err
	}
	if o.AdminExpires == 0 {
		o.AdminExpires = 8760 * time.Hour
	}
	if o.AdminExpires < 0 {
		return fmt.Errorf("admin token lifetime %v: want a positive one", o.AdminExpires)
	}
	dns, ips, err := sans(append([]string{"localhost", host, "127.0.0.1", "::1"}, o.Hosts...))
	if err != nil {
		return err
	}
	for _, f := range []string{CAFile, CAKeyFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("cell already initialised in %s", dir)
		}
	}

	// Everything is made before anything is written.
	now := time.Now()
	caKey, ca, err := newCA(o.Name, now)
	if err != nil {
		return err
	}
	hostKey, hostCert, err := newLeaf(ca, caKey, RoleServer, host, dns, ips, now)
	if err != nil {
		return err
	}
	iss := &Issuer{key: caKey, cell: o.Name, now: func() time.Time { return now }}
	token, _, err := iss.Issue(Claims{User: o.Admin, UID: 0, Admin: true}, o.AdminExpires)
	if err != nil {
		return err
	}
	caKeyPEM, err := keyPEM(caKey)
	if err != nil {
		return err
	}
	hostKeyPEM, err := keyPEM(hostKey)
	if err != nil {
		return err
	}

	// The CA last: until its certificate is there the cell does not exist
	// (Exists), and a failed Init can simply be run again.
	return writeAll(dir, fmt.Errorf("cell already initialised in %s", dir),
		idFile{KeyFile, hostKeyPEM, 0o600, false},
		idFile{CertFile, certPEM(hostCert.Raw), 0o644, false},
		idFile{AdminTokenFile, []byte(token + "\n"), 0o600, false},
		idFile{CAKeyFile, caKeyPEM, 0o600, true},
		idFile{CAFile, certPEM(ca.Raw), 0o644, true})
}

// idFile is one file of an identity directory; an exclusive one is never
// written over.
type idFile struct {
	name string
	data []byte
	perm fs.FileMode
	excl bool
}

// writeAll makes dir (0700) and writes files into it in order; exists is
// the error when an exclusive one is there already.
func writeAll(dir string, exists error, files ...idFile) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%s: %s", dir, why(err))
	}
	for _, f := range files {
		err := writeFile(filepath.Join(dir, f.name), f.data, f.perm, f.excl)
		if errors.Is(err, fs.ErrExist) {
			return exists
		}
		if err != nil {
			return fmt.Errorf("%s: writing %s: %s", dir, f.name, why(err))
		}
	}
	return nil
}

// Exists reports whether dir holds a cell's CA certificate.
func Exists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, CAFile))
	return err == nil
}

// IssueCert makes a certificate for a server or proxy named name, signed by
// the CA in cellDir (which must hold CAKeyFile), into outDir (created 0700):
// CAFile, CertFile, KeyFile. hosts are the DNS names / IPs it is valid for
// (name itself is always added as a DNS SAN; if hosts is empty, also
// localhost, 127.0.0.1 and ::1). The role goes in the certificate's
// Subject.OrganizationalUnit ("server" or "proxy"); CommonName = name.
// ExtKeyUsage: both ServerAuth and ClientAuth. Refuses to overwrite an
// existing CertFile in outDir. Names: 1..64 chars of [a-zA-Z0-9._-].
func IssueCert(cellDir, outDir string, role Role, name string, hosts []string) error {
	if role != RoleServer && role != RoleProxy {
		return fmt.Errorf("role %q: want %s or %s", role, RoleServer, RoleProxy)
	}
	if err := checkName(string(role), name); err != nil {
		return err
	}
	all := append([]string{name}, hosts...)
	if len(hosts) == 0 {
		all = append(all, "localhost", "127.0.0.1", "::1")
	}
	dns, ips, err := sans(all)
	if err != nil {
		return err
	}
	caKey, ca, err := loadCA(cellDir, "certificates")
	if err != nil {
		return err
	}
	out := filepath.Join(outDir, CertFile)
	exists := fmt.Errorf("%s already exists: a certificate is not overwritten (remove it first to issue another)", out)
	if _, err := os.Lstat(out); err == nil {
		return exists
	}
	key, cert, err := newLeaf(ca, caKey, role, name, dns, ips, time.Now())
	if err != nil {
		return err
	}
	kp, err := keyPEM(key)
	if err != nil {
		return err
	}
	// The certificate last: its presence is what refuses a second issue.
	return writeAll(outDir, exists,
		idFile{KeyFile, kp, 0o600, false},
		idFile{CAFile, certPEM(ca.Raw), 0o644, false},
		idFile{CertFile, certPEM(cert.Raw), 0o644, true})
}

// loadCA reads the CA key and certificate of the cell in dir, and checks
// they belong together; what is what the key is wanted for, to say where
// those are made when it is missing.
func loadCA(dir, what string) (ed25519.PrivateKey, *x509.Certificate, error) {
	keyFile := filepath.Join(dir, CAKeyFile)
	if _, err := os.Stat(keyFile); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("%s holds no cell CA key (%s): %s are issued where the cell was made", dir, CAKeyFile, what)
	}
	key, err := readKey(keyFile, "cell "+dir+": "+CAKeyFile)
	if err != nil {
		return nil, nil, err
	}
	ca, err := readCert(filepath.Join(dir, CAFile), "cell "+dir+": "+CAFile)
	if err != nil {
		return nil, nil, err
	}
	if _, err := cellName(ca); err != nil {
		return nil, nil, fmt.Errorf("cell %s: %s: %v", dir, CAFile, err)
	}
	if pub, ok := ca.PublicKey.(ed25519.PublicKey); !ok || !pub.Equal(key.Public()) {
		return nil, nil, fmt.Errorf("cell %s: %s is not the key of %s", dir, CAKeyFile, CAFile)
	}
	return key, ca, nil
}

// cellName is the name of the cell whose CA is ca.
func cellName(ca *x509.Certificate) (string, error) {
	name, ok := strings.CutPrefix(ca.Subject.CommonName, caPrefix)
	if !ok || !ca.IsCA || checkName("cell", name) != nil {
		return "", fmt.Errorf("not a hoard cell CA (CommonName %q)", ca.Subject.CommonName)
	}
	return name, nil
}

// sans sorts hosts into DNS names and IP addresses, without repeats.
func sans(hosts []string) (dns []string, ips []net.IP, err error) {
	seen := map[string]bool{}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !seen[ip.String()] {
				seen[ip.String()] = true
				ips = append(ips, ip)
			}
			continue
		}
		if !hostRE.MatchString(h) {
			return nil, nil, fmt.Errorf("host %q: not a DNS name or an IP address", h)
		}
		if h = strings.ToLower(h); !seen[h] {
			seen[h] = true
			dns = append(dns, h)
		}
	}
	return dns, ips, nil
}

// serial is a random, positive 128-bit serial number.
func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	if n.Sign() == 0 {
		n.SetInt64(1)
	}
	return n, nil
}

func newCA(name string, now time.Time) (ed25519.PrivateKey, *x509.Certificate, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: caPrefix + name},
		NotBefore:             now.Add(-skew),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true, // it signs servers and proxies, never another CA
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, nil, fmt.Errorf("making the CA certificate: %v", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return key, ca, nil
}

func newLeaf(ca *x509.Certificate, caKey ed25519.PrivateKey, role Role, name string, dns []string, ips []net.IP, now time.Time) (ed25519.PrivateKey, *x509.Certificate, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(certLifetime)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter // it could not be verified past its CA anyway
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name, OrganizationalUnit: []string{string(role)}},
		NotBefore:             now.Add(-skew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		DNSNames:              dns,
		IPAddresses:           ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("making the certificate of %s: %v", name, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return key, c, nil
}
