package tier

import (
	"log/slog"
	"time"

	"github.com/gd2fs/gd2fs/internal/arena"
)

// DRAM is a DRAM tier: one off-heap arena (internal/arena) cut into pages,
// which a store hands out as page lists to what it caches. Capacity and use
// are counted in whole pages, as both stores report them.
//
// A nil *DRAM is no DRAM tier: no capacity, and Alloc always fails.
// DRAM is not safe for concurrent use: its store serialises Alloc and
// Release under its own lock. Views, CopyIn, CopyOut and Zero touch only
// the pages given, so they may run outside that lock on pages the caller
// owns or has pinned.
type DRAM struct {
	a    *arena.Arena
	page int64
	// Prefault's goroutine: closing stop ends it, done is closed when it
	// has ended (nil when Prefault was not called).
	stop, done chan struct{}
}

// NewDRAM maps a DRAM tier of bytes (rounded down to whole pages of
// pageSize); bytes <= 0 means none and returns nil.
func NewDRAM(bytes int64, pageSize int) (*DRAM, error) {
	if bytes <= 0 {
		return nil, nil
	}
	a, err := arena.New(bytes, pageSize)
	if err != nil {
		return nil, err
	}
	return &DRAM{a: a, page: int64(pageSize)}, nil
}

// PageSize is the size of one page.
func (d *DRAM) PageSize() int64 { return d.page }

// PagesFor is how many pages hold n bytes.
func (d *DRAM) PagesFor(n int64) int { return int((n + d.page - 1) / d.page) }

// Pages is the tier's size in pages (0 for none).
func (d *DRAM) Pages() int {
	if d == nil {
		return 0
	}
	return d.a.Pages()
}

// FreePages is the number of pages not allocated (0 for none).
func (d *DRAM) FreePages() int {
	if d == nil {
		return 0
	}
	return d.a.FreePages()
}

// Cap is the tier's capacity in bytes (0 for none).
func (d *DRAM) Cap() int64 {
	if d == nil {
		return 0
	}
	return int64(d.a.Pages()) * d.page
}

// Used is the bytes of the pages allocated (0 for none).
func (d *DRAM) Used() int64 {
	if d == nil {
		return 0
	}
	return int64(d.a.Pages()-d.a.FreePages()) * d.page
}

// Alloc takes n pages, or returns false leaving the tier unchanged (always
// false for none). Making room first is the store's policy, not the tier's.
func (d *DRAM) Alloc(n int) ([]int32, bool) {
	if d == nil {
		return nil, false
	}
	return d.a.Alloc(n)
}

// Release gives pages back; they stay resident for the next Alloc
// (arena.Release says why).
func (d *DRAM) Release(ps []int32) { d.a.Release(ps) }

// Views returns slices of pages ps covering bytes [off, off+n) of the
// sequence of pages, without copying.
func (d *DRAM) Views(ps []int32, off, n int64) [][]byte { return d.a.Views(ps, off, n) }

// CopyIn copies bufs, one after the other, into pages ps from byte off of
// the page sequence on.
func (d *DRAM) CopyIn(ps []int32, off int64, bufs ...[]byte) {
	for _, b := range bufs {
		d.a.CopyIn(ps, off, b)
		off += int64(len(b))
	}
}

// CopyOut copies bytes [off, off+len(dst)) of the page sequence ps into
// dst and returns len(dst).
func (d *DRAM) CopyOut(dst []byte, ps []int32, off int64) int {
	n := 0
	for _, v := range d.a.Views(ps, off, int64(len(dst))) {
		n += copy(dst[n:], v)
	}
	return n
}

// Zero clears bytes [from, to) of the page sequence ps.
func (d *DRAM) Zero(ps []int32, from, to int64) { d.a.Zero(ps, from, to) }

// Prefault makes the tier resident in the background (arena.Populate says
// why) and logs the outcome to log (if not nil) as the tier called name.
// The tier is usable meanwhile; a failure (an old kernel) only means its
// pages are faulted in by their first writes, as without it. Call it at
// most once, before Close; nothing for none.
func (d *DRAM) Prefault(log *slog.Logger, name string) {
	if d == nil {
		return
	}
	d.stop, d.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(d.done)
		t := time.Now()
		err := d.a.Populate(d.stop)
		switch {
		case log == nil:
		case err != nil:
			log.Warn("DRAM tier not made resident at start; its pages are faulted in by their first writes", "tier", name, "err", err)
		default:
			log.Info("DRAM tier resident", "tier", name, "bytes", d.Cap(), "took", time.Since(t).Round(time.Millisecond))
		}
	}()
}

// Prefaulted is closed once Prefault's work has ended (at once when it
// was not called, or for none).
func (d *DRAM) Prefaulted() <-chan struct{} {
	if d == nil || d.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return d.done
}

// Close stops a Prefault in progress (within one step) and unmaps the
// tier; no page may be used afterwards. Nil for none.
func (d *DRAM) Close() error {
	if d == nil {
		return nil
	}
	if d.stop != nil {
		close(d.stop)
		<-d.done
		d.stop = nil
	}
	return d.a.Close()
}
