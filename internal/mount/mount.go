package mount

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/weights"
)

// Options configure a mount.
type Options struct {
	Client *client.Client
	// Root is the gd2fs folder shown at the mountpoint (default "/").
	Root string
	// Source names the mount in /proc/mounts (gd2fs://cluster/dir).
	Source string
	// Cache is the local hot tier (nil: none).
	Cache *weights.Cache
	// NoPassthrough keeps hot reads on the plain FUSE path.
	NoPassthrough bool
	// ReadOnly mounts read-only: every write answers EROFS.
	ReadOnly bool
	// AllowOther lets users other than the mounting one use the mount.
	AllowOther bool
	// Pool and ChunkSize are those of files created through the mount.
	Pool      string
	ChunkSize int64
	// AttrTimeout is how long the kernel keeps a sealed file's entry and
	// attributes (default 1m); DirTimeout that of folders and of files still
	// being written (default 1s).
	AttrTimeout, DirTimeout time.Duration
	// BlockSize is the unit read from servers (default 4 MiB); ReadAhead
	// how far ahead a sequential reader is fetched (default 64 MiB).
	BlockSize, ReadAhead int64
	// Memory bounds the bytes of blocks read ahead, all files together
	// (default 1 GiB); blocks a read waits for are fetched regardless.
	Memory int64
	Log    *slog.Logger
	Debug  bool // log every FUSE request
}

// FS is a mounted gd2fs folder.
type FS struct {
	opts   Options
	cl     *client.Client
	server *fuse.Server
	dir    string
	ctx    context.Context // ends at unmount: block fetches and cache fills
	cancel context.CancelFunc

	root        *dirNode
	passthrough bool
	why         string       // why passthrough is off
	mem         atomic.Int64 // bytes of reader blocks held or being fetched
	bufs        sync.Pool    // *[]byte of BlockSize: block buffers
	hide        sync.Mutex
	hiddenPaths map[string]*fileNode // unlinked while open (file.go)
	stats       struct {
		reads, readBytes, largestRead  atomic.Int64
		blocks, droppedUnread, waited  atomic.Int64
		fetchErrors, reasked           atomic.Int64
		ptOpens, plainOpens, ptRefused atomic.Int64
	}
}

// Stats count what the mount did since it was mounted.
type Stats struct {
	// Reads and ReadBytes are the read requests this process served (none
	// for passthrough files) and the bytes asked for in them; LargestRead
	// the largest request (the kernel's max_read and read-ahead decide).
	Reads, ReadBytes, LargestRead int64
	// Blocks is the number of blocks fetched from the servers;
	// DroppedUnread the bytes of blocks dropped before the kernel asked for
	// them (fetched again if it does); Waited the reads that found a
	// block still being fetched (read-ahead was not far enough ahead);
	// FetchErrors the block fetches that failed (fetched again when read);
	// Reasked the bytes of blocks fetched again because the kernel asked
	// again for pages it had been given (its page cache dropped them).
	Blocks, DroppedUnread, Waited, FetchErrors, Reasked int64
	// PassthroughOpens counts the opens for reading whose reads and mmap
	// the kernel serves from the local copy itself (FUSE passthrough);
	// PlainOpens the others (this process serves their reads: from the
	// local copy, a cache fill or the servers). PassthroughRefused counts
	// the opens of a file complete in the cache that stayed plain because
	// plain handles of the inode were open (one I/O mode per inode).
	// The three are final once open(2) has returned.
	PassthroughOpens, PlainOpens, PassthroughRefused int64
}

// Stats returns the mount's counters.
func (m *FS) Stats() Stats {
	return Stats{Reads: m.stats.reads.Load(), ReadBytes: m.stats.readBytes.Load(), LargestRead: m.stats.largestRead.Load(),
		Blocks: m.stats.blocks.Load(), DroppedUnread: m.stats.droppedUnread.Load(), Waited: m.stats.waited.Load(),
		FetchErrors: m.stats.fetchErrors.Load(), Reasked: m.stats.reasked.Load(),
		PassthroughOpens: m.stats.ptOpens.Load(), PlainOpens: m.stats.plainOpens.Load(), PassthroughRefused: m.stats.ptRefused.Load()}
}

// getBuf returns a block buffer of n bytes (n <= BlockSize), reused.
func (m *FS) getBuf(n int64) []byte {
	if p, ok := m.bufs.Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, m.opts.BlockSize)
}

// putBuf gives back a buffer from getBuf that nothing points into.
func (m *FS) putBuf(b []byte) {
	b = b[:cap(b)]
	m.bufs.Put(&b)
}

// Mount mounts o.Root at dir and serves it until Unmount. The caller must
// be root (or have CAP_SYS_ADMIN) or have fusermount3 on PATH.
func Mount(dir string, o Options) (*FS, error) {
	if o.Client == nil {
		return nil, errors.New("mount: no client")
	}
	if o.Root == "" {
		o.Root = "/"
	}
	o.Root = path.Clean("/" + o.Root)
	if o.AttrTimeout <= 0 {
		o.AttrTimeout = time.Minute
	}
	if o.DirTimeout <= 0 {
		o.DirTimeout = time.Second
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 4 << 20
	}
	if o.ReadAhead < 0 {
		o.ReadAhead = 0
	} else if o.ReadAhead == 0 {
		o.ReadAhead = 64 << 20
	}
	if o.Memory <= 0 {
		o.Memory = 1 << 30
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Source == "" {
		o.Source = "gd2fs:" + o.Root
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &FS{opts: o, cl: o.Client, dir: abs, ctx: ctx, cancel: cancel, hiddenPaths: map[string]*fileNode{}}
	root := newDir(m, o.Root, client.FileInfo{})
	m.root = root
	zero := time.Duration(0)
	mo := fuse.MountOptions{
		FsName:        o.Source,
		Name:          "gd2fs",
		AllowOther:    o.AllowOther,
		MaxWrite:      1 << 20, // also the largest read request (max_pages)
		MaxBackground: 64,      // kernel readahead requests in flight
		DirectMount:   os.Geteuid() == 0,
		Debug:         o.Debug,
		Logger:        log.New(slogWriter{o.Log}, "", 0),
	}
	// The kernel checks the modes the mount reports (0444 sealed files,
	// 0755 root-owned folders), so with --allow-other other users read and
	// only the mounting user writes.
	mo.Options = append(mo.Options, "default_permissions")
	if o.ReadOnly {
		mo.Options = append(mo.Options, "ro")
	}
	// Timeouts are set per entry (sealed files long, the rest short); these
	// are the defaults for what the nodes do not set.
	srv, err := fs.Mount(abs, root, &fs.Options{MountOptions: mo, EntryTimeout: &o.DirTimeout, AttrTimeout: &o.DirTimeout, NegativeTimeout: &zero})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("mount %s: %w (is /dev/fuse there, and are you root or is fusermount3 installed?)", abs, err)
	}
	m.server = srv
	m.probePassthrough()
	m.raiseReadahead()
	return m, nil
}

// probePassthrough finds out whether hot files can be passthrough files:
// the kernel must offer it and accept this process's backing files.
func (m *FS) probePassthrough() {
	switch {
	case m.opts.Cache == nil:
		m.why = "no --cache: there is no local copy to pass through to"
		return
	case m.opts.NoPassthrough:
		m.why = "turned off (--no-passthrough)"
		return
	case m.server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0:
		m.why = "the kernel does not offer FUSE passthrough (Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)"
		return
	}
	if err := os.MkdirAll(m.opts.Cache.Dir, 0o755); err != nil {
		m.why = "cache folder: " + err.Error()
		return
	}
	f, err := os.CreateTemp(m.opts.Cache.Dir, ".passthrough-probe-*")
	if err != nil {
		m.why = "cache folder: " + err.Error()
		return
	}
	defer os.Remove(f.Name())
	defer f.Close()
	id, errno := m.server.RegisterBackingFd(&fuse.BackingMap{Fd: int32(f.Fd())})
	if errno != 0 {
		m.why = fmt.Sprintf("the kernel refused a backing file (%v): passthrough needs root (CAP_SYS_ADMIN)", errno)
		return
	}
	m.server.UnregisterBackingFd(id)
	m.passthrough = true
}

// raiseReadahead lets the kernel read ahead ReadAhead bytes on this mount
// (its FUSE default is 128 KiB), in requests of up to 1 MiB that run in
// parallel. Best effort: it needs root.
func (m *FS) raiseReadahead() {
	var st syscall.Stat_t
	if m.opts.ReadAhead == 0 || syscall.Stat(m.dir, &st) != nil {
		return
	}
	kb := m.opts.ReadAhead >> 10
	if kb > 64<<10 {
		kb = 64 << 10
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(p, []byte(fmt.Sprint(kb)), 0o644); err != nil {
		m.opts.Log.Debug("kernel readahead left at its default", "err", err)
	}
}

// Passthrough reports whether hot files are handed to the kernel as
// passthrough backing files, and if not, why.
func (m *FS) Passthrough() (bool, string) { return m.passthrough, m.why }

// Dir is the mountpoint.
func (m *FS) Dir() string { return m.dir }

// Wait blocks until the file system is unmounted (by Unmount, `gd2fs
// umount`, fusermount3 -u or umount).
func (m *FS) Wait() {
	m.server.Wait()
	m.cancel()
}

// Unmount unmounts; with files open it fails (EBUSY) unless lazy, which
// detaches the mountpoint at once and keeps serving the open files until
// they are closed.
func (m *FS) Unmount(lazy bool) error {
	if lazy {
		if err := syscall.Unmount(m.dir, syscall.MNT_DETACH); err != nil {
			return Unmount(m.dir, true)
		}
		return nil
	}
	if err := m.server.Unmount(); err != nil {
		return fmt.Errorf("unmount %s: %w (files are open under it: close them, or unmount lazily)", m.dir, err)
	}
	m.cancel()
	return nil
}

// Unmount unmounts the FUSE file system at dir, whether its daemon runs or
// was killed (a dead daemon leaves "Transport endpoint is not connected").
// lazy detaches it even while files are open.
func Unmount(dir string, lazy bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	flags := 0
	if lazy {
		flags = syscall.MNT_DETACH
	}
	err = syscall.Unmount(abs, flags)
	if errors.Is(err, syscall.EPERM) { // not root: the setuid helper
		args := []string{"-u"}
		if lazy {
			args = append(args, "-z")
		}
		out, xerr := runFusermount(append(args, abs)...)
		if xerr == nil {
			return nil
		}
		return fmt.Errorf("fusermount3 -u %s: %s: %w", abs, strings.TrimSpace(out), xerr)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("unmount %s: files are open under it (fuser -vm %s lists the processes): close them, or unmount with --lazy: %w", abs, abs, err)
	case errors.Is(err, syscall.EINVAL):
		return fmt.Errorf("unmount %s: not a mountpoint: %w", abs, err)
	}
	return fmt.Errorf("unmount %s: %w", abs, err)
}

// ino numbers an inode by what identifies its content, so a replaced file
// (same path, other size or time) gets a fresh inode and page cache.
func ino(p string, fi client.FileInfo) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%v\x00%d\x00%d", p, fi.IsDir, fi.Size, fi.Modified.UnixNano())
	v := h.Sum64()
	if v <= 1 { // 1 is the root
		v += 2
	}
	return v
}

// slogWriter sends go-fuse's log lines to slog.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(b []byte) (int, error) {
	w.l.Debug("fuse", "msg", strings.TrimSpace(string(b)))
	return len(b), nil
}

func runFusermount(args ...string) (string, error) {
	out, err := exec.Command("fusermount3", args...).CombinedOutput()
	return string(out), err
}
