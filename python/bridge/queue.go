package bridge

import (
	"encoding/binary"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Queues a transfer completes into. Requests of the asyncio API go to their
// own queue so that Wait never hands a caller a request an event loop is
// waiting for, and the other way round.
const (
	QueueWait  = 0
	QueueAsync = 1
	numQueues  = 2
)

// Result is a completed transfer.
type Result struct {
	ID     uint64
	Status int
	Value  int64 // bytes moved
	Err    string
}

// queue holds completed transfers until they are collected. Its eventfd is
// readable exactly while results are waiting: it is written when the queue
// turns non-empty and drained when it is emptied, both under mu, so a
// poller of the fd never misses a completion nor sees a stale one for long.
type queue struct {
	mu       sync.Mutex
	done     []Result
	inflight int
	efd      int
	notify   chan struct{} // a completion arrived (capacity 1)
}

func newQueue() (*queue, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &queue{efd: fd, notify: make(chan struct{}, 1)}, nil
}

func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.efd >= 0 {
		unix.Close(q.efd)
		q.efd = -1
	}
}

// Fd is the eventfd that is readable while results are waiting.
func (q *queue) fd() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.efd
}

func (q *queue) start() {
	q.mu.Lock()
	q.inflight++
	q.mu.Unlock()
}

func (q *queue) complete(r Result) {
	q.mu.Lock()
	q.inflight--
	q.done = append(q.done, r)
	if len(q.done) == 1 && q.efd >= 0 {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		unix.Write(q.efd, one[:])
	}
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// take removes up to max results; it reports whether nothing is waiting
// and nothing is in flight (so waiting would never end).
func (q *queue) take(max int) ([]Result, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.done) == 0 {
		return nil, q.inflight == 0
	}
	n := min(max, len(q.done))
	out := append([]Result(nil), q.done[:n]...)
	q.done = append(q.done[:0], q.done[n:]...)
	if len(q.done) == 0 && q.efd >= 0 {
		var buf [8]byte
		unix.Read(q.efd, buf[:])
	}
	return out, false
}

// wait returns up to max completed transfers. timeout < 0 waits until at
// least one completes; 0 only collects. It returns at once, empty, when no
// transfer is in flight: waiting for one that was never submitted would
// hang.
func (q *queue) wait(timeout time.Duration, max int) []Result {
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	for {
		out, idle := q.take(max)
		if len(out) > 0 || idle || timeout == 0 {
			return out
		}
		select {
		case <-q.notify:
		case <-deadline:
			out, _ := q.take(max)
			return out
		}
	}
}

// Wait collects completed transfers of queue qi (see queue.wait).
func (e *Engine) Wait(qi int, timeout time.Duration, max int) ([]Result, error) {
	if qi < 0 || qi >= numQueues {
		return nil, badQueue(qi)
	}
	if max < 1 {
		max = 1
	}
	return e.queues[qi].wait(timeout, max), nil
}

// Fd is queue qi's eventfd: readable while completed transfers wait there.
func (e *Engine) Fd(qi int) (int, error) {
	if qi < 0 || qi >= numQueues {
		return -1, badQueue(qi)
	}
	return e.queues[qi].fd(), nil
}
