package datachan

import (
	"errors"
	"net"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/hoardfs/hoard/datapath"
	"github.com/hoardfs/hoard/node"
	"github.com/hoardfs/hoard/vnode"
)

// Files is a backend whose file bytes sit in local files it can pin
// (vnode.Store.PinData): fetches are sent by sendfile after the file's
// lock is released, so a client that reads its socket slowly holds up
// no commit, to that file or any other.
type Files interface {
	PinData(f node.FID, off, n int64) (*vnode.Pinned, error)
}

// errSpoiled breaks a data connection whose reply was cut short because a
// commit wrote over the bytes being sent: the client sees a torn reply,
// never caches it, and fetches again.
var errSpoiled = errors.New("data channel: the version being sent was written over in place")

// pinTries is how often a fetch pins again when an in-place commit
// spoiled its version before anything was sent.
const pinTries = 3

// sendPinned answers a fetch from a pinned version of the file. Reading
// the checksum and sending happen after the lock is released; a commit
// that writes into the pinned range in place meanwhile spoils the pin
// (vnode.Pinned): before the reply began, the fetch is served again from
// the new version, after, the connection is dropped. werr means the
// connection broke; err is the fetch's.
func (c *channel) sendPinned(conn net.Conn, f Fetch, req datapath.Request) (dv uint64, werr, err error) {
	for try := 0; ; try++ {
		if try == pinTries {
			if req.Length <= maxReadFetch {
				return c.sendRead(conn, f, req) // read under the lock
			}
			return 0, errSpoiled, nil
		}
		p, err := c.cfg.Files.PinData(req.FID, int64(req.Offset), int64(req.Length))
		if err != nil {
			return 0, nil, err
		}
		dv, werr, err, again := c.sendPin(conn, f, p, req)
		p.Release()
		if !again {
			return dv, werr, err
		}
	}
}

// sendPin sends p's bytes for req; again when p was spoiled before the
// reply began.
func (c *channel) sendPin(conn net.Conn, f Fetch, p *vnode.Pinned, req datapath.Request) (dv uint64, werr, err error, again bool) {
	st := p.Status
	status, err := proto.Marshal(f.Status(st))
	if err != nil {
		return 0, nil, err, false
	}
	var n uint64
	if req.Offset < st.Size {
		n = min(req.Length, st.Size-req.Offset)
	}
	defer func() {
		if werr == nil && err == nil && !again {
			c.cfg.Counts.Sent.Add(int64(n))
		}
	}()
	if p.File == nil && p.Mem != nil {
		// A small file's bytes, from the metadata store (inline): one
		// write, header, bytes and checksum.
		var b []byte
		if n > 0 {
			b = p.Mem[req.Offset : req.Offset+n]
		}
		reply := datapath.AppendOK(nil, status, n)
		reply = append(reply, b...)
		_, werr = conn.Write(datapath.AppendCRC(reply, datapath.Checksum(0, b)))
		return st.DataVersion, werr, nil, false
	}
	if _, direct := conn.(syscall.Conn); !direct {
		// TLS: the bytes go through the process anyway, so they are
		// read once, checksummed and sent (a change meanwhile spoils
		// the reply: the client asks again).
		if _, werr = conn.Write(datapath.AppendOK(nil, status, n)); werr != nil {
			return st.DataVersion, werr, nil, false
		}
		var crc uint32
		err := eachRun(p.File, p.Have, int64(req.Offset), int64(n), func(b []byte) error {
			crc = datapath.Checksum(crc, b)
			_, werr = conn.Write(b)
			return werr
		})
		switch {
		case werr != nil:
			return st.DataVersion, werr, nil, false
		case err != nil:
			return st.DataVersion, err, nil, false // mid-reply: the connection is out of step
		case p.Spoiled():
			return st.DataVersion, errSpoiled, nil, false
		}
		_, werr = conn.Write(datapath.AppendCRC(nil, crc))
		return st.DataVersion, werr, nil, false
	}
	// The checksum costs a read of the range from the page cache
	// (11 GB/s here); the bytes still go out by sendfile.
	crc, err := checksum(p.File, p.Have, int64(req.Offset), int64(n))
	if err != nil {
		return 0, nil, err, false
	}
	if p.Spoiled() {
		return 0, nil, nil, true
	}
	if _, werr = conn.Write(datapath.AppendOK(nil, status, n)); werr != nil {
		return st.DataVersion, werr, nil, false
	}
	if werr = sendData(conn, p.File, p.Have, int64(req.Offset), int64(n)); werr != nil {
		return st.DataVersion, werr, nil, false
	}
	if p.Spoiled() {
		return st.DataVersion, errSpoiled, nil, false
	}
	_, werr = conn.Write(datapath.AppendCRC(nil, crc))
	return st.DataVersion, werr, nil, false
}
