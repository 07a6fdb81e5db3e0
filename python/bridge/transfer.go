package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

// Op is a transfer's direction.
type Op int

// Transfer directions.
const (
	OpRead  Op = 0
	OpWrite Op = 1
)

func (o Op) String() string {
	if o == OpWrite {
		return "write"
	}
	return "read"
}

// KnownFlags are the flags Read and Write accept. None is defined yet; a
// non-zero flag is refused rather than ignored, so a caller relying on one
// learns it does nothing here.
const KnownFlags uint32 = 0

// Options are the parsed opts string of Write: "pool=ha", "chunk_size=1048576",
// comma- or semicolon-separated. Read accepts only "".
type Options struct {
	Pool      string
	ChunkSize int64
}

// ParseOptions parses an opts string.
func ParseOptions(s string) (Options, error) {
	var o Options
	for _, kv := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' }) {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || v == "" {
			return o, errs.New(errs.ErrBadRequest, "opts %q: %q is not key=value", s, kv)
		}
		switch k {
		case "pool":
			o.Pool = v
		case "chunk_size":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 || n%(64<<10) != 0 {
				return o, errs.New(errs.ErrBadRequest, "opts %q: chunk_size must be a positive multiple of 65536", s)
			}
			o.ChunkSize = n
		default:
			return o, errs.New(errs.ErrBadRequest, "opts %q: unknown option %q (known: pool, chunk_size)", s, k)
		}
	}
	return o, nil
}

func badQueue(q int) error {
	return errs.New(errs.ErrBadRequest, "queue %d: want %d (Wait) or %d (asyncio)", q, QueueWait, QueueAsync)
}

// CleanPath checks a namespace path: absolute, no "..", no empty parts.
func CleanPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", errs.New(errs.ErrBadRequest, "path %q: want an absolute path such as /kv/model/0", p)
	}
	return nspath.Clean(p)
}

// Submit starts a transfer of the file range [off, off+sum(len)) into
// (OpRead) or out of (OpWrite) segs, in order, and returns its id at once.
// Bad input is an error here; failures of the transfer itself (a missing
// file, a dead server, a sealed file) complete it with a non-zero status.
func (e *Engine) Submit(op Op, path string, off int64, segs []Seg, flags uint32, opts string, qi int) (uint64, error) {
	if err := e.alive(); err != nil {
		return 0, err
	}
	if op != OpRead && op != OpWrite {
		return 0, errs.New(errs.ErrBadRequest, "unknown op %d", op)
	}
	if qi < 0 || qi >= numQueues {
		return 0, badQueue(qi)
	}
	clean, err := CleanPath(path)
	if err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, errs.New(errs.ErrBadRequest, "%s %s: negative offset %d", op, path, off)
	}
	if flags&^KnownFlags != 0 {
		return 0, errs.New(errs.ErrBadRequest, "%s %s: unknown flags %#x (none is defined; pass 0)", op, path, flags)
	}
	o, err := ParseOptions(opts)
	if err != nil {
		return 0, err
	}
	if op == OpRead && opts != "" {
		return 0, errs.New(errs.ErrBadRequest, "read %s: opts %q: reads take no options", path, opts)
	}
	if len(segs) == 0 {
		return 0, errs.New(errs.ErrBadRequest, "%s %s: no SGEs", op, path)
	}
	bufs, held, total, err := e.mem.acquire(segs)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", op, path, err)
	}
	if off > maxRegion<<10 || off+total < off {
		e.mem.release(held)
		return 0, errs.New(errs.ErrBadRequest, "%s %s: offset %d too large", op, path, off)
	}
	id := e.id()
	limit := e.admit(op, total)
	ctx, cancel := context.WithTimeout(e.ctx, limit)
	e.mu.Lock()
	e.cancels[id] = cancel
	e.mu.Unlock()
	q := e.queues[qi]
	q.start()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		var n int64
		var err error
		func() {
			defer func() {
				if p := recover(); p != nil {
					err = errs.New(errs.ErrInternal, "panic: %v", p)
				}
			}()
			e.sem <- struct{}{}
			defer func() { <-e.sem }()
			if op == OpRead {
				n, err = e.read(ctx, clean, off, bufs)
			} else {
				n, err = e.write(ctx, clean, off, bufs, o)
			}
		}()
		e.mem.release(held)
		e.queued.Add(-total)
		e.mu.Lock()
		delete(e.cancels, id)
		e.mu.Unlock()
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// Status TIMEOUT whatever the last error was: the transfer's
			// own deadline ended it.
			more := ""
			if op == OpWrite {
				more = ", plus GD2FS_MASTER_RETRY"
			}
			err = fmt.Errorf("%w: not done within %s (GD2FS_IO_TIMEOUT plus 1s per 8 MiB of it and of the transfers queued before it%s): a data server is stopped, overloaded or cut off; recompute these blocks, or raise GD2FS_IO_TIMEOUT if the servers are only slow (last error: %v)",
				context.DeadlineExceeded, limit.Round(time.Millisecond), more, err)
		}
		cancel()
		r := Result{ID: id, Status: Code(err), Value: n}
		if err != nil {
			r.Err = fmt.Sprintf("%s %s [%d, %d): %v", op, clean, off, off+total, err)
		}
		q.complete(r)
	}()
	return id, nil
}

// Cancel asks a transfer in flight to stop; it completes with status
// Cancelled (or its own status, when it ended first).
func (e *Engine) Cancel(id uint64) {
	e.mu.Lock()
	c := e.cancels[id]
	e.mu.Unlock()
	if c != nil {
		c()
	}
}

// parallelSegs bounds the SGEs of one transfer that move at once; each
// ReadAt/WriteAt runs its own pieces in parallel too.
const parallelSegs = 16

// each runs fn for every buffer with its file offset, in parallel, and
// returns the bytes of the buffers that succeeded and the first error.
func each(ctx context.Context, off int64, bufs [][]byte, fn func(ctx context.Context, b []byte, off int64) error) (int64, error) {
	if len(bufs) == 1 {
		if err := fn(ctx, bufs[0], off); err != nil {
			return 0, err
		}
		return int64(len(bufs[0])), nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var moved atomic.Int64
	var first error
	var once sync.Once
	sem := make(chan struct{}, parallelSegs)
	var wg sync.WaitGroup
	for _, b := range bufs {
		o := off
		off += int64(len(b))
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, b, o); err != nil {
				once.Do(func() { first = err; cancel() })
				return
			}
			moved.Add(int64(len(b)))
		}()
	}
	wg.Wait()
	return moved.Load(), first
}

func (e *Engine) read(ctx context.Context, path string, off int64, bufs [][]byte) (int64, error) {
	var total int64
	for _, b := range bufs {
		total += int64(len(b))
	}
	f, err := e.files.forRead(ctx, path, off, total)
	if err != nil {
		return 0, err
	}
	n, err := each(ctx, off, bufs, func(ctx context.Context, b []byte, o int64) error {
		k, err := f.ReadAtContext(ctx, b, o)
		if err == io.EOF && k == len(b) {
			err = nil
		}
		if err == io.EOF {
			err = errs.New(errs.ErrOutOfRange, "the file ends before %d", o+int64(len(b)))
		}
		return err
	})
	if err != nil {
		e.files.forget(path)
	}
	return n, err
}

func (e *Engine) write(ctx context.Context, path string, off int64, bufs [][]byte, o Options) (int64, error) {
	ent, err := e.files.forWrite(ctx, path, o)
	if err != nil {
		return 0, err
	}
	n, err := each(ctx, off, bufs, func(ctx context.Context, b []byte, o int64) error {
		_, err := ent.f.WriteAtContext(ctx, b, o)
		return err
	})
	if err == nil && !ent.commitRecords {
		// Sync makes the bytes visible to other clients (size and chunk
		// lengths at the master); it takes the larger size, so concurrent
		// writers of one file never shrink it. A session's file needs none:
		// its bytes become visible with the session commit that names
		// them, which records their size once the servers hold them
		// (FileInfo.CommitRecordsSize) — one master round trip a turn less.
		err = ent.f.Sync(ctx)
	}
	if err != nil {
		e.files.forget(path)
		return n, err
	}
	ent.wrote(off, bufs)
	return n, nil
}

// fileCache keeps one open handle per path. A read uses the cached handle
// only when the chunk map it holds covers the range (size and every chunk's
// written length); otherwise it reopens, so bytes another client wrote since
// are never mistaken for a hole.
type fileCache struct {
	c  *client.Client
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	f *client.File
	// commitRecords: a session's file, written without a Sync (write).
	commitRecords bool

	mu      sync.Mutex
	chunk   int64
	lengths map[int64]int64 // chunk index -> written length, as known
}

func (fc *fileCache) init(c *client.Client) {
	fc.c = c
	fc.m = map[string]*entry{}
}

func newEntry(f *client.File) *entry {
	info := f.Info()
	ent := &entry{f: f, commitRecords: info.CommitRecordsSize, chunk: info.ChunkSize, lengths: make(map[int64]int64, len(info.Chunks))}
	for _, c := range info.Chunks {
		ent.lengths[c.Index] = c.Length
	}
	return ent
}

// covers: the handle knows every byte of [off, off+n).
func (ent *entry) covers(off, n int64) bool {
	if off+n > ent.f.Size() {
		return false
	}
	if ent.chunk <= 0 || n == 0 {
		return ent.chunk > 0
	}
	ent.mu.Lock()
	defer ent.mu.Unlock()
	for idx := off / ent.chunk; idx <= (off+n-1)/ent.chunk; idx++ {
		need := min(off+n, (idx+1)*ent.chunk) - idx*ent.chunk
		if ent.lengths[idx] < need {
			return false
		}
	}
	return true
}

func (ent *entry) wrote(off int64, bufs [][]byte) {
	if ent.chunk <= 0 {
		return
	}
	ent.mu.Lock()
	defer ent.mu.Unlock()
	for _, b := range bufs {
		end := off + int64(len(b))
		for idx := off / ent.chunk; idx <= (end-1)/ent.chunk; idx++ {
			l := min(end, (idx+1)*ent.chunk) - idx*ent.chunk
			ent.lengths[idx] = max(ent.lengths[idx], l)
		}
		off = end
	}
}

func (fc *fileCache) get(path string) *entry {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.m[path]
}

func (fc *fileCache) put(path string, ent *entry) {
	fc.mu.Lock()
	fc.m[path] = ent
	fc.mu.Unlock()
}

func (fc *fileCache) forget(path string) {
	fc.mu.Lock()
	delete(fc.m, path)
	fc.mu.Unlock()
}

func (fc *fileCache) forRead(ctx context.Context, path string, off, n int64) (*client.File, error) {
	if ent := fc.get(path); ent != nil && ent.covers(off, n) {
		return ent.f, nil
	}
	f, err := fc.c.Open(ctx, path)
	if err != nil {
		fc.forget(path)
		return nil, err
	}
	fc.put(path, newEntry(f))
	if size := f.Size(); off+n > size {
		return nil, errs.New(errs.ErrOutOfRange, "read past the end: the file is %d bytes", size)
	}
	return f, nil
}

func (fc *fileCache) forWrite(ctx context.Context, path string, o Options) (*entry, error) {
	if ent := fc.get(path); ent != nil {
		return ent, nil
	}
	f, err := fc.c.Open(ctx, path)
	if errors.Is(err, errs.ErrNotFound) {
		pool := o.Pool
		if pool == "" {
			pool = "perf"
		}
		f, err = fc.c.Create(ctx, path, client.CreateOptions{Pool: pool, ChunkSize: o.ChunkSize})
		if errors.Is(err, errs.ErrExists) { // another writer created it first
			f, err = fc.c.Open(ctx, path)
		}
	}
	if err != nil {
		return nil, err
	}
	if f.Info().Sealed {
		return nil, errs.New(errs.ErrSealed, "the file is sealed (immutable): write a new file")
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if ent := fc.m[path]; ent != nil { // a concurrent caller won
		return ent, nil
	}
	ent := newEntry(f)
	fc.m[path] = ent
	return ent, nil
}
