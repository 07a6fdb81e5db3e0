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
	closed bool // dropped by its inode: blocks still arriving are not kept
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

// readAt returns the bytes at off, len(dest) at most (fewer at the end of
// the file): a view of the block when they lie inside one (blocks are
// never written after their fetch, so the reply is sent straight from it),
// else copied into dest.
func (r *reader) readAt(ctx context.Context, dest []byte, off int64) ([]byte, error) {
	if off >= r.size || len(dest) == 0 {
		return nil, nil
	}
	if int64(len(dest)) > r.size-off {
		dest = dest[:r.size-off]
	}
	first, last := off/r.bs, (off+int64(len(dest))-1)/r.bs
	r.mu.Lock()
	want := make([]*block, 0, last-first+1)
	for i := first; i <= last; i++ {
		want = append(want, r.get(i, false))
	}
	// Sequential: this read starts at the file's head or follows a block
	// already fetched.
	if _, ok := r.blocks[first-1]; ok || first == 0 {
		for i := last + 1; i <= last+r.window && i*r.bs < r.size; i++ {
			if r.get(i, true) == nil {
				break // the mount's block memory is spent: no more ahead
			}
		}
	}
	r.evict()
	r.mu.Unlock()
	n := 0
	for k, b := range want {
		select {
		case <-b.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if b.err != nil {
			return nil, b.err
		}
		i := first + int64(k)
		lo := int64(0)
		if i == first {
			lo = off - i*r.bs
		}
		if len(want) == 1 {
			return b.buf[lo : lo+int64(len(dest))], nil
		}
		n += copy(dest[n:], b.buf[lo:])
	}
	return dest[:n], nil
}

// get returns block i, starting its fetch when absent. A block fetched
// ahead (ahead) is not started, and get returns nil, while the mount's
// blocks hold Options.Memory; a block a read waits for always is. r.mu is
// held.
func (r *reader) get(i int64, ahead bool) *block {
	r.tick++
	if b, ok := r.blocks[i]; ok {
		b.used = r.tick
		return b
	}
	n := r.bs
	if rest := r.size - i*r.bs; rest < n {
		n = rest
	}
	if ahead && r.m.mem.Load()+n > r.m.opts.Memory {
		return nil
	}
	b := &block{done: make(chan struct{}), used: r.tick}
	r.blocks[i] = b
	r.m.mem.Add(n) // counted from the start: the buffer is allocated now
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
			r.m.mem.Add(-n)
		} else {
			b.buf = buf
			if r.closed { // nobody will evict it: readers waiting hold it
				r.m.mem.Add(-n)
			}
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
		r.m.mem.Add(-int64(len(r.blocks[old].buf)))
		delete(r.blocks, old)
	}
}

// close drops every block (the inode's last handle closed); fetches in
// flight finish for their waiters and are not kept.
func (r *reader) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for i, b := range r.blocks {
		select {
		case <-b.done:
			r.m.mem.Add(-int64(len(b.buf)))
			delete(r.blocks, i)
		default: // in flight: its goroutine uncounts it
		}
	}
}
