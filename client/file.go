package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
)

// File is an open gd2fs file. ReadAt and WriteAt may be called concurrently;
// Write (append) keeps a position and is for one writer.
type File struct {
	c *Client

	mu      sync.Mutex
	info    api.File
	chunks  map[int64]api.Chunk
	lengths map[int64]int64 // chunk lengths written through this handle, not yet committed
	size    int64
	dirty   bool
	created bool
	closed  bool
}

func newFile(c *Client, f api.File) *File {
	x := &File{c: c, info: f, size: f.Size, lengths: map[int64]int64{}}
	x.setChunks(f.Chunks)
	return x
}

func (f *File) setChunks(cs []api.Chunk) {
	f.chunks = make(map[int64]api.Chunk, len(cs))
	for _, c := range cs {
		f.chunks[c.Index] = c
	}
}

// Name is the file's path.
func (f *File) Name() string { return f.info.Path }

// Size is the file size as this handle sees it (its own writes included).
func (f *File) Size() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.size
}

// Info is the file's metadata as of open (or the last Sync).
func (f *File) Info() FileInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return infoOf(f.info)
}

// piece is one data-plane request: bytes [off, off+len(buf)) of chunk idx.
type piece struct {
	idx int64
	off int64 // within the chunk
	buf []byte
}

func (f *File) split(p []byte, off int64) []piece {
	cs, ps := f.info.ChunkSize, int64(f.c.cfg.PieceSize)
	var out []piece
	for len(p) > 0 {
		idx, in := off/cs, off%cs
		n := min(int64(len(p)), cs-in, ps-in%ps)
		out = append(out, piece{idx, in, p[:n]})
		p = p[n:]
		off += n
	}
	return interleave(out)
}

// interleave orders pieces round-robin over chunks (first piece of every
// chunk, then the second, ...). Requests in flight then land on different
// chunks, hence on different servers, and a server rarely sees two pieces of
// one chunk at once (they would serialise on the chunk's lock) or a piece
// ahead of its predecessor (which would zero-fill the gap first).
func interleave(ps []piece) []piece {
	if len(ps) < 2 || ps[0].idx == ps[len(ps)-1].idx {
		return ps
	}
	var groups [][]piece
	for i, p := range ps {
		if i == 0 || p.idx != ps[i-1].idx {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], p)
	}
	out := make([]piece, 0, len(ps))
	for k := 0; len(out) < len(ps); k++ {
		for _, g := range groups {
			if k < len(g) {
				out = append(out, g[k])
			}
		}
	}
	return out
}

// run calls fn for every piece with at most Parallel in flight and returns
// the first error.
func (f *File) run(ctx context.Context, ps []piece, fn func(ctx context.Context, i int, p piece) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, f.c.cfg.Parallel)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for i, p := range ps {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, i, p); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

// WriteAt writes p at off, in parallel pieces. For an HA file it returns only
// when every replica holds the bytes with a matching checksum.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	return f.WriteAtContext(context.Background(), p, off)
}

// WriteAtContext is WriteAt with a context.
func (f *File) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errs.New(errs.ErrOutOfRange, "negative offset %d", off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	f.mu.Lock()
	if f.closed || f.info.Sealed {
		f.mu.Unlock()
		return 0, errs.New(errs.ErrSealed, "%s is closed or sealed: files are immutable once closed", f.info.Path)
	}
	ps := f.split(p, off)
	var missing []int64
	seen := map[int64]bool{}
	for _, x := range ps {
		if _, ok := f.chunks[x.idx]; !ok && !seen[x.idx] {
			missing = append(missing, x.idx)
			seen[x.idx] = true
		}
	}
	f.mu.Unlock()
	if len(missing) > 0 {
		var got api.Chunks
		if err := f.c.call(ctx, "POST", "/v1/alloc", f.info.Path, api.AllocRequest{Indexes: missing}, &got); err != nil {
			return 0, err
		}
		f.mu.Lock()
		for _, c := range got.Chunks {
			f.chunks[c.Index] = c
		}
		f.mu.Unlock()
	}
	f.mu.Lock()
	chunks := make([]api.Chunk, len(ps))
	for i, x := range ps {
		chunks[i] = f.chunks[x.idx]
	}
	f.mu.Unlock()
	err := f.run(ctx, ps, func(ctx context.Context, i int, x piece) error {
		c := chunks[i]
		if len(c.Replicas) == 0 {
			return errs.New(errs.ErrInternal, "chunk %d of %s has no replicas", x.idx, f.info.Path)
		}
		fwd := make([]string, 0, len(c.Replicas)-1)
		for _, r := range c.Replicas[1:] {
			fwd = append(fwd, r.Addr)
		}
		// An HA write succeeds only when every replica holds the bytes; a
		// replica that hangs fails it (retryable) within the deadline, and
		// the primary's own forward deadline is shorter, so its answer names
		// the replica (docs/api.md, "Failover and timeouts").
		d := f.c.reqTimeout(int64(len(x.buf)))
		rctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		addr := c.Replicas[0].Addr
		err := f.c.tr.WriteChunk(rctx, addr, c.ID, x.off, x.buf, fwd)
		f.c.hl.note(addr, rctx, err)
		if err != nil {
			return fmt.Errorf("write %s chunk %d at %d via %s: %w", f.info.Path, x.idx, x.off, addr, timeoutErr(rctx, err, addr, d))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	for _, x := range ps {
		f.lengths[x.idx] = max(f.lengths[x.idx], x.off+int64(len(x.buf)))
	}
	f.size = max(f.size, off+int64(len(p)))
	f.dirty = true
	f.mu.Unlock()
	return len(p), nil
}

// Write appends p at the end of the file (io.Writer).
func (f *File) Write(p []byte) (int, error) {
	return f.WriteAt(p, f.Size())
}

// Append is Write with a context.
func (f *File) Append(ctx context.Context, p []byte) (int, error) {
	return f.WriteAtContext(ctx, p, f.Size())
}

// Sync records the size and chunk lengths at the master, making the writes
// visible to other clients.
func (f *File) Sync(ctx context.Context) error { return f.commit(ctx, false) }

// Close syncs and seals a file this handle created or wrote: it becomes
// immutable, on the master and on every server holding its chunks. Closing a
// handle that only read changes nothing.
func (f *File) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	seal := (f.created || f.dirty) && !f.info.Sealed
	f.closed = !seal
	f.mu.Unlock()
	if !seal {
		return nil
	}
	return f.commit(context.Background(), true)
}

// Seal commits and seals the file whatever this handle did to it (Close
// seals only a file the handle created or wrote since its last Sync): a
// writer that synced as it went (a resumed pull) ends with Seal.
func (f *File) Seal(ctx context.Context) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return errs.New(errs.ErrSealed, "%s: the handle is closed", f.info.Path)
	}
	f.mu.Unlock()
	return f.commit(ctx, true)
}

func (f *File) commit(ctx context.Context, seal bool) error {
	f.mu.Lock()
	req := api.CommitRequest{Size: f.size, Lengths: make(map[int64]int64, len(f.lengths)), Seal: seal}
	for k, v := range f.lengths {
		req.Lengths[k] = v
	}
	f.mu.Unlock()
	var out api.File
	if err := f.c.call(ctx, "POST", "/v1/commit", f.info.Path, req, &out); err != nil {
		return err
	}
	f.mu.Lock()
	for idx, l := range req.Lengths {
		if c, ok := f.chunks[idx]; ok && c.Length < l {
			c.Length = l
			f.chunks[idx] = c
		}
	}
	f.info.Size, f.info.Sealed, f.info.Modified = out.Size, out.Sealed, out.Modified
	f.dirty = false
	chunks := make([]api.Chunk, 0, len(f.chunks))
	for _, c := range f.chunks {
		chunks = append(chunks, c)
	}
	if seal {
		f.closed = true
	}
	f.mu.Unlock()
	if !seal {
		return nil
	}
	// Seal on the servers too, so no client can change the bytes later.
	// A replica that is down now keeps an unsealed copy; reads verify
	// checksums either way. So does one that just missed a deadline: a
	// stopped server would cost every Close a timeout.
	var wg sync.WaitGroup
	for _, c := range chunks {
		for _, r := range c.Replicas {
			if f.c.hl.isSuspect(r.Addr) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, f.c.reqTimeout(0))
				defer cancel()
				f.c.hl.note(r.Addr, sctx, f.c.tr.SealChunk(sctx, r.Addr, c.ID))
			}()
		}
	}
	wg.Wait()
	return nil
}

// ReadAt reads len(p) bytes at off straight into p (io.ReaderAt). Pieces run
// in parallel across servers; a failed replica is retried on the next one.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	return f.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt with a context.
func (f *File) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errs.New(errs.ErrOutOfRange, "negative offset %d", off)
	}
	size := f.Size()
	if off >= size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := len(p)
	var eof error
	if int64(n) > size-off {
		n, eof = int(size-off), io.EOF
	}
	f.mu.Lock()
	ps := f.split(p[:n], off)
	f.mu.Unlock()
	err := f.run(ctx, ps, func(ctx context.Context, i int, x piece) error { return f.readPiece(ctx, i, x) })
	if err != nil {
		return 0, err
	}
	return n, eof
}

// readPiece fills x.buf from one replica of its chunk, zero-filling what lies
// beyond the chunk's written length (a sparse region).
func (f *File) readPiece(ctx context.Context, i int, x piece) error {
	for attempt := 0; ; attempt++ {
		f.mu.Lock()
		c, ok := f.chunks[x.idx]
		length := max(c.Length, f.lengths[x.idx])
		f.mu.Unlock()
		if !ok {
			clear(x.buf)
			return nil
		}
		n := min(int64(len(x.buf)), max(0, length-x.off))
		clear(x.buf[n:])
		if n == 0 {
			return nil
		}
		err := f.readReplicas(ctx, c, i, x.off, x.buf[:n])
		if err == nil || ctx.Err() != nil {
			return err
		}
		if f.linked() && errors.Is(err, errs.ErrUnavailable) && !noS3(err) {
			return f.readRefilled(ctx, c, i, x.off, x.buf[:n], err) // refill.go
		}
		if attempt > 0 {
			return err
		}
		// Every replica failed: the cached map may be stale (a repair moved
		// a replica). Refresh once from the master and retry.
		if rerr := f.refresh(ctx); rerr != nil {
			return err
		}
	}
}

func (f *File) readReplicas(ctx context.Context, c api.Chunk, spread int, off int64, dst []byte) error {
	// Up replicas first, rotated by piece number so a big read spreads over
	// every replica; replicas the master thinks down come last.
	order := make([]api.Replica, 0, len(c.Replicas))
	k := len(c.Replicas)
	for j := range k {
		order = append(order, c.Replicas[(spread+int(c.Index)+j)%k])
	}
	// failover: up and answering, then suspects (a recent timeout), then down.
	rank := func(r api.Replica) int {
		switch {
		case !r.Up:
			return 2
		case f.c.hl.isSuspect(r.Addr):
			return 1
		}
		return 0
	}
	sort.SliceStable(order, func(a, b int) bool { return rank(order[a]) < rank(order[b]) })
	var tried []string
	var last error
	for _, r := range order {
		if r.Addr == "" {
			continue
		}
		// failover: a deadline that grows with the bytes; a cold read may
		// first fill the whole chunk from S3, so its deadline counts that too.
		d := f.c.reqTimeout(int64(len(dst)))
		if f.info.Attrs["source"] != "" {
			d = f.c.reqTimeout(c.Length + int64(len(dst)))
		}
		rctx, cancel := context.WithTimeout(ctx, d)
		var err error
		if src := f.info.Attrs["source"]; src != "" {
			var filled bool
			ref := ColdRef{ID: c.ID, Offset: c.Index * f.info.ChunkSize, Length: c.Length, URI: src, ETag: f.info.Attrs["etag"]}
			if filled, err = f.c.tr.ReadChunkCold(rctx, r.Addr, ref, off, dst); err == nil && filled {
				f.c.coldFilled.Add(int64(len(dst)))
			}
		} else {
			err = f.c.tr.ReadChunk(rctx, r.Addr, c.ID, off, dst)
		}
		f.c.hl.note(r.Addr, rctx, err) // failover
		err = timeoutErr(rctx, err, r.Addr, d)
		cancel()
		if err == nil {
			f.c.fromServers.Add(int64(len(dst)))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errs.ErrOutOfRange) || errors.Is(err, errs.ErrBadRequest) {
			return err
		}
		tried = append(tried, r.Addr)
		last = err
	}
	if noS3(last) {
		// The cause, first: waiting for another server does not help
		// when servers are not given S3 (readRefilled stops on it).
		return errs.New(errs.ErrUnavailable, "%s: chunk %d is linked to %s, and the servers cannot fill it from S3: %w (tried %s)",
			f.info.Path, c.Index, f.info.Attrs["source"], last, strings.Join(tried, ", "))
	}
	pool := f.info.Pool
	hint := "start the server again, or wait for the master to re-replicate"
	if len(c.Replicas) == 1 {
		hint = "this " + pool + "-pool chunk has one copy; it is back when its server is"
	}
	return errs.New(errs.ErrUnavailable, "%s: chunk %d unavailable: no replica answered (tried %s; last error: %w); %s",
		f.info.Path, c.Index, strings.Join(tried, ", "), last, hint)
}

// same checks that nf, asked for by this handle's path, is still this
// handle's file: the name may have been renamed away or replaced since
// the open, and another file's chunk map would read its bytes as ours.
func (f *File) same(nf api.File) error {
	if f.info.ID != 0 && nf.ID != f.info.ID {
		return errs.New(errs.ErrNotFound, "%s was replaced or renamed since it was opened: open it again", f.info.Path)
	}
	return nil
}

func (f *File) refresh(ctx context.Context) error {
	var nf api.File
	if err := f.c.call(ctx, "GET", "/v1/files", f.info.Path, nil, &nf); err != nil {
		return err
	}
	if err := f.same(nf); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setChunks(nf.Chunks)
	f.info.Size = nf.Size
	f.size = max(f.size, nf.Size)
	return nil
}

// WriteTo streams the whole file to w (io.WriterTo), fetching the next window
// in parallel while the previous one is written out.
func (f *File) WriteTo(w io.Writer) (int64, error) {
	return f.copyTo(context.Background(), w, 0, nil)
}

// CopyTo is WriteTo with a context and a progress callback (bytes so far).
func (f *File) CopyTo(ctx context.Context, w io.Writer, progress func(int64)) (int64, error) {
	return f.copyTo(ctx, w, 0, progress)
}

// CopyToFrom is CopyTo of the bytes from off to the end (a resumed
// download); progress is told the position reached (off included).
func (f *File) CopyToFrom(ctx context.Context, w io.Writer, off int64, progress func(int64)) (int64, error) {
	if off < 0 {
		return 0, errs.New(errs.ErrOutOfRange, "negative offset %d", off)
	}
	return f.copyTo(ctx, w, off, progress)
}

func (f *File) copyTo(ctx context.Context, w io.Writer, from int64, progress func(int64)) (int64, error) {
	size := f.Size()
	if size <= from {
		return 0, nil
	}
	// A ring of windows fetched ahead in order: the requests in flight stay
	// at about Parallel pieces, and a slow piece holds back only its own
	// window, not the whole pipeline (as one big window with a barrier did).
	const ahead = 4
	win := max(int64(f.c.cfg.PieceSize), int64(f.c.cfg.PieceSize*f.c.cfg.Parallel)/ahead)
	type result struct {
		buf []byte
		n   int
		err error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ring := make([]chan result, 0, ahead)
	free := make(chan []byte, ahead)
	for i := 0; i < ahead; i++ {
		free <- make([]byte, min(win, size-from))
	}
	next := from
	launch := func() {
		buf := <-free
		off := next
		next += int64(len(buf))
		ch := make(chan result, 1)
		ring = append(ring, ch)
		go func() {
			n, err := f.ReadAtContext(ctx, buf, off)
			if err == io.EOF {
				err = nil
			}
			ch <- result{buf, n, err}
		}()
	}
	for len(ring) < ahead && next < size {
		launch()
	}
	var done int64
	for len(ring) > 0 {
		r := <-ring[0]
		ring = ring[1:]
		if r.err != nil {
			return done, r.err
		}
		if _, err := w.Write(r.buf[:r.n]); err != nil {
			return done, err
		}
		done += int64(r.n)
		if progress != nil {
			progress(from + done)
		}
		free <- r.buf
		if next < size {
			launch()
		}
	}
	return done, nil
}
