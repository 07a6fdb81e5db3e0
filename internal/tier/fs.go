package tier

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// FS is what a disk tier needs from the operating system. The stores use
// OS; their power-loss tests use an in-memory file system (tier/memfs) that
// remembers which writes reached the disk (were synced) and can crash,
// dropping or tearing the rest. It is an interface because it has those two
// implementations.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	MkdirAll(path string, perm os.FileMode) error
	Remove(name string) error
	Rename(oldpath, newpath string) error
	// ReadDir lists the names in dir, sorted, and whether each is a
	// directory.
	ReadDir(dir string) ([]DirEntry, error)
	// SyncDir makes the names created, renamed or removed in dir durable.
	SyncDir(dir string) error
}

// DirEntry is one name in a directory.
type DirEntry struct {
	Name  string
	IsDir bool
}

// File is an open file of a disk tier.
type File interface {
	io.ReaderAt
	io.WriterAt
	// WriteVAt writes bufs at off, as one gathered write where it can.
	WriteVAt(bufs [][]byte, off int64) (int, error)
	// Datasync makes the file's bytes and size durable (fdatasync).
	Datasync() error
	Size() (int64, error)
	Truncate(size int64) error
	Close() error
}

// OS is the operating system's file system.
type OS struct{}

type osFile struct{ *os.File }

// OpenFile opens name as os.OpenFile does.
func (OS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// MkdirAll is os.MkdirAll.
func (OS) MkdirAll(path string, perm os.FileMode) error { return os.MkdirAll(path, perm) }

// Remove is os.Remove.
func (OS) Remove(name string) error { return os.Remove(name) }

// Rename is os.Rename.
func (OS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

// ReadDir is os.ReadDir, names sorted.
func (OS) ReadDir(dir string) ([]DirEntry, error) {
	es, err := os.ReadDir(dir)
	out := make([]DirEntry, 0, len(es))
	for _, e := range es {
		out = append(out, DirEntry{Name: e.Name(), IsDir: e.IsDir()})
	}
	return out, err
}

// SyncDir fsyncs dir.
func (OS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (f osFile) WriteVAt(bufs [][]byte, off int64) (int, error) { return Pwritev(f.File, bufs, off) }

func (f osFile) Datasync() error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			return err
		}
	}
}

func (f osFile) Size() (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// Pwritev writes bufs at off of f, looping over short writes and the
// iovec limit.
func Pwritev(f *os.File, bufs [][]byte, off int64) (int, error) {
	bufs = append([][]byte(nil), bufs...) // trimmed below; the caller's views stay whole
	total := 0
	for {
		for len(bufs) > 0 && len(bufs[0]) == 0 {
			bufs = bufs[1:] // an empty buffer would never be consumed below
		}
		if len(bufs) == 0 {
			break
		}
		k := min(len(bufs), 1024)
		n, err := unix.Pwritev(int(f.Fd()), bufs[:k], off)
		if err != nil {
			return total, err
		}
		total += n
		off += int64(n)
		for n > 0 && len(bufs) > 0 {
			if n >= len(bufs[0]) {
				n -= len(bufs[0])
				bufs = bufs[1:]
			} else {
				bufs[0] = bufs[0][n:]
				n = 0
			}
		}
	}
	return total, nil
}
