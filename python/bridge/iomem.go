package bridge

import (
	"sync"
	"unsafe"

	"github.com/gd2fs/gd2fs/errs"
)

// maxRegion bounds one IOMEM or SGE: 1 TiB is far beyond any KV cache layer
// and keeps every sum of lengths far from overflowing int64.
const maxRegion = 1 << 40

// iomem is one registered memory range. On TCP it is bookkeeping: what
// transfers may touch. users counts transfers in flight that hold it, so
// deregistration can wait for them before the caller frees the memory.
type iomem struct {
	base, end uintptr // [base, end)
	users     int
	dead      bool
}

type iomems struct {
	mu   sync.Mutex
	idle *sync.Cond // signalled when users drops
	next uint64
	m    map[uint64]*iomem
}

func (t *iomems) init() {
	t.m = map[uint64]*iomem{}
	t.idle = sync.NewCond(&t.mu)
}

// RegIOMEM registers [p, p+n) for transfers and returns its id (never 0).
func (e *Engine) RegIOMEM(p unsafe.Pointer, n int64) (uint64, error) {
	if err := e.alive(); err != nil {
		return 0, err
	}
	base := uintptr(p)
	if base == 0 {
		return 0, errs.New(errs.ErrBadRequest, "RegIOMEM: address is NULL")
	}
	if n <= 0 || n > maxRegion {
		return 0, errs.New(errs.ErrBadRequest, "RegIOMEM: length %d outside 1..%d", n, int64(maxRegion))
	}
	end := base + uintptr(n)
	if end < base {
		return 0, errs.New(errs.ErrBadRequest, "RegIOMEM: [%#x, +%d) wraps around the address space", base, n)
	}
	t := &e.mem
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.m[t.next] = &iomem{base: base, end: end}
	return t.next, nil
}

// DeregIOMEM removes an IOMEM: new transfers may no longer use it. It waits
// for the transfers in flight that use it, so that once it returns no
// goroutine writes into (or reads from) that memory again and the caller may
// free it.
func (e *Engine) DeregIOMEM(id uint64) error {
	t := &e.mem
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.m[id]
	if !ok {
		return errs.New(errs.ErrBadRequest, "DeregIOMEM: IOMEM %d is not registered with this client (deregistered twice?)", id)
	}
	m.dead = true
	delete(t.m, id)
	for m.users > 0 {
		t.idle.Wait()
	}
	return nil
}

// Seg is one scatter-gather element as the caller gave it.
type Seg struct {
	Ptr   unsafe.Pointer
	Len   int64
	IOMEM uint64
}

// acquire checks that every segment lies inside its live IOMEM and takes a
// reference on each IOMEM, so that deregistration waits for this transfer.
// It returns the segments as byte slices over the caller's memory.
func (t *iomems) acquire(segs []Seg) ([][]byte, []*iomem, int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	bufs := make([][]byte, len(segs))
	held := make([]*iomem, 0, 2)
	var total int64
	for i, s := range segs {
		m, ok := t.m[s.IOMEM]
		if !ok {
			return nil, nil, 0, errs.New(errs.ErrBadRequest, "SGE %d: IOMEM %d is not registered with this client (deregistered?)", i, s.IOMEM)
		}
		base := uintptr(s.Ptr)
		if s.Len <= 0 || s.Len > maxRegion {
			return nil, nil, 0, errs.New(errs.ErrBadRequest, "SGE %d: length %d outside 1..%d", i, s.Len, int64(maxRegion))
		}
		// base+Len cannot wrap: base >= m.base and Len <= end-base is checked
		// without adding.
		if base < m.base || base >= m.end || uintptr(s.Len) > m.end-base {
			return nil, nil, 0, errs.New(errs.ErrBadRequest, "SGE %d: [%#x, +%d) lies outside its IOMEM [%#x, %#x)", i, base, s.Len, m.base, m.end)
		}
		total += s.Len
		if total > maxRegion {
			return nil, nil, 0, errs.New(errs.ErrBadRequest, "SGEs add up to more than %d bytes", int64(maxRegion))
		}
		bufs[i] = unsafe.Slice((*byte)(s.Ptr), int(s.Len))
		found := false
		for _, h := range held {
			found = found || h == m
		}
		if !found {
			held = append(held, m)
		}
	}
	for _, m := range held {
		m.users++
	}
	return bufs, held, total, nil
}

func (t *iomems) release(held []*iomem) {
	t.mu.Lock()
	for _, m := range held {
		m.users--
	}
	t.mu.Unlock()
	t.idle.Broadcast()
}
