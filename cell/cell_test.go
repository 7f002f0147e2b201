package cell

import (
	"crypto/x509"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// newCell makes a cell named name in a temporary directory.
func newCell(t testing.TB, name string, hosts ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := Init(dir, InitOptions{Name: name, Hosts: hosts}); err != nil {
		t.Fatalf("Init: %v", err)
	}
	return dir
}

func hostname(t testing.TB) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return strings.ToLower(h)
}

func mode(t testing.TB, name string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestInit(t *testing.T) {
	dir := newCell(t, "alpha", "files.example.com", "10.0.0.7")
	if !Exists(dir) {
		t.Fatal("Exists: false after Init")
	}
	if m := mode(t, dir); m != 0o700 {
		t.Errorf("cell directory mode %v, want 0700", m)
	}
	for f, want := range map[string]fs.FileMode{CAFile: 0o644, CAKeyFile: 0o600, CertFile: 0o644, KeyFile: 0o600, AdminTokenFile: 0o600} {
		if m := mode(t, filepath.Join(dir, f)); m != want {
			t.Errorf("%s mode %v, want %v", f, m, want)
		}
	}
	es, _ := os.ReadDir(dir)
	if len(es) != 5 {
		t.Errorf("cell directory holds %d files, want 5 (no temporary ones left)", len(es))
	}

	id, err := Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if id.Cell != "alpha" || id.Role != RoleServer || id.Name != hostname(t) {
		t.Errorf("Load: cell %q role %q name %q, want alpha, server, %q", id.Cell, id.Role, id.Name, hostname(t))
	}
	ca := id.CA
	if ca.Subject.CommonName != "hoard cell alpha" || !ca.IsCA || ca.MaxPathLen != 0 || !ca.MaxPathLenZero {
		t.Errorf("CA: CN %q IsCA %v MaxPathLen %d/%v", ca.Subject.CommonName, ca.IsCA, ca.MaxPathLen, ca.MaxPathLenZero)
	}
	if life := ca.NotAfter.Sub(ca.NotBefore); life < 10*365*24*time.Hour {
		t.Errorf("CA valid for %v, want 10 years", life)
	}
	leaf := id.Cert.Leaf
	for _, h := range []string{"localhost", hostname(t), "files.example.com"} {
		if !slices.Contains(leaf.DNSNames, h) {
			t.Errorf("server certificate DNS names %v lack %s", leaf.DNSNames, h)
		}
	}
	for _, ip := range []string{"127.0.0.1", "::1", "10.0.0.7"} {
		if !slices.ContainsFunc(leaf.IPAddresses, func(a net.IP) bool { return a.Equal(net.ParseIP(ip)) }) {
			t.Errorf("server certificate IPs %v lack %s", leaf.IPAddresses, ip)
		}
	}
	if err := leaf.VerifyHostname("files.example.com"); err != nil {
		t.Error(err)
	}
	if life := leaf.NotAfter.Sub(time.Now()); life < 729*24*time.Hour || life > 731*24*time.Hour {
		t.Errorf("server certificate valid for %v more, want 2 years", life)
	}

	// The admin token is one the cell's CA verifies.
	data, err := os.ReadFile(filepath.Join(dir, AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("admin token: %v", err)
	}
	if c.User != "admin" || c.UID != 0 || !c.Admin || c.Cell != "alpha" {
		t.Errorf("admin token claims %+v", c)
	}
	if life := time.Until(c.Expires); life < 8759*time.Hour || life > 8761*time.Hour {
		t.Errorf("admin token lasts %v, want a year", life)
	}
}

func TestInitDefaults(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c")
	if err := Init(dir, InitOptions{Admin: "root@site", AdminExpires: time.Hour}); err != nil {
		// The test host's name may not be a valid cell name; nothing to test then.
		if strings.Contains(err.Error(), "cell name") {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	id, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile("^" + regexp.QuoteMeta(hostname(t)) + "-[0-9a-f]{4}$").MatchString(id.Cell) {
		t.Errorf("default cell name %q, want the host name %q and four hex digits", id.Cell, hostname(t))
	}
	// A second cell made here is named apart: logins are kept by name.
	other := filepath.Join(t.TempDir(), "c2")
	if err := Init(other, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	if id2, err := Load(other); err != nil || id2.Cell == id.Cell {
		t.Errorf("two default cells named %q and %q (%v)", id.Cell, id2.Cell, err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, AdminTokenFile))
	c, err := Inspect(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	if c.User != "root@site" || time.Until(c.Expires) > time.Hour {
		t.Errorf("admin token %+v: want root@site for an hour", c)
	}
}

// snapshot is a directory's files: name to mode and contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = mode(t, filepath.Join(dir, e.Name())).String() + " " + string(data)
	}
	return m
}

func TestInitRefusesTwice(t *testing.T) {
	dir := newCell(t, "alpha")
	before := snapshot(t, dir)
	err := Init(dir, InitOptions{Name: "beta"})
	if err == nil || err.Error() != "cell already initialised in "+dir {
		t.Fatalf("second Init: %v, want cell already initialised in %s", err, dir)
	}
	if after := snapshot(t, dir); !mapsEqual(before, after) {
		t.Error("second Init changed the cell directory")
	}
	// The key alone is enough to refuse.
	if err := os.Remove(filepath.Join(dir, CAFile)); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, dir)
	if err := Init(dir, InitOptions{Name: "beta"}); err == nil || !strings.Contains(err.Error(), "already initialised") {
		t.Fatalf("Init over a CA key: %v", err)
	}
	if after := snapshot(t, dir); !mapsEqual(before, after) {
		t.Error("Init over a CA key changed the cell directory")
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestInitRefusesBadOptions(t *testing.T) {
	for _, o := range []InitOptions{
		{Name: "../up"},
		{Name: "a b"},
		{Name: strings.Repeat("x", 65)},
		{Name: "ok", Admin: "system:root"},
		{Name: "ok", Admin: "bad user"},
		{Name: "ok", Hosts: []string{"bad host"}},
		{Name: "ok", AdminExpires: -time.Hour},
	} {
		dir := filepath.Join(t.TempDir(), "c")
		if err := Init(dir, o); err == nil {
			t.Errorf("Init(%+v) succeeded", o)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("Init(%+v) failed but made %s", o, dir)
		}
	}
}

func TestIssueCert(t *testing.T) {
	cellDir := newCell(t, "alpha")
	out := filepath.Join(t.TempDir(), "p1")
	if err := IssueCert(cellDir, out, RoleProxy, "edge-1.site", nil); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, out); m != 0o700 {
		t.Errorf("out directory mode %v, want 0700", m)
	}
	if m := mode(t, filepath.Join(out, KeyFile)); m != 0o600 {
		t.Errorf("key mode %v, want 0600", m)
	}
	id, err := Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if id.Cell != "alpha" || id.Name != "edge-1.site" || id.Role != RoleProxy {
		t.Errorf("Load: cell %q name %q role %q", id.Cell, id.Name, id.Role)
	}
	leaf := id.Cert.Leaf
	if !slices.Equal(leaf.DNSNames, []string{"edge-1.site", "localhost"}) || len(leaf.IPAddresses) != 2 {
		t.Errorf("SANs %v %v, want the name, localhost, 127.0.0.1, ::1", leaf.DNSNames, leaf.IPAddresses)
	}
	if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
		t.Errorf("ExtKeyUsage %v", leaf.ExtKeyUsage)
	}
	if leaf.Subject.CommonName != "edge-1.site" || !slices.Equal(leaf.Subject.OrganizationalUnit, []string{"proxy"}) {
		t.Errorf("subject %v", leaf.Subject)
	}
	if leaf.SerialNumber.BitLen() < 64 {
		t.Errorf("serial %v: want a random 128-bit one", leaf.SerialNumber)
	}

	// Hosts given: the name and those, nothing else.
	out2 := filepath.Join(t.TempDir(), "s2")
	if err := IssueCert(cellDir, out2, RoleServer, "s2", []string{"s2.example.com", "192.0.2.1"}); err != nil {
		t.Fatal(err)
	}
	id2, err := Load(out2)
	if err != nil {
		t.Fatal(err)
	}
	if l := id2.Cert.Leaf; id2.Role != RoleServer || !slices.Equal(l.DNSNames, []string{"s2", "s2.example.com"}) || len(l.IPAddresses) != 1 {
		t.Errorf("role %q SANs %v %v", id2.Role, l.DNSNames, l.IPAddresses)
	}

	// Never over an existing certificate.
	before := snapshot(t, out)
	if err := IssueCert(cellDir, out, RoleProxy, "edge-1.site", nil); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second IssueCert: %v", err)
	}
	if !mapsEqual(before, snapshot(t, out)) {
		t.Error("second IssueCert changed the directory")
	}
	// Not into the cell's own directory either: it holds the cell server's.
	if err := IssueCert(cellDir, cellDir, RoleServer, "x", nil); err == nil {
		t.Error("IssueCert over the cell's own certificate succeeded")
	}
}

func TestIssueCertRefuses(t *testing.T) {
	cellDir := newCell(t, "alpha")
	for _, c := range []struct {
		role Role
		name string
	}{
		{RoleServer, ""}, {RoleServer, "../x"}, {RoleServer, "a/b"}, {RoleServer, ".."},
		{RoleProxy, strings.Repeat("p", 65)}, {"admin", "x"}, {"", "x"},
	} {
		out := filepath.Join(t.TempDir(), "o")
		if err := IssueCert(cellDir, out, c.role, c.name, nil); err == nil {
			t.Errorf("IssueCert(%q, %q) succeeded", c.role, c.name)
		}
	}
	// A server's directory has no CA key: nothing can be signed there.
	out := filepath.Join(t.TempDir(), "s")
	if err := IssueCert(cellDir, out, RoleServer, "s", nil); err != nil {
		t.Fatal(err)
	}
	err := IssueCert(out, filepath.Join(t.TempDir(), "t"), RoleServer, "t", nil)
	if err == nil || !strings.Contains(err.Error(), "holds no cell CA key (ca.key)") {
		t.Errorf("IssueCert from a server directory: %v", err)
	}
}

func TestLoadRefuses(t *testing.T) {
	alpha, beta := newCell(t, "alpha"), newCell(t, "beta")
	copyFile := func(from, to string) {
		t.Helper()
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// beta's certificate with alpha's CA.
	out := filepath.Join(t.TempDir(), "p")
	if err := IssueCert(beta, out, RoleProxy, "p", nil); err != nil {
		t.Fatal(err)
	}
	copyFile(filepath.Join(alpha, CAFile), filepath.Join(out, CAFile))
	_, err := Load(out)
	if want := "cell " + out + ": host.crt: not signed by this cell's CA"; err == nil || err.Error() != want {
		t.Errorf("Load of another cell's certificate: %v, want %s", err, want)
	}

	// A key that is not the certificate's.
	out2 := filepath.Join(t.TempDir(), "q")
	if err := IssueCert(alpha, out2, RoleProxy, "q", nil); err != nil {
		t.Fatal(err)
	}
	copyFile(filepath.Join(alpha, KeyFile), filepath.Join(out2, KeyFile))
	if _, err := Load(out2); err == nil || !strings.Contains(err.Error(), "host.key: not the key of host.crt") {
		t.Errorf("Load with the wrong key: %v", err)
	}

	// Missing and garbled files: one line, naming the file.
	empty := t.TempDir()
	if _, err := Load(empty); err == nil || err.Error() != "cell "+empty+": ca.crt: no such file or directory" {
		t.Errorf("Load of an empty directory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(out2, CertFile), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(out2); err == nil || !strings.Contains(err.Error(), "host.crt: ") || strings.Contains(err.Error(), "\n") {
		t.Errorf("Load of a garbled certificate: %v", err)
	}
}

func TestLoadCA(t *testing.T) {
	dir := newCell(t, "alpha")
	ca, err := LoadCA(filepath.Join(dir, CAFile))
	if err != nil || ca.Subject.CommonName != "hoard cell alpha" {
		t.Fatalf("LoadCA: %v, %v", ca, err)
	}
	if _, err := LoadCA(filepath.Join(dir, CertFile)); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("LoadCA of a server certificate: %v", err)
	}
	missing := filepath.Join(dir, "nope.crt")
	if _, err := LoadCA(missing); err == nil || err.Error() != missing+": no such file or directory" {
		t.Errorf("LoadCA of a missing file: %v", err)
	}
}
