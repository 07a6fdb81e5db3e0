// Package arena is off-heap memory for the DRAM tiers: one anonymous mapping
// outside the Go heap, cut into fixed pages, with a free stack, made resident
// page by page by first writes or all at once by Populate. Keeping stored
// bytes off the heap means GC work does not grow with the data held
// (DESIGN.md §4); callers keep small page lists on the heap.
package arena

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Arena is not safe for concurrent use: its owner serialises calls.
type Arena struct {
	mem      []byte
	pageSize int
	free     []int32 // stack of free page numbers
}

// New maps bytes of memory (rounded down to whole pages of pageSize).
func New(bytes int64, pageSize int) (*Arena, error) {
	pages := bytes / int64(pageSize)
	if pages <= 0 {
		return nil, fmt.Errorf("arena: DRAM tier of %d bytes holds no %d-byte page", bytes, pageSize)
	}
	mem, err := unix.Mmap(-1, 0, int(pages)*pageSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("arena: map DRAM tier of %d bytes: %w", bytes, err)
	}
	// Transparent huge pages where the kernel offers them ("madvise" or
	// "always" in /sys/kernel/mm/transparent_hugepage/enabled): a tier's
	// memory is touched once and kept (Release), so 2 MiB pages cost
	// nothing in waste and save 511 of every 512 first-touch faults and
	// most TLB misses. Measured on the VMs gd2fs is developed on (THP
	// "madvise"): first writes into a fresh mapping ran at 0.6-1.4 GB/s
	// against 0.29-0.35 without (256 faults for 512 MiB instead of
	// 131,072), and copies into touched memory at 21-23 GB/s against
	// 16-19. Where THP is off the advice is refused; that is not an error.
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	a := &Arena{mem: mem, pageSize: pageSize, free: make([]int32, pages)}
	for i := range a.free {
		a.free[i] = int32(pages) - 1 - int32(i)
	}
	return a, nil
}

// PageSize is the size of one page.
func (a *Arena) PageSize() int { return a.pageSize }

// Pages is the total number of pages.
func (a *Arena) Pages() int { return len(a.mem) / a.pageSize }

// FreePages is the number of pages not allocated.
func (a *Arena) FreePages() int { return len(a.free) }

// Page returns page p's memory.
func (a *Arena) Page(p int32) []byte {
	o := int(p) * a.pageSize
	return a.mem[o : o+a.pageSize : o+a.pageSize]
}

// Alloc pops n pages, or returns false leaving the arena unchanged.
func (a *Arena) Alloc(n int) ([]int32, bool) {
	if n > len(a.free) {
		return nil, false
	}
	got := make([]int32, n)
	copy(got, a.free[len(a.free)-n:])
	a.free = a.free[:len(a.free)-n]
	return got, true
}

// Release returns pages to the free stack. They stay mapped and resident:
// the tier's memory is the tier's, and the next Alloc reuses them as they
// are. Giving them back (MADV_DONTNEED, then MADV_FREE) cost every reuse:
// DONTNEED a fault and a zeroed page each time; FREE, on a virtual machine
// that traps page-table changes (measured on the Firecracker VMs gd2fs is
// developed on), as much as the first touch of fresh memory: writes into
// released pages ran at 0.27 GB/s against 8.9 GB/s into kept ones, and
// `bench files` perf writes cost 3.6x the CPU per GiB (docs/benchmarks.md,
// issue 26). A DRAM tier of N bytes therefore holds up to N bytes
// resident once it has been full, as a cache of that size does.
func (a *Arena) Release(ps []int32) {
	a.free = append(a.free, ps...)
}

// populateStep is how much Populate makes resident per step, so that a
// stop is noticed within one step (a few milliseconds; tens on a VM whose
// first touch of memory is slow).
const populateStep = 8 << 20

// Populate makes the whole mapping resident and writable now, in steps
// from the first page Alloc hands out to the last, until it is done or
// stop is closed (then it returns nil early). It changes no byte, so it
// may run while other goroutines use pages; it must end before Close.
//
// Why: a page's first write costs a page fault, and on a virtual machine
// a trap to the host as well. Measured on the VMs gd2fs is developed on
// (shadow page tables: the host maps each guest page on its first access
// through the process's own mapping), copies into never-touched pages ran
// at 0.35 GB/s against 17 GB/s into touched ones, and in `gd2fs-bench
// turns` half of each server's CPU went to those faults while its tier
// filled. Each step is two parts: MADV_POPULATE_WRITE (Linux 5.14+; older
// kernels answer EINVAL, returned as an error) allocates the pages and
// sets the process's page tables, as a write would; then one 4-byte load
// per page through the mapping lets such a host map it too (after the
// madvise alone the first copy still ran at 0.35 GB/s, after the loads at
// 14 GB/s). A load, not a write, so that a concurrent writer's bytes are
// never overwritten. This moves the cost off the write path, as a server
// that has run until its tier was full has it; the price is that the tier
// is resident (RSS) from the start, not once full.
func (a *Arena) Populate(stop <-chan struct{}) error {
	osPage := os.Getpagesize()
	for off := 0; off < len(a.mem); {
		select {
		case <-stop:
			return nil
		default:
		}
		end := min(off+populateStep, len(a.mem))
		err := unix.Madvise(a.mem[off:end], unix.MADV_POPULATE_WRITE)
		if errors.Is(err, unix.EINTR) {
			continue // a signal arrived; the kernel asks for the call again
		}
		if err != nil {
			return fmt.Errorf("arena: make the DRAM tier resident (MADV_POPULATE_WRITE, Linux 5.14+): %w", err)
		}
		var sum uint32
		for o := off; o < end; o += osPage {
			// Atomic: other goroutines may be writing this page.
			sum += atomic.LoadUint32((*uint32)(unsafe.Pointer(&a.mem[o])))
		}
		populateSink.Add(sum) // the loads are kept
		off = end
	}
	return nil
}

// populateSink takes Populate's loads so the compiler cannot drop them.
var populateSink atomic.Uint32

// Close unmaps the memory; no page may be used afterwards.
func (a *Arena) Close() error { return unix.Munmap(a.mem) }

// Views returns slices of pages ps covering bytes [off, off+n) of the
// sequence of pages, without copying.
func (a *Arena) Views(ps []int32, off, n int64) [][]byte {
	ls := int64(a.pageSize)
	out := make([][]byte, 0, n/ls+2)
	for n > 0 {
		pg := a.Page(ps[off/ls])
		o := off % ls
		k := min(ls-o, n)
		out = append(out, pg[o:o+k])
		off += k
		n -= k
	}
	return out
}

// CopyIn copies p into pages ps starting at byte off of the page sequence.
func (a *Arena) CopyIn(ps []int32, off int64, p []byte) {
	ls := int64(a.pageSize)
	for len(p) > 0 {
		pg := a.Page(ps[off/ls])
		n := copy(pg[off%ls:], p)
		p = p[n:]
		off += int64(n)
	}
}

// Zero clears bytes [from, to) of the page sequence ps.
func (a *Arena) Zero(ps []int32, from, to int64) {
	ls := int64(a.pageSize)
	for from < to {
		pg := a.Page(ps[from/ls])
		o := from % ls
		n := min(ls-o, to-from)
		clear(pg[o : o+n])
		from += n
	}
}
