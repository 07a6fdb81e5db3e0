package mount

import (
	"context"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/weights"
)

// fileNode is one version of a gd2fs file (one inode). Its reader, its
// cache fill and its local copy are shared by every handle of every
// process that opens it.
type fileNode struct {
	fs.Inode
	m *FS

	mu         sync.Mutex
	info       client.FileInfo
	rd         *reader       // from the servers, while some handle is open
	fill       *weights.Fill // copying into the hot tier
	fillFailed bool          // do not try again for this inode
	blobPath   string        // the complete local copy, once known
	blob       *os.File      // blobPath, open while handles are
	// Open read handles, by kernel I/O mode: the kernel refuses a
	// passthrough open while cached opens of the inode exist and the other
	// way round, so a passthrough backing file is offered only when no
	// plain handle is open.
	opens, plain, pt int
	w                *writeHandle // this mount is writing the file
	unlinked         string       // unlinked while open: removed on the cluster at the last close
}

var (
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
)

// refresh takes newer metadata of an unsealed file (another writer's
// progress); a sealed file never changes.
func (n *fileNode) refresh(fi client.FileInfo) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.info.Sealed && n.w == nil {
		n.info = fi
	}
}

func (n *fileNode) timeout() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.info.Sealed && n.w == nil {
		return n.m.opts.AttrTimeout
	}
	return n.m.opts.DirTimeout
}

func (n *fileNode) attr(a *fuse.Attr) {
	n.mu.Lock()
	fi, w := n.info, n.w
	n.mu.Unlock()
	size := fi.Size
	if w != nil {
		size = w.written.Load()
	}
	a.Mode = syscall.S_IFREG | 0o644
	if fi.Sealed {
		a.Mode = syscall.S_IFREG | 0o444
	}
	a.Nlink = 1
	a.Size = uint64(size)
	a.Blocks = uint64(size+511) / 512
	a.Blksize = 1 << 20 // cp and stdio size their buffers by it
	setTimes(a, fi.Modified)
}

func (n *fileNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	stale := !n.info.Sealed && n.w == nil
	p := n.info.Path
	n.mu.Unlock()
	if stale { // someone else is writing it: show their progress
		if fi, err := n.m.cl.Stat(ctx, p); err == nil {
			n.refresh(fi)
		}
	}
	n.attr(&out.Attr)
	out.SetTimeout(n.timeout())
	return 0
}

// Setattr accepts what leaves the bytes as they are (chmod, chown, utimes,
// a truncate to the current size) and refuses the rest.
func (n *fileNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		n.mu.Lock()
		cur, w, sealed := n.info.Size, n.w, n.info.Sealed
		n.mu.Unlock()
		if w != nil {
			cur = w.written.Load()
		}
		if int64(size) != cur {
			if sealed || w == nil {
				return syscall.EPERM
			}
			return syscall.EOPNOTSUPP
		}
	}
	n.attr(&out.Attr)
	out.SetTimeout(n.timeout())
	return 0
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0 {
		return nil, 0, syscall.EPERM // sealed files are immutable; new files are written only by their creator
	}
	n.mu.Lock()
	fi := n.info
	n.mu.Unlock()
	if fi.Sealed {
		n.hot(fi)
	}
	n.mu.Lock()
	local := n.blob != nil
	n.mu.Unlock()
	if !local {
		// Asked now, so a master that is down fails the open (EIO after
		// the client's retry window), not a read later.
		if err := n.reader(ctx); err != nil {
			return nil, 0, errno(err)
		}
	}
	h := &readHandle{n: n}
	st := &n.m.stats
	n.mu.Lock()
	n.opens++
	if n.pt > 0 { // go-fuse hands this open the inode's backing file too
		h.pt = true
		n.pt++
		st.ptOpens.Add(1)
	} else {
		n.plain++
		st.plainOpens.Add(1) // PassthroughFd may still turn it into a passthrough open
	}
	n.mu.Unlock()
	var fl uint32
	if fi.Sealed {
		fl = fuse.FOPEN_KEEP_CACHE
	}
	return h, fl, 0
}

// hot makes sure the local copy is open when the cache has it, or that a
// fill is under way.
func (n *fileNode) hot(fi client.FileInfo) {
	c := n.m.opts.Cache
	if c == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.blob != nil {
		return
	}
	p := n.blobPath
	if p == "" {
		p, _ = c.BlobPath(fi)
	}
	if p != "" {
		if f, err := os.Open(p); err == nil {
			n.blob, n.blobPath = f, p
			c.Used(fi)
			return
		}
		n.blobPath = "" // evicted
	}
	if n.fill != nil || n.fillFailed {
		return
	}
	fill := c.StartFill(n.m.ctx, n.m.cl, fi)
	n.fill = fill
	go n.filled(fill)
}

// filled takes the fill's result: the local copy from now on, or reads
// from the servers for this inode's lifetime.
func (n *fileNode) filled(f *weights.Fill) {
	<-f.Done()
	blob, err := f.Result()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fill = nil
	if err != nil {
		n.fillFailed = true
		if n.m.ctx.Err() == nil {
			n.m.opts.Log.Warn("not cached locally; reading from the servers", "file", f.Info.Path, "err", err)
		}
		return
	}
	n.blobPath = blob
	if n.opens > 0 && n.blob == nil {
		if b, err := os.Open(blob); err == nil {
			n.blob = b
		}
	}
	n.m.opts.Log.Debug("cached locally", "file", f.Info.Path, "blob", blob)
}

// reader opens the shared reader from the servers if there is none.
func (n *fileNode) reader(ctx context.Context) error {
	n.mu.Lock()
	if n.rd != nil {
		n.mu.Unlock()
		return nil
	}
	p, id := n.info.Path, n.info.ID
	n.mu.Unlock()
	f, err := n.m.cl.Open(ctx, p)
	if err != nil {
		return err
	}
	if got := f.Info().ID; id != 0 && got != id {
		// Another file has the name now (replaced, or renamed over, by
		// another client while the kernel still knew this inode): its
		// bytes must not fill this inode's page cache. ESTALE makes the
		// kernel look the name up again, and open the new file's inode.
		f.Close()
		return errStale
	}
	n.mu.Lock()
	if n.rd == nil {
		n.rd = newReader(n.m, f)
	}
	n.mu.Unlock()
	return nil
}

func (n *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if r, ok := fh.(fs.FileReader); ok {
		return r.Read(ctx, dest, off)
	}
	return nil, syscall.EBADF
}

// read returns the bytes at off (len(dest) at most): in dest, or as a
// reply pointing into the shared reader's blocks.
func (n *fileNode) read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, error) {
	n.mu.Lock()
	size, blob, fill := n.info.Size, n.blob, n.fill
	n.mu.Unlock()
	if off >= size {
		return fuse.ReadResultData(nil), nil
	}
	if int64(len(dest)) > size-off {
		dest = dest[:size-off]
	}
	end := off + int64(len(dest))
	if blob != nil {
		k, err := blob.ReadAt(dest, off)
		if err == io.EOF && k == len(dest) {
			err = nil
		}
		return fuse.ReadResultData(dest[:k]), err
	}
	if fill != nil {
		done := fill.Filled()
		// Just past the filled prefix, waiting for the fill costs less than
		// reading the bytes twice; far past it, the servers answer.
		if off < done+n.m.opts.ReadAhead && fill.WaitFor(ctx, end) == nil {
			if k, err := fill.ReadAt(dest, off); err == nil || (err == io.EOF && k == len(dest)) {
				return fuse.ReadResultData(dest[:k]), nil
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	if err := n.reader(ctx); err != nil {
		return nil, err
	}
	n.mu.Lock()
	rd := n.rd
	n.mu.Unlock()
	return rd.read(ctx, off, len(dest))
}

// readHandle is an open of a file for reading.
type readHandle struct {
	n  *fileNode
	pt bool // the kernel reads the backing file: this process sees no reads
}

var (
	_ fs.FileReader          = (*readHandle)(nil)
	_ fs.FileReleaser        = (*readHandle)(nil)
	_ fs.FilePassthroughFder = (*readHandle)(nil)
)

// PassthroughFd offers the local copy as the kernel's backing file: go-fuse
// asks when the inode has no backing file registered.
func (h *readHandle) PassthroughFd() (int, bool) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.m.passthrough || n.blob == nil {
		return 0, false
	}
	if !h.pt {
		if n.plain != 1 { // plain handles besides this one are open
			n.m.stats.ptRefused.Add(1)
			n.m.opts.Log.Debug("hot file opened on the plain path: plain handles of it are open (the kernel allows one I/O mode per inode)", "file", n.info.Path, "plain", n.plain-1)
			return 0, false
		}
		n.plain--
		n.pt++
		h.pt = true
		n.m.stats.plainOpens.Add(-1)
		n.m.stats.ptOpens.Add(1)
	}
	return int(n.blob.Fd()), true
}

func (h *readHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	st := &h.n.m.stats
	st.reads.Add(1)
	st.readBytes.Add(int64(len(dest)))
	storeMax(&st.largestRead, int64(len(dest)))
	res, err := h.n.read(ctx, dest, off)
	if err != nil {
		return nil, errno(err)
	}
	return res, 0
}

func (h *readHandle) Release(ctx context.Context) syscall.Errno {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	n.opens--
	if h.pt {
		n.pt--
	} else {
		n.plain--
	}
	if n.opens == 0 && n.unlinked != "" {
		p := n.unlinked
		n.unlinked = ""
		go n.m.removeUnlinked(p, n)
	}
	if n.opens == 0 {
		// Nothing open: free the blocks, and let the cache evict the local
		// copy (an open file is never evicted). The page cache stays.
		if n.blob != nil {
			n.blob.Close()
			n.blob = nil
		}
		if n.rd != nil {
			n.rd.close()
			n.rd = nil
		}
	}
	return 0
}

// storeMax raises a to v if v is larger.
func storeMax(a *atomic.Int64, v int64) {
	for {
		l := a.Load()
		if v <= l || a.CompareAndSwap(l, v) {
			return
		}
	}
}

// writing reports whether this mount is writing the file (a rename may
// not move it: its writer commits by path).
func (n *fileNode) writing() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.w != nil
}

// unlinkLater hides p and leaves its removal to the last close, if the
// file is open for reading here.
func (n *fileNode) unlinkLater(p string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.opens == 0 || n.w != nil {
		return false
	}
	n.unlinked = p
	n.m.hide.Lock()
	n.m.hiddenPaths[p] = n
	n.m.hide.Unlock()
	return true
}

// hidden reports whether p was unlinked here while open (still on the
// cluster until its last close).
func (m *FS) hidden(p string) bool {
	m.hide.Lock()
	defer m.hide.Unlock()
	_, ok := m.hiddenPaths[p]
	return ok
}

// removeUnlinked removes p on the cluster, unless its name was taken by a
// new file meanwhile (removeHidden removed it then).
func (m *FS) removeUnlinked(p string, n *fileNode) {
	m.hide.Lock()
	if m.hiddenPaths[p] != n {
		m.hide.Unlock()
		return
	}
	delete(m.hiddenPaths, p)
	m.hide.Unlock()
	if err := m.cl.Remove(m.ctx, p); err != nil && m.ctx.Err() == nil {
		m.opts.Log.Warn("an unlinked file was closed; removing it on the cluster failed (remove it again)", "file", p, "err", err)
	}
}

// removeHidden removes p on the cluster now if it was unlinked here while
// open, so a new file can take the name.
func (m *FS) removeHidden(ctx context.Context, p string) error {
	m.hide.Lock()
	n, ok := m.hiddenPaths[p]
	delete(m.hiddenPaths, p)
	m.hide.Unlock()
	if !ok {
		return nil
	}
	n.mu.Lock()
	n.unlinked = ""
	n.mu.Unlock()
	return m.cl.Remove(ctx, p)
}
