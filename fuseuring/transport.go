// Package fuseuring serves a FUSE connection's requests over io_uring
// (FUSE_OVER_IO_URING, Linux 6.14 and later) instead of read and write on
// /dev/fuse.
//
// The kernel keeps one request queue per CPU and hands a request to the
// queue of the CPU that made it. Each queue here is served by threads held
// to that CPU, so a request is answered without waking a thread on another
// CPU: on a virtual machine that wake-up is an inter-processor interrupt
// and costs more than the rest of the round trip. A thread answers its
// request and fetches the next in one submission (COMMIT_AND_FETCH).
//
// Requests are decoded and dispatched by go-fuse's ProtocolServer, so the
// file system behind it is any fuse.RawFileSystem and does not change.
// go-fuse's Server answers INIT on /dev/fuse and sends the file system's
// notifications there. The kernel sends FORGET and INTERRUPT on /dev/fuse,
// never on the rings; Mount reads them into the rings' ProtocolServer, so
// an INTERRUPT reaches the request it names.
package fuseuring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The FUSE side of the ABI (include/uapi/linux/fuse.h).
const (
	cmdRegister       = 1 // FUSE_IO_URING_CMD_REGISTER
	cmdCommitAndFetch = 2 // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

	inHeaderSize  = 40  // struct fuse_in_header
	outHeaderSize = 16  // struct fuse_out_header
	inOutSize     = 128 // fuse_uring_req_header.in_out
	opInSize      = 128 // fuse_uring_req_header.op_in
	// fuse_uring_req_header: in_out, op_in, then fuse_uring_ent_in_out
	// (flags, commit_id, payload_sz, padding, reserved).
	headerSize   = inOutSize + opInSize + 32
	entOff       = inOutSize + opInSize
	minReadBytes = 8192 // FUSE_MIN_READ_BUFFER
	opInterrupt  = 36   // FUSE_INTERRUPT

	enableParam = "/sys/module/fuse/parameters/enable_uring"
)

// Check says why this kernel will not serve FUSE over io_uring, or nil.
func Check() error {
	b, err := os.ReadFile(enableParam)
	if err != nil {
		return errors.New("this kernel has no FUSE over io_uring (CONFIG_FUSE_IO_URING, Linux 6.14 or later)")
	}
	if strings.TrimSpace(string(b)) != "Y" {
		return fmt.Errorf("FUSE over io_uring is off in this kernel: as root, echo Y > %s", enableParam)
	}
	r, err := newRing(2)
	if err != nil {
		return fmt.Errorf("io_uring is not usable here (kernel.io_uring_disabled?): %w", err)
	}
	r.close()
	return nil
}

// Enable turns the kernel's FUSE over io_uring on (root only). It reports
// whether it was on already.
func Enable() (wasOn bool, err error) {
	b, err := os.ReadFile(enableParam)
	if err != nil {
		return false, Check()
	}
	if strings.TrimSpace(string(b)) == "Y" {
		return true, nil
	}
	return false, os.WriteFile(enableParam, []byte("Y"), 0)
}

// Disable turns it off again, for a caller that turned it on.
func Disable() error { return os.WriteFile(enableParam, []byte("N"), 0) }

// Config sizes a Transport.
type Config struct {
	// PerCPU is how many requests each CPU's queue serves at once. Each is
	// a thread held to that CPU, with its own ring and buffers; a request
	// that waits on the server holds its thread.
	PerCPU int
}

// Transport serves one FUSE connection's rings.
type Transport struct {
	dev     int
	ps      *fuse.ProtocolServer
	payload int
	served  atomic.Int64
	queues  int
	wg      sync.WaitGroup
	errs    chan error
}

// Start registers ring entries on every queue of the FUSE connection open
// on dev, whose INIT (kernel, as go-fuse's Server.KernelSettings reports
// it) offered FUSE_OVER_IO_URING and was answered with opts, which asked
// for it in ExtraCapabilities. It returns once every queue has its
// entries: from then on the kernel sends requests to the rings, which fs
// answers.
//
// The kernel holds back every request of a connection that agreed to
// io_uring until its rings are complete; when Start fails it makes the
// kernel give up on them, so the connection goes on over /dev/fuse.
func Start(dev int, kernel *fuse.InitIn, fs fuse.RawFileSystem, opts *fuse.MountOptions, cfg Config) (*Transport, error) {
	if kernel.Flags64()&fuse.CAP_OVER_IO_URING == 0 || opts.ExtraCapabilities&fuse.CAP_OVER_IO_URING == 0 {
		return nil, errors.New("FUSE over io_uring was not agreed at INIT")
	}
	possible, err := readCPUs("possible")
	var online []int
	if err == nil {
		online, err = readCPUs("online")
	}
	if err != nil {
		giveUp(dev)
		return nil, err
	}
	t := &Transport{dev: dev, ps: fuse.NewProtocolServer(fs, opts), queues: len(possible)}
	// The protocol server parses requests by what INIT agreed: show it the
	// kernel's INIT, as the connection's Server saw it.
	initIn := *kernel
	init := unsafe.Slice((*byte)(unsafe.Pointer(&initIn)), unsafe.Sizeof(initIn))
	if _, st := t.ps.HandleRequest([][]byte{init}, [][]byte{make([]byte, 256)}); !st.Ok() {
		giveUp(dev)
		return nil, fmt.Errorf("replaying INIT: %v", st)
	}
	maxWrite := max(opts.MaxWrite, 128<<10)
	page := os.Getpagesize()
	t.payload = max(minReadBytes, (maxWrite+page-1)/page*page)
	threads := queueThreads(possible, online, cfg.PerCPU)
	n := 0
	t.errs = make(chan error, len(possible)*max(cfg.PerCPU, 1))
	for _, cpu := range possible {
		for range threads[cpu] {
			t.wg.Add(1)
			go t.serve(cpu)
			n++
		}
	}
	for range n {
		if err := <-t.errs; err != nil {
			// Entries already registered stay until the connection ends.
			giveUp(dev)
			return nil, err
		}
	}
	return t, nil
}

// serveDev answers what the kernel sends on /dev/fuse while the rings
// serve the rest, through the same protocol server: an INTERRUPT then
// finds the request it names in flight and cancels it. It returns when
// the connection ends.
func (t *Transport) serveDev(dev int) {
	in := make([]byte, t.payload+4096)
	out := make([]byte, t.payload+4096)
	for {
		n, err := unix.Read(dev, in)
		switch err {
		case nil:
		case unix.EINTR, unix.EAGAIN, unix.ENOENT: // ENOENT: interrupted before it was read
			continue
		default: // ENODEV: unmounted
			return
		}
		m, _ := t.ps.HandleRequest([][]byte{in[:n]}, [][]byte{out})
		switch {
		case m == 0:
		case n >= 8 && binary.LittleEndian.Uint32(in[4:8]) == opInterrupt:
			// The request it names is not in flight here yet: the kernel
			// marks a request sent when it completes a ring entry, and
			// interrupts it at most once, maybe before the ring's thread
			// has handed the request to the protocol server. The EAGAIN
			// answer that would have the kernel send the INTERRUPT again
			// is refused for a ring request (the kernel looks for it on
			// /dev/fuse), so it is delivered again here.
			go t.interruptLater(slices.Clone(in[:n]))
		default:
			unix.Write(dev, out[:m])
		}
	}
}

// interruptLater delivers an INTERRUPT again until the request it names
// is found in flight and cancelled, or for interruptPatience: a request
// that was answered meanwhile is never found.
func (t *Transport) interruptLater(req []byte) {
	out := make([]byte, outHeaderSize+64)
	for deadline := time.Now().Add(interruptPatience); time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		if m, _ := t.ps.HandleRequest([][]byte{req}, [][]byte{out}); m == 0 {
			return
		}
	}
}

// interruptPatience bounds how long an INTERRUPT waits for its request:
// the ring's thread hands a request on within microseconds of taking it.
const interruptPatience = 100 * time.Millisecond

// Served is how many requests the rings have answered.
func (t *Transport) Served() int64 { return t.served.Load() }

// Queues is how many queues (the kernel's possible CPUs) are served.
func (t *Transport) Queues() int { return t.queues }

// Wait blocks until the connection's end (unmount or abort) has ended
// every ring entry and the reading of /dev/fuse.
func (t *Transport) Wait() { t.wg.Wait() }

// giveUp makes the kernel stop waiting for this connection's rings: a
// registration that fails (here, on a queue that does not exist) turns
// the connection's io_uring off.
func giveUp(dev int) {
	r, err := newRing(2)
	if err != nil {
		return
	}
	defer r.close()
	if r.uringCmd(dev, cmdRegister, 0, 2, 0, cmdReq(0, 0xffff)) == nil {
		r.enter(false)
	}
}

// entry is one ring entry's memory, outside Go's heap so that the kernel
// may write it at any time: the iovec pair the registration names, the
// request header area, and the payload.
type entry struct {
	mem     []byte
	iov     []byte // two struct iovec
	header  []byte
	payload []byte
}

func newEntry(payload int) (*entry, error) {
	page := os.Getpagesize()
	mem, err := unix.Mmap(-1, 0, page+payload, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	e := &entry{mem: mem, iov: mem[:32], header: mem[64 : 64+headerSize], payload: mem[page:]}
	le := binary.LittleEndian
	le.PutUint64(e.iov[0:], uint64(uintptr(unsafe.Pointer(&e.header[0]))))
	le.PutUint64(e.iov[8:], headerSize)
	le.PutUint64(e.iov[16:], uint64(uintptr(unsafe.Pointer(&e.payload[0]))))
	le.PutUint64(e.iov[24:], uint64(payload))
	return e, nil
}

// cmdReq is struct fuse_uring_cmd_req: flags, commit_id, qid.
func cmdReq(commitID uint64, qid int) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint64(b[8:], commitID)
	binary.LittleEndian.PutUint16(b[16:], uint16(qid))
	return b
}

// serve is one thread of queue cpu: it registers one entry, reports the
// registration's outcome on t.errs, then answers requests until the
// kernel ends the entry.
func (t *Transport) serve(cpu int) {
	defer t.wg.Done()
	// The thread stays held to cpu until it exits with this goroutine.
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	unix.SchedSetaffinity(0, &set) // an offline CPU's queue is served from anywhere
	r, err := newRing(2)
	if err != nil {
		t.errs <- err
		return
	}
	defer r.close()
	e, err := newEntry(t.payload)
	if err != nil {
		t.errs <- err
		return
	}
	defer unix.Munmap(e.mem)
	if err := r.uringCmd(t.dev, cmdRegister, uintptr(unsafe.Pointer(&e.iov[0])), 2, 0, cmdReq(0, cpu)); err != nil {
		t.errs <- err
		return
	}
	if err := r.enter(false); err != nil {
		t.errs <- err
		return
	}
	// A registration the kernel refuses completes at once; one it takes
	// completes only with the first request.
	var refused int32
	r.reap(func(_ uint64, res int32) { refused = res })
	if refused < 0 {
		t.errs <- fmt.Errorf("registering a FUSE ring entry on queue %d: %w", cpu, unix.Errno(-refused))
		return
	}
	t.errs <- nil
	for {
		if r.ready() == 0 {
			if err := r.enter(true); err != nil {
				return
			}
		}
		res := int32(0)
		r.reap(func(_ uint64, v int32) { res = v })
		if res < 0 {
			// ENOTCONN or ECANCELED: the connection is ending.
			return
		}
		commit := t.answer(e)
		if r.uringCmd(t.dev, cmdCommitAndFetch, 0, 0, 0, cmdReq(commit, cpu)) != nil {
			return
		}
	}
}

// answer serves the request in e and leaves its reply there; it returns
// the request's commit id.
func (t *Transport) answer(e *entry) uint64 {
	le := binary.LittleEndian
	inOut, opIn, ent := e.header[:inOutSize], e.header[inOutSize:entOff], e.header[entOff:]
	commit := le.Uint64(ent[8:])
	payloadLen := int(le.Uint32(ent[16:]))
	unique := le.Uint64(inOut[8:])
	// The kernel puts a request's first argument (its fixed part) in
	// op_in and the rest in the payload; the header's length counts all.
	// Laid end to end they are the request as /dev/fuse would carry it.
	arg0 := int(le.Uint32(inOut[0:])) - inHeaderSize - payloadLen
	n, st := 0, fuse.EIO
	if arg0 >= 0 && arg0 <= opInSize && payloadLen <= len(e.payload) {
		in := [][]byte{inOut[:inHeaderSize], opIn[:arg0], e.payload[:payloadLen]}
		if payloadLen > 0 && le.Uint32(inOut[4:]) != opWrite {
			// The reply is written over the payload: names and other
			// small arguments must not be read from under it.
			in[2] = append([]byte(nil), in[2]...)
		}
		n, st = t.ps.HandleRequest(in, [][]byte{inOut[:outHeaderSize], e.payload})
	}
	if n < outHeaderSize {
		// No reply was written (a malformed request, or none expected):
		// every ring request is still answered, or its entry is lost.
		if st.Ok() {
			st = fuse.ENOSYS
		}
		le.PutUint32(inOut[0:], outHeaderSize)
		le.PutUint32(inOut[4:], uint32(-int32(st)))
		le.PutUint64(inOut[8:], unique)
		n = outHeaderSize
	}
	le.PutUint32(ent[16:], uint32(n-outHeaderSize))
	t.served.Add(1)
	return commit
}

const opWrite = 16 // FUSE_WRITE

// maxThreads bounds the threads (and their buffers, up to 1 MiB each)
// that serve a connection's online CPUs on a machine of many.
const maxThreads = 256

// queueThreads is how many threads serve each CPU's queue. The kernel
// makes a queue for every possible CPU and serves none until all have an
// entry, but only online CPUs make requests: an offline one gets a single
// thread, idle with its buffer untouched, an online one perCPU, fewer
// when the online ones would pass maxThreads, and never none.
func queueThreads(possible, online []int, perCPU int) map[int]int {
	each := max(1, min(perCPU, maxThreads/max(len(online), 1)))
	n := map[int]int{}
	for _, c := range possible {
		n[c] = 1
	}
	for _, c := range online {
		if _, ok := n[c]; ok {
			n[c] = each
		}
	}
	return n
}

// readCPUs lists the kernel's possible or online CPUs.
func readCPUs(which string) ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/" + which)
	if err != nil {
		return nil, err
	}
	return parseCPUList(strings.TrimSpace(string(b)))
}

// parseCPUList reads the kernel's CPU list format ("0-3,8").
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("CPU list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("CPU list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
