package datapath

import (
	"os"
	"sync"
)

// Fetched data lands in buffers from this pool. A reader that is done with
// one hands it back (PutBuffer), so a stream of chunks reuses a few
// buffers instead of making garbage at the transfer's rate: at 1.5 GB/s
// the collector's work otherwise costs a fifth of the throughput on two
// cores (docs/benchmarks.md).
var buffers sync.Pool

// GetBuffer returns a buffer of n bytes, recycled when one is big enough.
func GetBuffer(n int) []byte {
	if p, ok := buffers.Get().(*[]byte); ok {
		if cap(*p) >= n {
			return (*p)[:n]
		}
		buffers.Put(p)
	}
	return make([]byte, n)
}

// PutBuffer gives back a buffer that nothing refers to any more. Buffers
// of other origins are welcome too, within bounds.
func PutBuffer(b []byte) {
	if cap(b) < 64<<10 || cap(b) > MaxPiece {
		return
	}
	if poison() {
		b = b[:cap(b)]
		for i := range b {
			b[i] = 0xdb
		}
	}
	b = b[:0]
	buffers.Put(&b)
}

// poison reports whether HOARD_POISON_BUFFERS=1 is set: buffers given back
// are then overwritten at once, so that a reader still using one (a
// recycling bug) gets wrong bytes, which the tests see, rather than bytes
// that are only sometimes wrong.
var poison = sync.OnceValue(func() bool { return os.Getenv("HOARD_POISON_BUFFERS") == "1" })
