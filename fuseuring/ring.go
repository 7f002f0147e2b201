package fuseuring

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring ABI this file speaks (include/uapi/linux/io_uring.h).
const (
	sysSetup = 425 // io_uring_setup
	sysEnter = 426 // io_uring_enter

	setupSQE128       = 1 << 10
	setupSingleIssuer = 1 << 12
	setupDeferTaskrun = 1 << 13
	featSingleMmap    = 1 << 0
	enterGetEvents    = 1 << 0

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	opURingCmd = 46
	sqeSize    = 128 // with setupSQE128: 48 bytes of fields, 80 of command
	cqeSize    = 16
)

type sqOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sq                                                                     sqOffsets
	cq                                                                     cqOffsets
}

// ring is one io_uring instance with 128-byte submission entries, as
// FUSE's commands need. It is single-issuer with deferred task work: the
// one locked OS thread that made it submits, waits and reaps, and the
// kernel's completions run on that thread when it waits, not by
// interrupting it.
type ring struct {
	fd           int
	sqMem, cqMem []byte
	sqeMem       []byte

	sqHead, sqTail *uint32
	sqMask         uint32
	sqEntries      uint32
	sqArray        unsafe.Pointer
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer

	unsubmitted uint32
}

func newRing(entries uint32) (*ring, error) {
	p := params{flags: setupSQE128 | setupSingleIssuer | setupDeferTaskrun}
	fd, _, errno := unix.Syscall(sysSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ring{fd: int(fd)}
	sqLen := int(p.sq.array + p.sqEntries*4)
	cqLen := int(p.cq.cqes + p.cqEntries*cqeSize)
	mmap := func(off int64, n int) ([]byte, error) {
		return unix.Mmap(r.fd, off, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	}
	var err error
	if p.features&featSingleMmap != 0 {
		r.sqMem, err = mmap(offSQRing, max(sqLen, cqLen))
		r.cqMem = r.sqMem
	} else if r.sqMem, err = mmap(offSQRing, sqLen); err == nil {
		r.cqMem, err = mmap(offCQRing, cqLen)
	}
	if err == nil {
		r.sqeMem, err = mmap(offSQEs, int(p.sqEntries*sqeSize))
	}
	if err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	at := func(mem []byte, off uint32) unsafe.Pointer { return unsafe.Pointer(&mem[off]) }
	r.sqHead = (*uint32)(at(r.sqMem, p.sq.head))
	r.sqTail = (*uint32)(at(r.sqMem, p.sq.tail))
	r.sqMask = *(*uint32)(at(r.sqMem, p.sq.ringMask))
	r.sqEntries = p.sqEntries
	r.sqArray = at(r.sqMem, p.sq.array)
	r.cqHead = (*uint32)(at(r.cqMem, p.cq.head))
	r.cqTail = (*uint32)(at(r.cqMem, p.cq.tail))
	r.cqMask = *(*uint32)(at(r.cqMem, p.cq.ringMask))
	r.cqes = at(r.cqMem, p.cq.cqes)
	return r, nil
}

// uringCmd queues an IORING_OP_URING_CMD on file fd: cmdOp, an optional
// iovec array (addr, n), and the 80-byte command area.
func (r *ring) uringCmd(fd int, cmdOp uint32, addr uintptr, n uint32, userData uint64, cmd []byte) error {
	tail := *r.sqTail
	if tail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		return fmt.Errorf("io_uring submission queue full")
	}
	idx := tail & r.sqMask
	sqe := r.sqeMem[idx*sqeSize : (idx+1)*sqeSize]
	clear(sqe)
	le := binary.LittleEndian
	sqe[0] = opURingCmd
	le.PutUint32(sqe[4:], uint32(int32(fd)))
	le.PutUint32(sqe[8:], cmdOp)
	le.PutUint64(sqe[16:], uint64(addr))
	le.PutUint32(sqe[24:], n)
	le.PutUint64(sqe[32:], userData)
	copy(sqe[48:], cmd)
	*(*uint32)(unsafe.Add(r.sqArray, idx*4)) = idx
	atomic.StoreUint32(r.sqTail, tail+1)
	r.unsubmitted++
	return nil
}

// enter submits what is queued and, with wait, blocks until at least one
// completion is there.
func (r *ring) enter(wait bool) error {
	var min, flags uintptr
	if wait {
		min, flags = 1, enterGetEvents
	}
	for {
		n, _, errno := unix.Syscall6(sysEnter, uintptr(r.fd), uintptr(r.unsubmitted), min, flags, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
		r.unsubmitted -= uint32(n)
		if !wait || r.ready() > 0 {
			return nil
		}
	}
}

func (r *ring) ready() uint32 { return atomic.LoadUint32(r.cqTail) - *r.cqHead }

// reap hands each completion to f and frees its slot.
func (r *ring) reap(f func(userData uint64, res int32)) {
	head := *r.cqHead
	for tail := atomic.LoadUint32(r.cqTail); head != tail; head++ {
		cqe := unsafe.Add(r.cqes, (head&r.cqMask)*cqeSize)
		ud, res := *(*uint64)(cqe), *(*int32)(unsafe.Add(cqe, 8))
		atomic.StoreUint32(r.cqHead, head+1)
		f(ud, res)
	}
}

func (r *ring) close() {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.cqMem != nil && (r.sqMem == nil || &r.cqMem[0] != &r.sqMem[0]) {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	unix.Close(r.fd)
}
