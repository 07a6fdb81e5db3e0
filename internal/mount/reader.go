package mount

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/gd2fs/gd2fs/errs"

	"github.com/gd2fs/gd2fs/client"
)

// reader reads one file from the servers in blocks, for every handle of
// its inode: concurrent misses of one block (eight processes faulting the
// same pages) wait on one fetch, and a read that follows the block before
// it fetches the next ReadAhead bytes in parallel. Blocks are kept, least
// recently used out, up to the read-ahead window plus a few: the kernel's
// page cache is the real cache, this only bridges the requests in flight.
type reader struct {
	m      *FS
	f      *client.File
	size   int64
	bs     int64
	window int64 // blocks fetched ahead of a sequential reader
	max    int   // blocks kept

	mu     sync.Mutex
	blocks map[int64]*block
	tick   uint64
}

type block struct {
	done chan struct{} // closed when buf or err is set
	buf  []byte
	err  error
	used uint64
}

func newReader(m *FS, f *client.File) *reader {
	bs := m.opts.BlockSize
	w := m.opts.ReadAhead / bs
	return &reader{m: m, f: f, size: f.Size(), bs: bs, window: w, max: int(w) + 8, blocks: map[int64]*block{}}
}

// readAt fills dest (within the file) from the blocks covering it.
func (r *reader) readAt(ctx context.Context, dest []byte, off int64) (int, error) {
	if off >= r.size || len(dest) == 0 {
		return 0, nil
	}
	if int64(len(dest)) > r.size-off {
		dest = dest[:r.size-off]
	}
	first, last := off/r.bs, (off+int64(len(dest))-1)/r.bs
	r.mu.Lock()
	want := make([]*block, 0, last-first+1)
	for i := first; i <= last; i++ {
		want = append(want, r.get(i))
	}
	// Sequential: this read starts at the file's head or follows a block
	// already fetched.
	if _, ok := r.blocks[first-1]; ok || first == 0 {
		for i := last + 1; i <= last+r.window && i*r.bs < r.size; i++ {
			r.get(i)
		}
	}
	r.evict()
	r.mu.Unlock()
	n := 0
	for k, b := range want {
		select {
		case <-b.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if b.err != nil {
			return 0, b.err
		}
		i := first + int64(k)
		lo := int64(0)
		if i == first {
			lo = off - i*r.bs
		}
		n += copy(dest[n:], b.buf[lo:])
	}
	return n, nil
}

// get returns block i, starting its fetch when absent. r.mu is held.
func (r *reader) get(i int64) *block {
	r.tick++
	if b, ok := r.blocks[i]; ok {
		b.used = r.tick
		return b
	}
	b := &block{done: make(chan struct{}), used: r.tick}
	r.blocks[i] = b
	n := r.bs
	if rest := r.size - i*r.bs; rest < n {
		n = rest
	}
	go func() {
		// The mount's context, not the caller's: another process may be
		// waiting on the same block when this caller is interrupted.
		buf := make([]byte, n)
		k, err := r.f.ReadAtContext(r.m.ctx, buf, i*r.bs)
		if err == io.EOF && int64(k) == n {
			err = nil
		}
		if err == nil && int64(k) != n {
			err = fmt.Errorf("%s: %d of %d bytes at %d: %w", r.f.Name(), k, n, i*r.bs, errs.ErrInternal)
		}
		r.mu.Lock()
		if err != nil {
			b.err = err
			delete(r.blocks, i) // the next read tries again
		} else {
			b.buf = buf
		}
		close(b.done)
		r.mu.Unlock()
	}()
	return b
}

// evict drops the least recently used finished blocks over the bound.
// r.mu is held.
func (r *reader) evict() {
	for len(r.blocks) > r.max {
		var old int64 = -1
		var oldest uint64
		for i, b := range r.blocks {
			select {
			case <-b.done:
			default:
				continue // in flight
			}
			if old < 0 || b.used < oldest {
				old, oldest = i, b.used
			}
		}
		if old < 0 {
			return
		}
		delete(r.blocks, old)
	}
}
