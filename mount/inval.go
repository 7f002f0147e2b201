package mount

import (
	"sync"
	"time"

	"github.com/hoardfs/hoard/node"
)

// invalQueue carries kernel invalidations out of the cache manager. Adding
// never blocks on the kernel: FIDs are put in a set (so a storm of breaks
// on one file costs one notification) and a worker goroutine, holding no
// lock a FUSE handler could need, talks to the kernel. Synchronous
// invalidation from request handlers has deadlocked libfuse and go-fuse
// file systems (libfuse's GitHub #341); here a handler never sends one.
type invalQueue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pending map[node.FID]struct{}
	added   uint64 // sequence of the latest add
	done    uint64 // every add up to this one has been sent
	kick    chan struct{}
	stop    chan struct{}
	send    func(node.FID)
}

func newInvalQueue(send func(node.FID)) *invalQueue {
	q := &invalQueue{pending: map[node.FID]struct{}{}, kick: make(chan struct{}, 1), stop: make(chan struct{}), send: send}
	q.cond = sync.NewCond(&q.mu)
	go q.run()
	return q
}

// add queues fids and returns a ticket for wait.
func (q *invalQueue) add(fids []node.FID) uint64 {
	q.mu.Lock()
	for _, f := range fids {
		q.pending[f] = struct{}{}
	}
	q.added++
	seq := q.added
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
	return seq
}

// wait blocks until the notifications of ticket seq were sent, or for at
// most limit: a kernel that does not take them must not hold up the
// caller (the back channel, and behind it another client's write) for
// longer than that.
func (q *invalQueue) wait(seq uint64, limit time.Duration) bool {
	timer := time.AfterFunc(limit, func() {
		q.mu.Lock()
		q.cond.Broadcast()
		q.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(limit)
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.done < seq {
		if !time.Now().Before(deadline) {
			return false
		}
		q.cond.Wait()
	}
	return true
}

// sent is the latest ticket whose notifications were all sent.
func (q *invalQueue) sent() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.done
}

func (q *invalQueue) run() {
	for {
		select {
		case <-q.stop:
			return
		case <-q.kick:
		}
		q.mu.Lock()
		batch := q.pending
		q.pending = map[node.FID]struct{}{}
		upto := q.added
		q.mu.Unlock()
		for f := range batch {
			q.send(f)
		}
		q.mu.Lock()
		q.done = upto
		q.cond.Broadcast()
		q.mu.Unlock()
	}
}

func (q *invalQueue) close() { close(q.stop) }
