package bench

import "golang.org/x/sys/unix"

// HugeBuffers makes Buffer, and so the loopback and disk references'
// buffers, anonymous memory advised for transparent huge pages instead of
// Go slices. Set it before the first measurement. On a virtual machine the
// kernel's copies from and into 4 KiB pages of a large buffer pay the
// nested page walks: a gd2fs client's perf read into a 1 GiB Go slice cost
// a fifth more CPU a GiB than into huge pages (docs/benchmarks.md, issue
// 26, "the client's buffers on huge pages"). A caller's buffers are its
// own, so a benchmark shows both, its references on the same memory.
var HugeBuffers bool

// Buffer returns n bytes (zeroed) for a benchmark's own data: a Go slice,
// or with HugeBuffers a mapping advised MADV_HUGEPAGE, kept for the
// process's life (a benchmark's buffers are). A mapping that fails falls
// back to a Go slice.
func Buffer(n int64) []byte {
	if !HugeBuffers || n <= 0 {
		return make([]byte, n)
	}
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, n)
	}
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // advice: without it the pages are 4 KiB, as a Go slice's
	return b
}
