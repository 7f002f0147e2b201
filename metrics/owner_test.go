package metrics

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// The kernel names the owner of a loopback client's socket: this
// process's uid is served, another's is refused.
func TestOwnerOnly(t *testing.T) {
	for _, c := range []struct {
		owner uint32
		code  int
	}{{uint32(os.Getuid()), http.StatusOK}, {uint32(os.Getuid()) + 4242, http.StatusForbidden}} {
		if c.code == http.StatusForbidden && os.Getuid() == 0 {
			continue // root may read every page
		}
		s := httptest.NewServer(OwnerOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "page") }), c.owner))
		resp, err := http.Get(s.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s.Close()
		if resp.StatusCode != c.code {
			t.Errorf("owner %d: %d, want %d", c.owner, resp.StatusCode, c.code)
		}
	}
	// As root, another user's request, through bash's /dev/tcp.
	if os.Getuid() == 0 {
		s := httptest.NewServer(OwnerOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "secret page") }), 0))
		defer s.Close()
		host, port, _ := net.SplitHostPort(s.Listener.Addr().String())
		cmd := exec.Command("/bin/bash", "-c", `exec 3<>/dev/tcp/`+host+`/`+port+`; printf 'GET / HTTP/1.0\r\n\r\n' >&3; cat <&3`)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "403 Forbidden") || strings.Contains(string(out), "secret page") {
			t.Errorf("nobody's request of root's page: %v: %s", err, out)
		}
	}
	// A client the tables do not hold is refused.
	if _, ok := peerUID(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, "127.0.0.1:2"); ok {
		t.Error("a connection that does not exist has an owner")
	}
}
