package site

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A failed dial is said in a line, in the system's or TLS's words, with
// gRPC's layers peeled off; the error under it is still there to test.
func TestDialFailed(t *testing.T) {
	unavailable := func(desc string) error {
		return status.Error(codes.Unavailable, `connection error: desc = "transport: `+desc+`"`)
	}
	cell := &DialError{Server: "b", Err: errors.New("no answer")}
	for _, tc := range []struct {
		what      string
		server    string
		anonymous bool
		tls       bool
		err       error
		want      string
	}{
		{"refused connection", "127.0.0.1:1", false, true,
			unavailable(`Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused`),
			"server 127.0.0.1:1 unreachable: connection refused"},
		{"unknown host", "nohost.invalid:7100", false, true,
			unavailable(`Error while dialing: dial tcp: lookup nohost.invalid on 127.0.0.53:53: no such host`),
			"server nohost.invalid:7100 unreachable: cannot resolve nohost.invalid"},
		{"no addresses", "nohost.invalid:7100", false, true,
			status.Error(codes.Unavailable, `name resolver error: produced zero addresses`),
			"server nohost.invalid:7100 unreachable: cannot resolve nohost.invalid"},
		{"bad certificate", "h:7100", false, true,
			unavailable(`authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority`),
			"server h:7100 unreachable: TLS handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
		{"handshake cut short", "h:2379", false, true,
			unavailable(`authentication handshake failed: EOF; server preface`),
			"server h:2379 unreachable: TLS handshake failed: EOF; server preface"},
		{"not hoard, with TLS", "h:2379", false, true,
			unavailable(`failed to receive server preface within timeout`),
			"server h:2379 unreachable: it answered, but not as a hoard server (another service's port, such as an etcd member's?)"},
		{"not hoard, reset", "h:2379", false, true,
			unavailable(`write tcp 127.0.0.1:38062->127.0.0.1:2379: write: connection reset by peer`),
			"server h:2379 unreachable: it answered, but not as a hoard server (another service's port, such as an etcd member's?)"},
		{"TLS server, plaintext client", "h:7100", false, false,
			unavailable(`write tcp 127.0.0.1:5->127.0.0.1:7100: write: broken pipe`),
			"server h:7100 unreachable: it answered, but not as a hoard server without TLS (one with TLS, reached with --insecure? another service's port?)"},
		{"timeout", "h:7100", false, true,
			unavailable(`Error while dialing: dial tcp 10.0.0.1:7100: i/o timeout`),
			"server h:7100 unreachable: no answer (timed out)"},
		{"other transport trouble", "h:7100", false, true,
			unavailable(`something odd`),
			"server h:7100 unreachable: something odd"},
		{"not gRPC's", "h:7100", false, true,
			errors.New("no answer within 5s"),
			"server h:7100 unreachable: no answer within 5s"},
		{"refused", "h:7100", false, true,
			status.Error(codes.PermissionDenied, "token revoked"),
			"server h:7100 refused this client: token revoked"},
		{"too many sessions", "h:7100", true, true,
			status.Error(codes.ResourceExhausted, "too many sessions"),
			"server h:7100 refused this client: too many sessions"},
		{"root closed to a user", "h:7100", false, true,
			fmt.Errorf("lookup /: %w", syscall.EACCES),
			"server h:7100: the root volume is not open to its token's user: lookup /: permission denied"},
		{"root closed to anonymous", "h:7100", true, true,
			fmt.Errorf("lookup /: %w", syscall.EACCES),
			"server h:7100: the root volume is not open to anonymous (no token: log in with hoard login): lookup /: permission denied"},
		{"said already", "h:7100", false, true, cell, cell.Error()},
	} {
		t.Run(tc.what, func(t *testing.T) {
			got := DialFailed(tc.server, tc.anonymous, tc.tls, tc.err)
			if got.Error() != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
			if status.Code(tc.err) == codes.Unavailable || status.Code(tc.err) == codes.Unknown {
				if !errors.Is(got, tc.err) {
					t.Errorf("%v does not wrap %v", got, tc.err)
				}
			}
		})
	}
	var de *DialError
	if !errors.As(DialFailed("h:7100", false, true, fmt.Errorf("root: %w", cell)), &de) || de != cell {
		t.Error("a DialError under it is not found")
	}
}
