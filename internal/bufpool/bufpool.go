// Package bufpool hands out payload buffers in power-of-two size classes so
// the data path allocates no payload-sized slices per request.
//
// It keeps free buffers in bounded channels rather than a sync.Pool: a
// sync.Pool is emptied at every GC, and with multi-MiB payloads GCs are
// frequent, so the pool would keep allocating (and zeroing) fresh buffers.
package bufpool

import "math/bits"

const (
	minShift  = 12 // 4 KiB
	maxShift  = 28 // 256 MiB
	keepBytes = 256 << 20
)

var free [maxShift + 1]chan *[]byte

func init() {
	for s := minShift; s <= maxShift; s++ {
		n := max(2, keepBytes>>s)
		free[s] = make(chan *[]byte, min(n, 1024))
	}
}

// Get returns a buffer of length n. Return it with Put when done.
func Get(n int) *[]byte {
	s := shift(n)
	if s > maxShift {
		b := make([]byte, n)
		return &b
	}
	select {
	case b := <-free[s]:
		*b = (*b)[:n]
		return b
	default:
	}
	b := make([]byte, n, 1<<s)
	return &b
}

// Put gives b back. b must not be used afterwards.
func Put(b *[]byte) {
	c := cap(*b)
	s := shift(c)
	if s > maxShift || 1<<s != c {
		return
	}
	select {
	case free[s] <- b:
	default: // enough kept; let the GC have it
	}
}

func shift(n int) int {
	if n <= 1<<minShift {
		return minShift
	}
	return bits.Len(uint(n - 1))
}
