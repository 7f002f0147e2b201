package datapath

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/hoardfs/hoard/node"
)

// The bulk-data channel's framing: TCP (in TLS on a secure server), a
// small binary header each way, then the bytes as they are (sent with
// sendfile by an insecure server), each run of bytes followed by its
// CRC32C so that a torn or corrupted transfer is caught end to end rather
// than cached.
//
//	request: magic "HDF3" | op u8 | session len u16 + bytes | user len u16 + bytes |
//	         fid 3×u64 | offset u64 | length u64
//	  user:  the user's token, as gRPC's "authorization" carries it (none: anonymous)
//	  fetch: nothing more; length is the byte range's
//	  store: length bytes of hoardpb.StoreRequest (no data), then pieces
//	         offset u64 | n u32 | n bytes | crc u32, ended by a piece with n = 0
//	reply:   errno u32; if 0: status len u32 + hoardpb.Status | data len u64 | data | crc u32
//	                    else: message len u16 + bytes
//
// The magic is the version: a server that does not know it answers
// ErrProtocol and closes the connection, and the client falls back to the
// gRPC path.
const magic = 0x48444633 // "HDF3"

// Operations.
const (
	OpFetch = 1 // read a byte range
	OpStore = 2 // stage pieces and commit them as one store
)

// Limits on what a request or reply may carry.
const (
	MaxFetch   = 64 << 20
	MaxPiece   = 4 << 20
	maxSession = 256
	maxUser    = 4096
	maxStatus  = 64 << 10
	maxMessage = 4096
	maxOffset  = 1 << 62
)

// Errno values of the channel itself, outside the range of real errnos.
const (
	// ErrSession: the server does not know the session (it restarted, or
	// dropped the client); the client reconnects.
	ErrSession = 0xFFFF0001
	// ErrChecksum: a store piece arrived corrupted; the client retries.
	ErrChecksum = 0xFFFF0002
	// ErrProtocol: the request was malformed, or of a version the server
	// does not speak; the client falls back to the gRPC path.
	ErrProtocol = 0xFFFF0003
	// ErrElsewhere: the server does not hold the file's volume now (it
	// moved, or is being handed over); the client sends the call over
	// gRPC, whose answer says where, or to send it again.
	ErrElsewhere = 0xFFFF0004
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC32C the channel carries after each run of bytes.
func Checksum(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// Request is one data-channel request.
type Request struct {
	Op      uint8
	Session string
	User    string
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
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.User)))
	b = append(b, r.User...)
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
	if req.Op != OpFetch && req.Op != OpStore {
		return req, fmt.Errorf("%w: unknown op %d", ErrBadRequest, req.Op)
	}
	sl := int(binary.BigEndian.Uint16(hdr[5:]))
	if sl > maxSession {
		return req, fmt.Errorf("%w: session of %d bytes", ErrBadRequest, sl)
	}
	sess := make([]byte, sl+2)
	if _, err := io.ReadFull(r, sess); err != nil {
		return req, err
	}
	req.Session = string(sess[:sl])
	ul := int(binary.BigEndian.Uint16(sess[sl:]))
	if ul > maxUser {
		return req, fmt.Errorf("%w: user token of %d bytes", ErrBadRequest, ul)
	}
	rest := make([]byte, ul+40)
	if _, err := io.ReadFull(r, rest); err != nil {
		return req, err
	}
	req.User = string(rest[:ul])
	v := func(i int) uint64 { return binary.BigEndian.Uint64(rest[ul+8*i:]) }
	req.FID = node.FID{Volume: v(0), Vnode: v(1), Unique: v(2)}
	req.Offset, req.Length = v(3), v(4)
	limit := uint64(MaxFetch)
	if req.Op == OpStore {
		limit = maxStatus
	}
	if req.Length > limit || req.Offset > maxOffset {
		return req, fmt.Errorf("%w: range %d+%d out of bounds", ErrBadRequest, req.Offset, req.Length)
	}
	return req, nil
}

// AppendPiece encodes the header of a store piece of n bytes at off; the
// bytes and their checksum follow it.
func AppendPiece(b []byte, off int64, n int) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(off))
	return binary.BigEndian.AppendUint32(b, uint32(n))
}

// ReadPiece decodes a store piece's header; n = 0 ends the store.
func ReadPiece(r *bufio.Reader) (off int64, n int, err error) {
	var b [12]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, 0, err
	}
	o, l := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint32(b[8:])
	if l > MaxPiece || o > maxOffset {
		return 0, 0, fmt.Errorf("%w: piece %d+%d out of bounds", ErrBadRequest, o, l)
	}
	return int64(o), int(l), nil
}

// AppendCRC encodes a checksum.
func AppendCRC(b []byte, crc uint32) []byte { return binary.BigEndian.AppendUint32(b, crc) }

// ReadCRC decodes a checksum.
func ReadCRC(r io.Reader) (uint32, error) {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b[:]), nil
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

// AppendOK encodes a successful reply's header; n data bytes and their
// checksum follow it.
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
