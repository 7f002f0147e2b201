package site

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/hoardfs/hoard/hoardpb"
)

// ErrOf turns an RPC error into an errno-carrying error for the caller,
// keeping the transport's explanation for EIO and ETIMEDOUT.
func ErrOf(op, path string, err error) error {
	return pathErr(op, path, err, func(errno syscall.Errno) bool {
		return errno == syscall.EIO || errno == syscall.ETIMEDOUT
	})
}

// ErrTold is ErrOf keeping the server's explanation whatever the errno,
// for the cell's administration (ACLs, groups, users, tokens), where a
// refusal's reason is what its user needs.
func ErrTold(op, path string, err error) error {
	_, told := status.FromError(err)
	return pathErr(op, path, err, func(syscall.Errno) bool { return told })
}

// pathErr is err as an *os.PathError of op on path carrying its errno,
// and its explanation too where explain says so; an *os.PathError
// already is returned as it is.
func pathErr(op, path string, err error, explain func(syscall.Errno) bool) error {
	var pe *os.PathError
	if err == nil || errors.As(err, &pe) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = pb.Errno(err)
	}
	if explain(errno) {
		return &os.PathError{Op: op, Path: path, Err: &rpcError{errno, err}}
	}
	return &os.PathError{Op: op, Path: path, Err: errno}
}

// rpcError keeps the transport's explanation next to the errno.
type rpcError struct {
	errno syscall.Errno
	err   error
}

func (e *rpcError) Error() string {
	m := status.Convert(e.err).Message()
	if strings.HasSuffix(m, e.errno.Error()) {
		return m // the server's explanation, ending in the errno's
	}
	return e.errno.Error() + ": " + m
}
func (e *rpcError) Unwrap() error { return e.errno }

// Explained is errno with err, the transport's explanation, beside it.
func Explained(errno syscall.Errno, err error) error { return &rpcError{errno, err} }

// A DialError is a session with another server of the cell that could
// not be begun.
type DialError struct {
	Server string // its name in the cell
	Err    error
}

func (e *DialError) Error() string { return fmt.Sprintf("server %s of the cell: %v", e.Server, e.Err) }
func (e *DialError) Unwrap() error { return e.Err }

// DialFailed says in a line why server could not be used: it refused
// the client, its root volume is closed to the client's user (anonymous:
// the client has no token), or it is unreachable, and why, in the words
// of the system or of TLS (tls: the client dialed with TLS) rather than
// gRPC's. errors.Is and As still see err.
func DialFailed(server string, anonymous, tls bool, err error) error {
	switch status.Code(err) {
	case codes.ResourceExhausted, codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied:
		return fmt.Errorf("server %s refused this client: %s", server, status.Convert(err).Message())
	}
	if errors.Is(err, syscall.EACCES) {
		who := "its token's user"
		if anonymous {
			who = "anonymous (no token: log in with hoard login)"
		}
		return fmt.Errorf("server %s: the root volume is not open to %s: %w", server, who, err)
	}
	if strings.HasPrefix(err.Error(), "server ") {
		return err // said already
	}
	return &plainError{fmt.Sprintf("server %s unreachable: %s", server, transportCause(server, tls, err)), err}
}

// plainError says err in a person's words; errors.Is and As see err.
type plainError struct {
	msg string
	err error
}

func (e *plainError) Error() string { return e.msg }
func (e *plainError) Unwrap() error { return e.err }

// transportCause is what a failed connection to addr comes down to, in the
// words of the system or of TLS ("connection refused"), without gRPC's
// layers ("rpc error: code = Unavailable desc = connection error: desc =
// \"transport: Error while dialing: dial tcp ...").
// hungUp reports whether a transport error says the peer took the
// connection and then would not speak HTTP/2 on it: no preface, or a
// write that found it closed (broken pipe) or reset, as an etcd member's
// TLS port does to a hoard client, which way depending on timing.
func hungUp(msg string) bool {
	return strings.Contains(msg, "server preface") || strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset by peer")
}

func transportCause(addr string, tls bool, err error) string {
	msg := status.Convert(err).Message()
	msg = strings.ReplaceAll(msg, `\"`, `"`)
	host, _, _ := net.SplitHostPort(addr)
	switch {
	case strings.Contains(msg, "connect: "):
		msg = msg[strings.LastIndex(msg, "connect: ")+len("connect: "):]
	case strings.Contains(msg, "produced zero addresses"), strings.Contains(msg, "no such host"):
		msg = "cannot resolve " + host
	case strings.Contains(msg, "authentication handshake failed: "):
		msg = "TLS handshake failed: " + msg[strings.LastIndex(msg, "handshake failed: ")+len("handshake failed: "):]
	case hungUp(msg) && tls:
		msg = "it answered, but not as a hoard server (another service's port, such as an etcd member's?)"
	case hungUp(msg):
		// A TLS server hangs up on a plaintext client.
		msg = "it answered, but not as a hoard server without TLS (one with TLS, reached with --insecure? another service's port?)"
	case strings.Contains(msg, "i/o timeout"):
		msg = "no answer (timed out)"
	default:
		for _, p := range []string{"connection error: desc = ", "transport: Error while dialing: ", "transport: "} {
			msg = strings.TrimPrefix(strings.Trim(msg, `"`), p)
		}
	}
	return strings.Trim(msg, `"`)
}
