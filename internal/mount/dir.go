package mount

import (
	"context"
	"path"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/client"
)

// dirNode is a gd2fs folder. Folders are not cached long: new files
// written elsewhere show up within Options.DirTimeout.
type dirNode struct {
	fs.Inode
	m *FS
	// p is the folder's path on the cluster; a rename of the folder, or
	// of one above it, changes it while other calls read it.
	p    atomic.Pointer[string]
	info client.FileInfo
}

func newDir(m *FS, p string, fi client.FileInfo) *dirNode {
	d := &dirNode{m: m, info: fi}
	d.p.Store(&p)
	return d
}

// path is the folder's path on the cluster now.
func (d *dirNode) path() string { return *d.p.Load() }

var (
	_ fs.NodeLookuper  = (*dirNode)(nil)
	_ fs.NodeReaddirer = (*dirNode)(nil)
	_ fs.NodeGetattrer = (*dirNode)(nil)
	_ fs.NodeCreater   = (*dirNode)(nil)
	_ fs.NodeMkdirer   = (*dirNode)(nil)
	_ fs.NodeUnlinker  = (*dirNode)(nil)
	_ fs.NodeRmdirer   = (*dirNode)(nil)
	_ fs.NodeRenamer   = (*dirNode)(nil)
	_ fs.NodeLinker    = (*dirNode)(nil)
	_ fs.NodeSymlinker = (*dirNode)(nil)
	_ fs.NodeMknoder   = (*dirNode)(nil)
	_ fs.NodeSetattrer = (*dirNode)(nil)
	_ fs.NodeStatfser  = (*dirNode)(nil)
)

func (d *dirNode) child(name string) string { return path.Join(d.path(), name) }

func (d *dirNode) attr(a *fuse.Attr) {
	a.Mode = syscall.S_IFDIR | 0o755
	a.Nlink = 2
	setTimes(a, d.info.Modified)
}

func setTimes(a *fuse.Attr, t time.Time) {
	if t.IsZero() {
		return
	}
	a.SetTimes(&t, &t, &t)
}

func (d *dirNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.attr(&out.Attr)
	out.SetTimeout(d.m.opts.DirTimeout)
	return 0
}

func (d *dirNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	return d.Getattr(ctx, f, out) // chmod, chown, utimes: accepted, not stored
}

func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if d.m.hidden(d.child(name)) {
		return nil, syscall.ENOENT
	}
	fi, err := d.m.cl.Stat(ctx, d.child(name))
	if err != nil {
		return nil, errno(err)
	}
	return d.m.inode(ctx, &d.Inode, fi, out), 0
}

// inode returns the inode for fi under parent (an existing one when the
// same content is already known: its reader and page cache are shared).
func (m *FS) inode(ctx context.Context, parent *fs.Inode, fi client.FileInfo, out *fuse.EntryOut) *fs.Inode {
	if fi.IsDir {
		ch := parent.NewInode(ctx, newDir(m, fi.Path, fi), fs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino(fi.Path, client.FileInfo{IsDir: true})})
		ch.Operations().(*dirNode).attr(&out.Attr)
		out.SetEntryTimeout(m.opts.DirTimeout)
		out.SetAttrTimeout(m.opts.DirTimeout)
		return ch
	}
	ch := parent.NewInode(ctx, &fileNode{m: m, info: fi}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino(fi.Path, fi)})
	n := ch.Operations().(*fileNode)
	n.refresh(fi)
	n.attr(&out.Attr)
	t := n.timeout()
	out.SetEntryTimeout(t)
	out.SetAttrTimeout(t)
	return ch
}

func (d *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	es, err := d.m.cl.List(ctx, d.path())
	if err != nil {
		return nil, errno(err)
	}
	out := make([]fuse.DirEntry, 0, len(es))
	for _, e := range es {
		if d.m.hidden(e.Path) {
			continue
		}
		mode := uint32(syscall.S_IFREG)
		if e.IsDir {
			mode = syscall.S_IFDIR
			e = client.FileInfo{Path: e.Path, IsDir: true}
		}
		out = append(out, fuse.DirEntry{Name: path.Base(e.Path), Mode: mode, Ino: ino(e.Path, e)})
	}
	return fs.NewListDirStream(out), 0
}

// uninterrupted is the context of a change to the namespace (mkdir,
// unlink, rmdir, rename, create): it ends with the mount, not when the
// kernel interrupts the request. The kernel interrupts a request whenever
// the calling thread takes any signal (a Go program's threads take SIGURG
// for preemption many times a second), and by then the master may have
// made the change: answering EINTR would make the program's retry (os.Rename
// retries EINTR) see ENOENT or EEXIST for a change that happened. A local
// file system does not interrupt these either; the client's own timeouts
// still bound a dead master.
func (m *FS) uninterrupted() context.Context { return m.ctx }

func (d *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx = d.m.uninterrupted()
	p := d.child(name)
	if _, err := d.m.cl.Stat(ctx, p); err == nil {
		return nil, syscall.EEXIST
	}
	if err := d.m.cl.Mkdir(ctx, p); err != nil {
		return nil, errno(err)
	}
	fi, err := d.m.cl.Stat(ctx, p)
	if err != nil {
		return nil, errno(err)
	}
	return d.m.inode(ctx, &d.Inode, fi, out), 0
}

// Unlink removes the file on the cluster, or, while processes here have
// it open for reading, hides the name and removes the file when the last
// of them closes it: POSIX readers of an unlinked file keep reading, and
// the servers free a removed file's chunks at their next heartbeat.
func (d *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	ctx = d.m.uninterrupted()
	p := d.child(name)
	if ch := d.GetChild(name); ch != nil {
		if n, ok := ch.Operations().(*fileNode); ok && n.unlinkLater(p) {
			return 0
		}
	}
	return errno(d.m.cl.Remove(ctx, p))
}

func (d *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	ctx = d.m.uninterrupted()
	return errno(d.m.cl.Remove(ctx, d.child(name)))
}

// Rename renames on the cluster, in one step on the master (a sealed
// file keeps its chunks: nothing is copied), with POSIX's answers: a file
// replaces a file (RENAME_NOREPLACE: EEXIST), a folder moves with all
// under it onto a free name or an empty folder (ENOTEMPTY otherwise). Not
// here: a file this mount is still writing (EBUSY: rename it after
// close, which seals it), a file another client is writing or a KV
// session holds (EBUSY, the master's "busy"), RENAME_EXCHANGE and
// RENAME_WHITEOUT (EINVAL). A replaced file that processes here still
// read goes as a removed one does: its chunks are freed at the servers'
// next heartbeat, and reads past the page cache then fail (never another
// file's bytes: chunk ids are never reused). Refusing it (EBUSY) is no
// better: the kernel sends the last close's release after close(2)
// returns, so a program that closes a file and renames over it would get
// EBUSY at random.
func (d *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	ctx = d.m.uninterrupted()
	if flags&^uint32(unix.RENAME_NOREPLACE) != 0 {
		return syscall.EINVAL
	}
	np, ok := newParent.(*dirNode)
	if !ok {
		return syscall.EXDEV
	}
	from, to := d.child(name), np.child(newName)
	if d.m.hidden(from) {
		return syscall.ENOENT
	}
	src := d.GetChild(name)
	if src != nil {
		if n, ok := src.Operations().(*fileNode); ok && n.writing() {
			return syscall.EBUSY
		}
	}
	if err := d.m.removeHidden(ctx, to); err != nil { // an unlinked name here is free: its readers here lose the old file, as on create
		return errno(err)
	}
	if _, err := d.m.cl.Rename(ctx, from, to, client.RenameOptions{NoReplace: flags&unix.RENAME_NOREPLACE != 0}); err != nil {
		return errno(err)
	}
	if src != nil {
		renamed(src, to) // go-fuse moves the inode under its new name when this returns
	}
	return 0
}

// renamed gives the inode ch, and every inode known below it, their paths
// under its new path p.
func renamed(ch *fs.Inode, p string) {
	switch n := ch.Operations().(type) {
	case *fileNode:
		n.mu.Lock()
		n.info.Path = p
		n.mu.Unlock()
	case *dirNode:
		n.p.Store(&p)
		for name, c := range ch.Children() {
			renamed(c, path.Join(p, name))
		}
	}
}

func (d *dirNode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *dirNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *dirNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Create makes a new file, open for sequential writing (write.go).
func (d *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ctx = d.m.uninterrupted()
	p := d.child(name)
	if err := d.m.removeHidden(ctx, p); err != nil { // the name is free now: its readers here lose the old file
		return nil, nil, 0, errno(err)
	}
	f, err := d.m.cl.Create(ctx, p, client.CreateOptions{Pool: d.m.opts.Pool, ChunkSize: d.m.opts.ChunkSize})
	if err != nil {
		return nil, nil, 0, errno(err)
	}
	fi := f.Info()
	n := &fileNode{m: d.m, info: fi}
	w := newWriteHandle(n, f)
	n.w = w
	ch := d.NewInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino(p, fi)})
	if got := ch.Operations().(*fileNode); got != n { // an inode number collision: never share state
		f.Close()
		return nil, nil, 0, syscall.EIO
	}
	n.attr(&out.Attr)
	out.SetEntryTimeout(d.m.opts.DirTimeout)
	out.SetAttrTimeout(0)
	// Direct I/O: writes arrive in order, uncached, and a shared writable
	// mmap (which would write back pages at any offset) is refused at once.
	return ch, w, fuse.FOPEN_DIRECT_IO, 0
}

// Statfs reports the cluster's capacity (disk tiers, or DRAM where servers
// have none), so df and free-space checks see the cluster, not zeros.
func (d *dirNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // df must not wait out a master failover
	defer cancel()
	st, err := d.m.cl.Status(ctx)
	if err != nil {
		return errno(err)
	}
	var capacity, used int64
	for _, s := range st.Servers {
		if s.State != "up" {
			continue
		}
		if s.DiskCap > 0 {
			capacity, used = capacity+s.DiskCap, used+s.DiskUsed
		} else {
			capacity, used = capacity+s.MemCap, used+s.MemUsed
		}
	}
	const bs = 1 << 20
	free := max(capacity-used, 0)
	*out = fuse.StatfsOut{Blocks: uint64(capacity / bs), Bfree: uint64(free / bs), Bavail: uint64(free / bs),
		Files: uint64(st.Files), Bsize: bs, Frsize: bs, NameLen: 255}
	return 0
}
