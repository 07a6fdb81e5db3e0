// Package bufpool hands out payload buffers in power-of-two size classes so
// the data path allocates no payload-sized slices per request.
//
// It keeps free buffers in bounded channels rather than a sync.Pool: a
// sync.Pool is emptied at every GC, and with multi-MiB payloads GCs are
// frequent, so the pool would keep allocating (and zeroing) fresh buffers.
package bufpool

import (
	"math/bits"
	"sync/atomic"
)

const (
	minShift  = 12 // 4 KiB
	maxShift  = 28 // 256 MiB
	keepBytes = 256 << 20
)

var free [maxShift + 1]chan *[]byte

// held is the bytes of the buffers kept in the free lists: up to about
// keepBytes per size class (about 3.2 GiB in all), memory no other figure
// counts.
var held atomic.Int64

// Held is the bytes of free buffers the pool keeps (the process's
// gd2fs_bufpool_held_bytes).
func Held() int64 { return held.Load() }

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
		held.Add(-int64(cap(*b)))
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
	held.Add(int64(c)) // before the send: a Get may take it at once
	select {
	case free[s] <- b:
	default: // enough kept; let the GC have it
		held.Add(-int64(c))
	}
}

func shift(n int) int {
	if n <= 1<<minShift {
		return minShift
	}
	return bits.Len(uint(n - 1))
}
