package mount

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// reader reads one file from the servers in blocks, for every handle of
// its inode: concurrent misses of one block (eight processes faulting the
// same pages) wait on one fetch, and a read that follows the block before
// it fetches the next blocks ahead, in parallel.
//
// The kernel's page cache is the real cache; blocks only bridge the
// requests in flight. A block is dropped as soon as every page of it has
// been handed to the kernel (it is in the page cache now; asking again
// would only follow an eviction there). Until then it is kept: read-ahead
// never pushes out a block a reader may still ask for, it stops instead
// (the window is full) and goes on as blocks are delivered; only stale
// blocks (no read for two windows' worth of reads: every reader is past
// them, or went away) make room for it. Blocks just delivered are not
// fetched ahead again. An earlier version kept the least recently used
// blocks up to a bound: the kernel's own 64 MiB read-ahead put its
// requests behind the reader's window, the window evicted blocks before
// the kernel asked for them, and a sequential read fetched 1.3-1.5x the
// file, two readers at once 2x (see docs/mount.md).
type reader struct {
	m      *FS
	f      *client.File
	size   int64
	bs     int64
	window int64 // blocks fetched ahead of a sequential reader
	max    int   // blocks held: read-ahead stops there

	mu     sync.Mutex
	blocks map[int64]*block
	seen   map[int64]int64 // blocks read lately (clock): the sequential test
	// Blocks handed whole to the kernel lately (clock): read-ahead skips
	// them. The kernel's requests run in parallel and out of order, so a
	// late request for a block behind starts read-ahead over blocks
	// already delivered and dropped.
	gone map[int64]int64
	// clock counts the bytes asked of this reader: a block not read for
	// stale bytes of reads (twice the blocks the reader holds) was passed
	// by every reader, or fetched for one that went away.
	clock, stale int64
	closed       bool // dropped by its inode: blocks still arriving are not kept
}

type block struct {
	i    int64
	done chan struct{} // closed when buf or err is set
	buf  []byte        // from FS.bufs
	err  error
	used int64 // clock at its fetch or last read
	// Pages not yet handed to the kernel, one bit each.
	pending []uint64
	left    int
	// refs counts the fetch and the replies that still point into buf;
	// out is set once it left r.blocks. buf goes back to the pool when
	// both say so: a reply is written to the kernel after Read returns.
	refs int
	out  bool
}

const pageSize = 4096

func newReader(m *FS, f *client.File) *reader {
	bs := m.opts.BlockSize
	w := m.opts.ReadAhead / bs
	max := 2*w + 4
	return &reader{m: m, f: f, size: f.Size(), bs: bs, window: w, max: int(max), stale: 2 * max * bs,
		blocks: map[int64]*block{}, seen: map[int64]int64{}, gone: map[int64]int64{}}
}

// read returns the bytes at off, n at most (fewer at the end of the file),
// as a reply that points into the blocks (no copy; the blocks are kept
// until the kernel has the bytes).
func (r *reader) read(ctx context.Context, off int64, n int) (fuse.ReadResult, error) {
	if off >= r.size || n <= 0 {
		return fuse.ReadResultData(nil), nil
	}
	end := min(off+int64(n), r.size)
	first, last := off/r.bs, (end-1)/r.bs
	r.mu.Lock()
	r.clock += end - off
	want := make([]*block, 0, last-first+1)
	for i := first; i <= last; i++ {
		b := r.get(i, false)
		b.used = r.clock
		b.refs++ // this read's; kept as the reply's or undone below
		want = append(want, b)
	}
	// Sequential: this read starts at the file's head or follows a block
	// read lately.
	_, follows := r.seen[first-1]
	if follows || first == 0 {
		for i := last + 1; i <= last+r.window && i*r.bs < r.size; i++ {
			if _, ok := r.gone[i]; ok {
				continue
			}
			if r.get(i, true) == nil {
				break // the window or the mount's block memory is full
			}
		}
	}
	for i := first; i <= last; i++ {
		remember(r.seen, i, r.clock, 64)
	}
	r.mu.Unlock()

	reply := &blockReply{r: r, blocks: want}
	for k, b := range want {
		select {
		case <-b.done:
		default:
			r.m.stats.waited.Add(1) // the fetch was not ahead of this read
		}
		var err error
		select {
		case <-b.done:
			err = b.err
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			reply.Done()
			return nil, err
		}
		lo, hi := int64(0), r.bs
		if i := first + int64(k); i == first {
			lo = off - i*r.bs
		}
		if k == len(want)-1 {
			hi = end - (first+int64(k))*r.bs
		}
		reply.data = append(reply.data, b.buf[lo:hi])
	}
	r.mu.Lock()
	for k, b := range want {
		r.delivered(b, reply.data[k])
	}
	r.mu.Unlock()
	return reply, nil
}

// delivered marks the pages of b that d (a slice of b.buf) covers, and
// drops b once the kernel has had every page. A page counts when d covers
// it whole, or up to the end of the file. r.mu is held.
func (r *reader) delivered(b *block, d []byte) {
	if len(d) == 0 || b.out {
		return
	}
	start := int64(cap(b.buf) - cap(d)) // d is b.buf[start:...]
	lo := (start + pageSize - 1) / pageSize
	endOff := start + int64(len(d))
	hi := endOff / pageSize
	if endOff == int64(len(b.buf)) { // the block's (the file's) last page may be short
		hi = (endOff + pageSize - 1) / pageSize
	}
	for p := lo; p < hi; p++ {
		if w, bit := p/64, uint64(1)<<(p%64); b.pending[w]&bit != 0 {
			b.pending[w] &^= bit
			b.left--
		}
	}
	if b.left == 0 {
		remember(r.gone, b.i, r.clock, int(4*r.window)+16)
		r.drop(b)
	}
}

// remember records i at clock t in m, forgetting the oldest entry past
// limit.
func remember(m map[int64]int64, i, t int64, limit int) {
	m[i] = t
	if len(m) <= limit {
		return
	}
	var old int64
	oldest := int64(math.MaxInt64)
	for k, t := range m {
		if t < oldest {
			old, oldest = k, t
		}
	}
	delete(m, old)
}

// get returns block i, starting its fetch when absent. A block fetched
// ahead is not started, and get returns nil, when the reader holds its
// most blocks and none is stale, or when the mount's blocks hold
// Options.Memory; a block a read waits for always is. r.mu is held.
func (r *reader) get(i int64, ahead bool) *block {
	if b, ok := r.blocks[i]; ok {
		return b
	}
	if _, ok := r.gone[i]; ok {
		// Asked again for pages the kernel had: its page cache dropped
		// them (memory pressure, drop_caches) before they were read.
		delete(r.gone, i)
		r.m.stats.reasked.Add(min(r.bs, r.size-i*r.bs))
	}
	n := min(r.bs, r.size-i*r.bs)
	if len(r.blocks) >= r.max {
		r.evict(ahead)
	}
	if ahead && (len(r.blocks) >= r.max || r.m.mem.Load()+n > r.m.opts.Memory) {
		return nil
	}
	pages := (n + pageSize - 1) / pageSize
	b := &block{i: i, done: make(chan struct{}), buf: r.m.getBuf(n), used: r.clock, pending: make([]uint64, (pages+63)/64), left: int(pages), refs: 1}
	for p := int64(0); p < pages; p++ {
		b.pending[p/64] |= 1 << (p % 64)
	}
	r.blocks[i] = b
	r.m.mem.Add(n) // counted from the start: the buffer is taken now
	r.m.stats.blocks.Add(1)
	go func() {
		// The mount's context, not the caller's: another process may be
		// waiting on the same block when this caller is interrupted.
		k, err := r.f.ReadAtContext(r.m.ctx, b.buf, i*r.bs)
		if err == io.EOF && int64(k) == n {
			err = nil
		}
		if err == nil && int64(k) != n {
			err = fmt.Errorf("%s: %d of %d bytes at %d: %w", r.f.Name(), k, n, i*r.bs, errs.ErrInternal)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			b.err = err
			r.m.stats.fetchErrors.Add(1)
			r.drop(b) // the next read tries again
		} else if r.closed {
			r.drop(b) // nobody else will: readers waiting hold it
		}
		close(b.done)
		r.unref(b)
	}()
	return b
}

// drop takes b out of the reader; its buffer goes back to the pool when
// the last reply pointing into it is written. r.mu is held.
func (r *reader) drop(b *block) {
	if b.out {
		return
	}
	b.out = true
	if r.blocks[b.i] == b {
		delete(r.blocks, b.i)
	}
	r.m.mem.Add(-int64(len(b.buf)))
	if b.err == nil && b.left > 0 && !r.closed {
		r.m.stats.droppedUnread.Add(int64(b.left) * pageSize)
	}
}

// unref releases one reference to b. r.mu is held.
func (r *reader) unref(b *block) {
	b.refs--
	if b.refs == 0 && b.out && b.buf != nil {
		r.m.putBuf(b.buf)
		b.buf = nil
	}
}

// evict drops finished blocks (never one in flight), least recently read
// or fetched first, down to the bound: for read-ahead (ahead) only stale
// ones, for a block a read waits for any. r.mu is held.
func (r *reader) evict(ahead bool) {
	for len(r.blocks) >= r.max {
		var victim *block
		for _, b := range r.blocks {
			select {
			case <-b.done:
			default:
				continue // in flight
			}
			if victim == nil || b.used < victim.used {
				victim = b
			}
		}
		if victim == nil || ahead && r.clock-victim.used <= r.stale {
			return
		}
		r.drop(victim)
	}
}

// close drops every block (the inode's last handle closed); fetches in
// flight finish for their waiters and are not kept.
func (r *reader) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, b := range r.blocks {
		select {
		case <-b.done:
			r.drop(b)
		default: // in flight: its goroutine drops it
		}
	}
}

// blockReply is a read's reply: slices of blocks, written to the kernel
// with one writev after Read returns (go-fuse calls Done then).
type blockReply struct {
	r      *reader
	blocks []*block
	data   [][]byte
}

func (x *blockReply) Size() int {
	n := 0
	for _, d := range x.data {
		n += len(d)
	}
	return n
}

// Slices makes go-fuse write the reply with writev straight from the
// blocks (not through a splice pipe: there is no file to splice from).
func (x *blockReply) Slices() ([][]byte, fuse.Status) { return x.data, fuse.OK }

func (x *blockReply) Bytes(buf []byte) ([]byte, fuse.Status) {
	if len(x.data) == 1 {
		return x.data[0], fuse.OK
	}
	buf = buf[:0]
	for _, d := range x.data {
		buf = append(buf, d...)
	}
	return buf, fuse.OK
}

func (x *blockReply) Done() {
	if x.blocks == nil {
		return
	}
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	for _, b := range x.blocks {
		x.r.unref(b)
	}
	x.blocks = nil
}
