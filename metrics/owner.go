package metrics

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// OwnerOnly serves h to local processes of uid owner (or root) alone: a
// mount's status page names the files its users opened, which are no
// other local user's to read. Who connects is what the kernel recorded
// of the client's socket (/proc/net/tcp, as identd reads it); a client
// it cannot name (another machine, another network namespace) is
// refused.
func OwnerOnly(h http.Handler, owner uint32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		uid, ok := peerUID(local, r.RemoteAddr)
		if !ok || uid != owner && uid != 0 {
			http.Error(w, "this page is for the user who runs the process, on its machine", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// peerUID is the uid owning the TCP socket at remote (host:port)
// connected to local, from the kernel's tables.
func peerUID(local net.Addr, remote string) (uint32, bool) {
	l, ok := local.(*net.TCPAddr)
	if !ok {
		return 0, false
	}
	ra, err := net.ResolveTCPAddr("tcp", remote)
	if err != nil {
		return 0, false
	}
	// The client's socket: its own address is remote, its peer local.
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if uid, ok := findUID(table, procAddr(ra.IP, ra.Port), procAddr(l.IP, l.Port)); ok {
			return uid, true
		}
	}
	return 0, false
}

// findUID scans a /proc/net/tcp table for the socket from -> to.
func findUID(table, from, to string) (uint32, bool) {
	f, err := os.Open(table)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 8 || fs[1] != from || fs[2] != to {
			continue
		}
		uid, err := strconv.ParseUint(fs[7], 10, 32)
		return uint32(uid), err == nil
	}
	return 0, false
}

// procAddr is ip:port as /proc/net/tcp writes it: the address as 32-bit
// words in the host's byte order, in hex; an IPv4 address in the IPv6
// table as ::ffff:a.b.c.d.
func procAddr(ip net.IP, port int) string {
	var b strings.Builder
	raw := ip.To4()
	if raw == nil {
		raw = ip.To16()
	}
	for i := 0; i+4 <= len(raw); i += 4 {
		fmt.Fprintf(&b, "%08X", binary.NativeEndian.Uint32(raw[i:i+4]))
	}
	fmt.Fprintf(&b, ":%04X", port)
	return b.String()
}
