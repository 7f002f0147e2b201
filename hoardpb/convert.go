package hoardpb

import (
	"errors"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hoardfs/hoard/node"
)

// Version is the protocol version spoken by this build.
const Version = 1

// ClientMetadata is the gRPC metadata key carrying "<epoch>.<client id>".
const ClientMetadata = "hoard-client"

// UserMetadata is the gRPC metadata key carrying "Bearer <token>": the
// user a request acts for, with a token the cell issued.
const UserMetadata = "authorization"

// OpMetadata is the gRPC metadata key naming a request that changes the
// namespace, the same in every attempt, so that one sent again after a
// lost reply is not carried out twice (node.Op).
const OpMetadata = "hoard-op"

// FromFID converts to the wire form.
func FromFID(f node.FID) *FID { return &FID{Volume: f.Volume, Vnode: f.Vnode, Unique: f.Unique} }

// ToFID converts from the wire form; nil is the zero FID.
func (f *FID) ToFID() node.FID {
	if f == nil {
		return node.FID{}
	}
	return node.FID{Volume: f.Volume, Vnode: f.Vnode, Unique: f.Unique}
}

// FromType converts to the wire form.
func FromType(t node.Type) FileType {
	switch t {
	case node.TypeFile:
		return FileType_FILE_TYPE_FILE
	case node.TypeDir:
		return FileType_FILE_TYPE_DIR
	case node.TypeSymlink:
		return FileType_FILE_TYPE_SYMLINK
	case node.TypeMountPoint:
		return FileType_FILE_TYPE_MOUNTPOINT
	case node.TypeFifo:
		return FileType_FILE_TYPE_FIFO
	case node.TypeSocket:
		return FileType_FILE_TYPE_SOCKET
	case node.TypeCharDev:
		return FileType_FILE_TYPE_CHARDEV
	case node.TypeBlockDev:
		return FileType_FILE_TYPE_BLOCKDEV
	}
	return FileType_FILE_TYPE_UNSPECIFIED
}

// ToType converts from the wire form; unknown values give 0.
func (t FileType) ToType() node.Type {
	switch t {
	case FileType_FILE_TYPE_FILE:
		return node.TypeFile
	case FileType_FILE_TYPE_DIR:
		return node.TypeDir
	case FileType_FILE_TYPE_SYMLINK:
		return node.TypeSymlink
	case FileType_FILE_TYPE_MOUNTPOINT:
		return node.TypeMountPoint
	case FileType_FILE_TYPE_FIFO:
		return node.TypeFifo
	case FileType_FILE_TYPE_SOCKET:
		return node.TypeSocket
	case FileType_FILE_TYPE_CHARDEV:
		return node.TypeCharDev
	case FileType_FILE_TYPE_BLOCKDEV:
		return node.TypeBlockDev
	}
	return 0
}

// FromStatus converts to the wire form, with a promise of cb (0: none).
func FromStatus(s node.Status, cb time.Duration) *Status {
	return &Status{
		Fid:         FromFID(s.FID),
		Type:        FromType(s.Type),
		Mode:        s.Mode,
		Uid:         s.UID,
		Gid:         s.GID,
		Size:        s.Size,
		Nlink:       s.Nlink,
		DataVersion: s.DataVersion,
		AtimeNs:     s.Atime.UnixNano(),
		MtimeNs:     s.Mtime.UnixNano(),
		CtimeNs:     s.Ctime.UnixNano(),
		Target:      s.Target,
		CallbackMs:  uint64(cb / time.Millisecond),
		Rdev:        s.Rdev,
		Blocks:      s.Blocks,
		Rights:      uint32(s.Rights),
	}
}

// ToStatus converts from the wire form and returns the promise granted with
// it (0: none). A nil status is an error: replies must carry one.
func (s *Status) ToStatus() (node.Status, time.Duration, error) {
	if s == nil || s.Fid == nil || s.Type.ToType() == 0 {
		return node.Status{}, 0, errors.New("protocol: reply without a valid status")
	}
	return node.Status{
		FID:         s.Fid.ToFID(),
		Type:        s.Type.ToType(),
		Mode:        s.Mode,
		UID:         s.Uid,
		GID:         s.Gid,
		Size:        s.Size,
		Nlink:       s.Nlink,
		DataVersion: s.DataVersion,
		Atime:       time.Unix(0, s.AtimeNs),
		Mtime:       time.Unix(0, s.MtimeNs),
		Ctime:       time.Unix(0, s.CtimeNs),
		Target:      s.Target,
		Rdev:        s.Rdev,
		Blocks:      s.Blocks,
		Rights:      uint8(s.Rights),
	}, time.Duration(s.CallbackMs) * time.Millisecond, nil
}

// Err turns a server-side error into a gRPC status carrying its errno.
// Errors without an errno travel as EIO.
func Err(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	errno := syscall.EIO
	errors.As(err, &errno)
	st, derr := status.New(codeOf(errno), err.Error()).WithDetails(&Error{Errno: int32(errno)})
	if derr != nil {
		return status.Error(codeOf(errno), err.Error())
	}
	return st.Err()
}

func codeOf(e syscall.Errno) codes.Code {
	switch e {
	case syscall.ENOENT, syscall.ESTALE:
		return codes.NotFound
	case syscall.EEXIST:
		return codes.AlreadyExists
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.EFBIG:
		return codes.InvalidArgument
	case syscall.ENOSPC, syscall.EDQUOT:
		return codes.ResourceExhausted
	case syscall.EPERM, syscall.EACCES:
		return codes.PermissionDenied
	case syscall.EIO:
		return codes.Internal
	case syscall.ETIMEDOUT:
		return codes.DeadlineExceeded
	}
	return codes.FailedPrecondition
}

// Errno recovers the errno of a failed RPC: the Error detail when present,
// otherwise one derived from the gRPC code (a server that cannot be reached
// is ETIMEDOUT or EIO, never a file system answer).
func Errno(err error) syscall.Errno {
	st, ok := status.FromError(err)
	if !ok {
		var e syscall.Errno
		if errors.As(err, &e) {
			return e
		}
		return syscall.EIO
	}
	for _, d := range st.Details() {
		if e, ok := d.(*Error); ok && e.Errno > 0 {
			return syscall.Errno(e.Errno)
		}
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		return syscall.ETIMEDOUT
	case codes.Canceled:
		return syscall.EINTR
	case codes.InvalidArgument:
		return syscall.EINVAL
	case codes.NotFound:
		return syscall.ENOENT
	case codes.PermissionDenied:
		return syscall.EPERM
	case codes.Unimplemented:
		return syscall.ENOTSUP
	}
	return syscall.EIO
}
