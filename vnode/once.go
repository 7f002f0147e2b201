package vnode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"syscall"
	"time"

	"github.com/hoardfs/hoard/node"
)

// opKeep is how long an outcome is kept: far longer than a client retries
// a request (its RPC timeout).
const opKeep = 10 * time.Minute

// done is a recorded outcome: the vnodes the reply names, in an order each
// operation defines.
type done struct {
	vnodes []named
}

// named is a vnode a reply names, with its type, which its status keeps
// once the vnode is gone.
type named struct {
	fid node.FID
	typ node.Type
}

// doneVnode is the size of one named vnode in a recorded outcome.
const doneVnode = 25

// CheckOp refuses an Op that is too long or holds bytes other than
// printable ASCII.
func CheckOp(op node.Op) error {
	if len(op) > node.MaxOp {
		return fmt.Errorf("op id of %d bytes, at most %d: %w", len(op), node.MaxOp, syscall.EINVAL)
	}
	for i := 0; i < len(op); i++ {
		if op[i] <= ' ' || op[i] > '~' {
			return fmt.Errorf("op id %q: not printable ASCII: %w", op, syscall.EINVAL)
		}
	}
	return nil
}

// findOp returns the recorded outcome of op.
func (v *vtx) findOp(op node.Op) (done, bool) {
	if op == "" {
		return done{}, false
	}
	b := v.tx.Bucket(bktOps).Get([]byte(op))
	if len(b) < 8 || (len(b)-8)%doneVnode != 0 {
		return done{}, false
	}
	var d done
	for p := b[8:]; len(p) > 0; p = p[doneVnode:] {
		f := node.FID{Volume: getU64(p[:8]), Vnode: getU64(p[8:16]), Unique: getU64(p[16:24])}
		d.vnodes = append(d.vnodes, named{f, node.Type(p[24])})
	}
	return d, true
}

// recordOp records op's outcome and forgets outcomes older than opKeep.
func (v *vtx) recordOp(op node.Op, d done) error {
	if op == "" {
		return nil
	}
	ops, byTime := v.tx.Bucket(bktOps), v.tx.Bucket(bktOpTimes)
	c := byTime.Cursor()
	old := u64(uint64(v.now - int64(opKeep)))
	for k, _ := c.First(); k != nil && bytes.Compare(k[:8], old) < 0; k, _ = c.First() {
		if err := ops.Delete(k[8:]); err != nil {
			return err
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	b := make([]byte, 8, 8+doneVnode*len(d.vnodes))
	binary.BigEndian.PutUint64(b, uint64(v.now))
	for _, n := range d.vnodes {
		b = append(b, u64(n.fid.Volume)...)
		b = append(b, u64(n.fid.Vnode)...)
		b = append(b, u64(n.fid.Unique)...)
		b = append(b, byte(n.typ))
	}
	if err := ops.Put([]byte(op), b); err != nil {
		return err
	}
	return byTime.Put(append(u64(uint64(v.now)), op...), nil)
}

// statusNow is n's status as it is now; a vnode gone since is reported
// with no links.
func (v *vtx) statusNow(n named) node.Status {
	r, err := v.get(n.fid)
	if err != nil {
		return node.Status{FID: n.fid, Type: n.typ}
	}
	return v.statusOf(&r, n.fid.Vnode)
}

// namedBy is the named vnode of st.
func namedBy(st node.Status) named { return named{st.FID, st.Type} }
