package store

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// fileSystem is what the disk tier needs from the operating system. The
// store uses osFS; the power-loss tests use an in-memory file system that
// remembers which writes reached the disk (were synced) and can crash,
// dropping or tearing the rest.
type fileSystem interface {
	OpenFile(name string, flag int, perm os.FileMode) (file, error)
	MkdirAll(path string, perm os.FileMode) error
	Remove(name string) error
	Rename(oldpath, newpath string) error
	// ReadDir lists the names in dir and whether each is a directory.
	ReadDir(dir string) ([]dirEntry, error)
	// SyncDir makes the names created, renamed or removed in dir durable.
	SyncDir(dir string) error
}

type dirEntry struct {
	Name  string
	IsDir bool
}

// file is an open chunk file.
type file interface {
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

type osFS struct{}

type osFile struct{ *os.File }

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (file, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) MkdirAll(path string, perm os.FileMode) error { return os.MkdirAll(path, perm) }
func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) Rename(oldpath, newpath string) error         { return os.Rename(oldpath, newpath) }

func (osFS) ReadDir(dir string) ([]dirEntry, error) {
	es, err := os.ReadDir(dir)
	out := make([]dirEntry, 0, len(es))
	for _, e := range es {
		out = append(out, dirEntry{Name: e.Name(), IsDir: e.IsDir()})
	}
	return out, err
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (f osFile) WriteVAt(bufs [][]byte, off int64) (int, error) { return pwritev(f.File, bufs, off) }

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
