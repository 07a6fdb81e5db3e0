package store

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// arena is the DRAM tier's memory: one anonymous mapping outside the Go heap,
// cut into fixed pages. Keeping stored bytes off the heap means GC work does
// not grow with the data held (DESIGN.md §4); the page table of a chunk is a
// small []int32 on the heap.
type arena struct {
	mem  []byte
	free []int32 // stack of free page numbers
}

func newArena(bytes int64) (*arena, error) {
	pages := bytes / BlockSize
	if pages <= 0 {
		return nil, fmt.Errorf("store: DRAM tier of %d bytes holds no %d-byte page", bytes, BlockSize)
	}
	mem, err := unix.Mmap(-1, 0, int(pages*BlockSize), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("store: map DRAM tier of %d bytes: %w", bytes, err)
	}
	a := &arena{mem: mem, free: make([]int32, pages)}
	for i := range a.free {
		a.free[i] = int32(pages) - 1 - int32(i)
	}
	return a, nil
}

func (a *arena) pages() int     { return len(a.mem) / BlockSize }
func (a *arena) freePages() int { return len(a.free) }

func (a *arena) page(p int32) []byte {
	o := int(p) * BlockSize
	return a.mem[o : o+BlockSize : o+BlockSize]
}

// alloc pops n pages, or returns false leaving the arena unchanged.
func (a *arena) alloc(n int) ([]int32, bool) {
	if n > len(a.free) {
		return nil, false
	}
	got := make([]int32, n)
	copy(got, a.free[len(a.free)-n:])
	a.free = a.free[:len(a.free)-n]
	return got, true
}

// release returns pages. They are marked MADV_FREE: the kernel may take the
// memory back under pressure, but a page reused before that costs no fault
// (MADV_DONTNEED made every reuse fault and zero 16 small pages, which showed
// up as a third of the write path's CPU).
func (a *arena) release(ps []int32) {
	for _, p := range ps {
		_ = unix.Madvise(a.page(p), unix.MADV_FREE)
	}
	a.free = append(a.free, ps...)
}

func (a *arena) close() error { return unix.Munmap(a.mem) }
