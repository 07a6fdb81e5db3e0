package mount

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/gd2fs/gd2fs/client"
)

// writeHandle writes a file created through the mount: sequentially, in
// buffers of writeBuf bytes sent while the next one fills (client.File
// spreads each over servers in parallel pieces). The first flush (close)
// commits and seals the file; its error is close's error.
type writeHandle struct {
	n       *fileNode
	f       *client.File
	written atomic.Int64 // bytes accepted: the size stat shows

	mu       sync.Mutex
	buf      []byte
	base     int64      // file offset of buf[0]
	pending  chan error // the buffer being sent, if any
	inflight []byte
	err      error // sticky: the first failure
	closed   bool
}

const writeBuf = 16 << 20

func newWriteHandle(n *fileNode, f *client.File) *writeHandle {
	return &writeHandle{n: n, f: f, buf: make([]byte, 0, writeBuf)}
}

func (w *writeHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.closed:
		return 0, syscall.EPERM // sealed at the first close
	case w.err != nil:
		return 0, errno(w.err)
	case off != w.base+int64(len(w.buf)):
		return 0, syscall.EOPNOTSUPP // only sequential writes
	}
	for len(data) > 0 {
		k := copy(w.buf[len(w.buf):cap(w.buf)], data)
		w.buf = w.buf[:len(w.buf)+k]
		data = data[k:]
		w.written.Add(int64(k))
		if len(w.buf) == cap(w.buf) {
			if err := w.send(); err != nil {
				return 0, errno(err)
			}
		}
	}
	return uint32(w.written.Load() - off), 0
}

// send waits for the buffer in flight and starts sending the full one.
// w.mu is held.
func (w *writeHandle) send() error {
	if err := w.wait(); err != nil {
		return err
	}
	b, off := w.buf, w.base
	w.base += int64(len(b))
	if w.inflight == nil {
		w.inflight = make([]byte, 0, writeBuf)
	}
	w.buf, w.inflight = w.inflight[:0], b
	ch := make(chan error, 1)
	w.pending = ch
	go func() {
		_, err := w.f.WriteAtContext(w.n.m.ctx, b, off)
		ch <- err
	}()
	return nil
}

// wait waits for the buffer in flight. w.mu is held.
func (w *writeHandle) wait() error {
	if w.pending != nil {
		if err := <-w.pending; err != nil && w.err == nil {
			w.err = err
		}
		w.pending = nil
	}
	return w.err
}

// drain sends everything accepted so far. w.mu is held.
func (w *writeHandle) drain(ctx context.Context) error {
	if err := w.wait(); err != nil {
		return err
	}
	if len(w.buf) > 0 {
		if _, err := w.f.WriteAtContext(ctx, w.buf, w.base); err != nil {
			w.err = err
			return err
		}
		w.base += int64(len(w.buf))
		w.buf = w.buf[:0]
	}
	return nil
}

// Flush is close(2): commit and seal. A dup'ed descriptor's close seals
// too; writes after it answer EPERM.
func (w *writeHandle) Flush(ctx context.Context) syscall.Errno {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0
	}
	if err := w.drain(ctx); err != nil {
		return errno(err)
	}
	if err := w.f.Close(); err != nil {
		w.err = err
		return errno(err)
	}
	w.closed = true
	n := w.n
	fi, err := n.m.cl.Stat(ctx, w.f.Name())
	if err != nil {
		fi = w.f.Info()
		fi.Size, fi.Sealed = w.written.Load(), true
	}
	n.mu.Lock()
	n.info, n.w = fi, nil
	n.mu.Unlock()
	return 0
}

// Fsync commits what was written so far (client.File.Sync): durable as
// the pool is, not sealed.
func (w *writeHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0
	}
	if err := w.drain(ctx); err != nil {
		return errno(err)
	}
	return errno(w.f.Sync(ctx))
}

func (w *writeHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return nil, syscall.EOPNOTSUPP // a file being written is not read back until sealed
}

func (w *writeHandle) Release(ctx context.Context) syscall.Errno {
	w.Flush(ctx) // a writer that never closed (killed): seal what it wrote
	return 0
}

var (
	_ fs.FileWriter   = (*writeHandle)(nil)
	_ fs.FileFlusher  = (*writeHandle)(nil)
	_ fs.FileFsyncer  = (*writeHandle)(nil)
	_ fs.FileReader   = (*writeHandle)(nil)
	_ fs.FileReleaser = (*writeHandle)(nil)
)
