package datapath

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hoardfs/hoard/node"
)

// The bulk-data channel's framing: plain TCP, a small binary header each
// way, then the bytes as they are (sent with sendfile by the server).
//
//	request: magic "HDF1" | op u8 | session len u16 + bytes | fid 3×u64 | offset u64 | length u64
//	reply:   errno u32; if 0: status len u32 + hoardpb.Status | data len u64 | data
//	                    else: message len u16 + bytes
const magic = 0x48444631 // "HDF1"

// OpFetch is the only operation so far: read a byte range.
const OpFetch = 1

// Limits on what a request or reply may carry.
const (
	MaxFetch     = 64 << 20
	maxSession   = 256
	maxStatus    = 64 << 10
	maxMessage   = 4096
	requestFixed = 4 + 1 + 2 + 24 + 16
)

// ErrSession is the errno value a server answers for a session it does not
// know (it restarted, or dropped the client): the client reconnects.
const ErrSession = 0xFFFF0001

// Request is one data-channel request.
type Request struct {
	Op      uint8
	Session string
	FID     node.FID
	Offset  uint64
	Length  uint64
}

// AppendRequest encodes r.
func AppendRequest(b []byte, r Request) []byte {
	b = binary.BigEndian.AppendUint32(b, magic)
	b = append(b, r.Op)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.Session)))
	b = append(b, r.Session...)
	for _, v := range []uint64{r.FID.Volume, r.FID.Vnode, r.FID.Unique, r.Offset, r.Length} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return b
}

// ErrBadRequest marks a malformed request: the server closes the
// connection after answering it.
var ErrBadRequest = errors.New("malformed data-channel request")

// ReadRequest decodes one request, refusing anything out of bounds.
func ReadRequest(r *bufio.Reader) (Request, error) {
	var req Request
	var hdr [7]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return req, err
	}
	if binary.BigEndian.Uint32(hdr[:4]) != magic {
		return req, fmt.Errorf("%w: bad magic", ErrBadRequest)
	}
	req.Op = hdr[4]
	if req.Op != OpFetch {
		return req, fmt.Errorf("%w: unknown op %d", ErrBadRequest, req.Op)
	}
	sl := int(binary.BigEndian.Uint16(hdr[5:]))
	if sl > maxSession {
		return req, fmt.Errorf("%w: session of %d bytes", ErrBadRequest, sl)
	}
	rest := make([]byte, sl+40)
	if _, err := io.ReadFull(r, rest); err != nil {
		return req, err
	}
	req.Session = string(rest[:sl])
	v := func(i int) uint64 { return binary.BigEndian.Uint64(rest[sl+8*i:]) }
	req.FID = node.FID{Volume: v(0), Vnode: v(1), Unique: v(2)}
	req.Offset, req.Length = v(3), v(4)
	if req.Length > MaxFetch || req.Offset > 1<<62 {
		return req, fmt.Errorf("%w: range %d+%d out of bounds", ErrBadRequest, req.Offset, req.Length)
	}
	return req, nil
}

// AppendError encodes an error reply.
func AppendError(b []byte, errno uint32, msg string) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b = binary.BigEndian.AppendUint32(b, errno)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// AppendOK encodes a successful reply's header; n data bytes follow it.
func AppendOK(b []byte, status []byte, n uint64) []byte {
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(status)))
	b = append(b, status...)
	return binary.BigEndian.AppendUint64(b, n)
}

// Reply is a decoded reply header.
type Reply struct {
	Errno   uint32
	Message string
	Status  []byte // hoardpb.Status, marshalled
	Length  uint64 // data bytes that follow
}

// ReadReply decodes a reply header.
func ReadReply(r *bufio.Reader) (Reply, error) {
	var rep Reply
	var b4 [4]byte
	if _, err := io.ReadFull(r, b4[:]); err != nil {
		return rep, err
	}
	rep.Errno = binary.BigEndian.Uint32(b4[:])
	if rep.Errno != 0 {
		var b2 [2]byte
		if _, err := io.ReadFull(r, b2[:]); err != nil {
			return rep, err
		}
		msg := make([]byte, binary.BigEndian.Uint16(b2[:]))
		_, err := io.ReadFull(r, msg)
		rep.Message = string(msg)
		return rep, err
	}
	if _, err := io.ReadFull(r, b4[:]); err != nil {
		return rep, err
	}
	sl := binary.BigEndian.Uint32(b4[:])
	if sl > maxStatus {
		return rep, fmt.Errorf("data channel: status of %d bytes", sl)
	}
	rep.Status = make([]byte, sl)
	if _, err := io.ReadFull(r, rep.Status); err != nil {
		return rep, err
	}
	var b8 [8]byte
	if _, err := io.ReadFull(r, b8[:]); err != nil {
		return rep, err
	}
	rep.Length = binary.BigEndian.Uint64(b8[:])
	if rep.Length > MaxFetch {
		return rep, fmt.Errorf("data channel: reply of %d bytes", rep.Length)
	}
	return rep, nil
}
