package cell

import (
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// handshake runs a TLS handshake over loopback TCP between a server with
// srv and a client with cli dialing "localhost", and returns both sides'
// states and errors.
func handshake(t *testing.T, srv, cli *tls.Config) (ss, cs tls.ConnectionState, serr, cerr error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	type result struct {
		st  tls.ConnectionState
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, srv)
		err = tc.Handshake()
		if err == nil {
			// In TLS 1.3 the client's handshake is done before the server
			// has checked its certificate: the client reads this byte, so
			// a refusal reaches it.
			_, err = tc.Write([]byte{1})
		}
		done <- result{tc.ConnectionState(), err}
	}()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	cli = cli.Clone()
	cli.ServerName = "localhost"
	tc := tls.Client(c, cli)
	cerr = tc.Handshake()
	if cerr == nil {
		_, cerr = tc.Read(make([]byte, 1))
	}
	cs = tc.ConnectionState()
	c.Close()
	r := <-done
	return r.st, cs, r.err, cerr
}

func TestTLSUser(t *testing.T) {
	dir := newCell(t, "alpha")
	id, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCA(filepath.Join(dir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	ss, cs, serr, cerr := handshake(t, id.ServerTLS(), UserTLS(ca))
	if serr != nil || cerr != nil {
		t.Fatalf("handshake: server %v, client %v", serr, cerr)
	}
	if cs.Version != tls.VersionTLS13 {
		t.Errorf("version %x, want TLS 1.3", cs.Version)
	}
	if _, _, ok := PeerRole(ss); ok {
		t.Error("PeerRole: a user's client showed a certificate")
	}
	// The client sees the cell's server.
	if name, role, ok := PeerRole(cs); !ok || role != RoleServer || name != id.Name {
		t.Errorf("client's PeerRole: %q %q %v", name, role, ok)
	}
	// gRPC asks for h2.
	h2 := UserTLS(ca)
	h2.NextProtos = []string{"h2"}
	if _, cs, serr, cerr := handshake(t, id.ServerTLS(), h2); serr != nil || cerr != nil || cs.NegotiatedProtocol != "h2" {
		t.Errorf("h2: negotiated %q, server %v, client %v", cs.NegotiatedProtocol, serr, cerr)
	}
}

func TestTLSOtherCell(t *testing.T) {
	id, err := Load(newCell(t, "alpha"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadCA(filepath.Join(newCell(t, "beta"), CAFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, cerr := handshake(t, id.ServerTLS(), UserTLS(other)); cerr == nil {
		t.Error("a client trusting another cell's CA accepted the server")
	}
}

func TestTLS12Refused(t *testing.T) {
	dir := newCell(t, "alpha")
	id, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := UserTLS(id.CA)
	old.MinVersion, old.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	_, _, serr, cerr := handshake(t, id.ServerTLS(), old)
	if serr == nil || cerr == nil {
		t.Errorf("a TLS 1.2 client: server %v, client %v; want both to fail", serr, cerr)
	}
}

func TestTLSPeerRole(t *testing.T) {
	cellDir := newCell(t, "alpha")
	srv, err := Load(cellDir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "edge")
	if err := IssueCert(cellDir, out, RoleProxy, "edge", nil); err != nil {
		t.Fatal(err)
	}
	proxy, err := Load(out)
	if err != nil {
		t.Fatal(err)
	}
	ss, cs, serr, cerr := handshake(t, srv.ServerTLS(), proxy.ClientTLS())
	if serr != nil || cerr != nil {
		t.Fatalf("handshake: server %v, client %v", serr, cerr)
	}
	if name, role, ok := PeerRole(ss); !ok || name != "edge" || role != RoleProxy {
		t.Errorf("server's PeerRole: %q %q %v, want edge proxy true", name, role, ok)
	}
	if name, role, ok := PeerRole(cs); !ok || name != srv.Name || role != RoleServer {
		t.Errorf("proxy's PeerRole: %q %q %v", name, role, ok)
	}

	// A certificate of another cell is refused, not ignored.
	otherDir := newCell(t, "beta")
	out2 := filepath.Join(t.TempDir(), "intruder")
	if err := IssueCert(otherDir, out2, RoleProxy, "intruder", nil); err != nil {
		t.Fatal(err)
	}
	intruder, err := Load(out2)
	if err != nil {
		t.Fatal(err)
	}
	cfg := intruder.ClientTLS()
	cfg.RootCAs = srv.Pool
	// The server names the CA it accepts, and crypto/tls sends no
	// certificate that CA did not sign: the intruder is a mere user.
	ss, _, serr, cerr = handshake(t, srv.ServerTLS(), cfg)
	if serr != nil || cerr != nil {
		t.Fatalf("another cell's client, its certificate unsent: server %v, client %v", serr, cerr)
	}
	if _, _, ok := PeerRole(ss); ok {
		t.Error("another cell's certificate gave a role")
	}
	// Sent all the same, it is refused.
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &intruder.Cert, nil }
	if _, _, serr, cerr := handshake(t, srv.ServerTLS(), cfg); serr == nil || cerr == nil {
		t.Errorf("another cell's client certificate: server %v, client %v; want both to fail", serr, cerr)
	}
}

func TestPeerRoleNone(t *testing.T) {
	if _, _, ok := PeerRole(tls.ConnectionState{}); ok {
		t.Error("PeerRole of no certificate: ok")
	}
}
