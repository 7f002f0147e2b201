package site

import (
	"errors"
	"os"
	"strings"
	"syscall"

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
