package mount

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
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
// too; writes after it answer EPERM. A writer killed by a signal closes
// its descriptors too (the kernel flushes them as the process exits): its
// bytes are committed, and the file is left unsealed, never passed off as
// complete.
func (w *writeHandle) Flush(ctx context.Context) syscall.Errno {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0
	}
	if sig := killedBy(ctx); sig != 0 {
		// The mount's context: a dying caller's requests are interrupted.
		w.closed = true
		err := w.drain(w.n.m.ctx)
		if err == nil {
			err = w.f.Sync(w.n.m.ctx)
		}
		w.n.m.opts.Log.Warn("the writer was killed: its file is left unsealed (remove it and write it again)",
			"file", w.f.Name(), "bytes", w.written.Load(), "signal", sig, "err", err)
		n := w.n
		fi, serr := n.m.cl.Stat(n.m.ctx, w.f.Name())
		if serr != nil {
			fi = w.f.Info()
			fi.Size = w.written.Load()
		}
		n.mu.Lock()
		n.info, n.w = fi, nil
		n.mu.Unlock()
		return errno(err)
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

// killedBy returns the signal that is killing the process behind ctx (a
// close's caller), or 0 when it is alive or exiting normally. Linux sets
// an exiting task's exit code (field 52 of /proc/PID/stat, since 3.5)
// before it closes the task's files, and the close waits for this reply,
// so the file is still there to read. Without /proc (or the caller), 0:
// the file is sealed, as before.
func killedBy(ctx context.Context) syscall.Signal {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces and parentheses: count
	// from the last ')'. fields[0] is then field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 50 {
		return 0
	}
	code, err := strconv.Atoi(fields[49])
	if err != nil {
		return 0
	}
	return syscall.Signal(code & 0x7f) // exit(n) is n<<8; a signal's death its number
}
