// Package bufpool hands out payload buffers in power-of-two size classes so
// the data path allocates no payload-sized slices per request.
package bufpool

import (
	"math/bits"
	"sync"
)

const (
	minShift = 12 // 4 KiB
	maxShift = 28 // 256 MiB
)

var pools [maxShift + 1]sync.Pool

// Get returns a buffer of length n. Return it with Put when done.
func Get(n int) *[]byte {
	s := shift(n)
	if s > maxShift {
		b := make([]byte, n)
		return &b
	}
	if v := pools[s].Get(); v != nil {
		b := v.(*[]byte)
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<s)
	return &b
}

// Put gives b back to its pool. b must not be used afterwards.
func Put(b *[]byte) {
	c := cap(*b)
	s := shift(c)
	if s > maxShift || 1<<s != c {
		return
	}
	pools[s].Put(b)
}

func shift(n int) int {
	if n <= 1<<minShift {
		return minShift
	}
	return bits.Len(uint(n - 1))
}
