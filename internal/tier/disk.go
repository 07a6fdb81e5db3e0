package tier

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/internal/bufpool"
)

// Disk is a disk tier: a directory on a file system and the bytes its store
// counts in it against its capacity. What the files hold and how they are
// named is the store's (chunk files, log segments).
//
// A nil *Disk is no disk tier: no capacity, and everything fits (a store
// without one is bounded by its DRAM tier instead). Fits, Add and Used are
// not safe for concurrent use: the store calls them under its own lock.
type Disk struct {
	dir  string
	fs   FS
	cap  int64
	used int64
}

// NewDisk describes a disk tier of capBytes in dir on fs (nil: OS); dir ""
// means none and returns nil. It touches nothing on disk: loading is the
// store's.
func NewDisk(dir string, capBytes int64, fs FS) *Disk {
	if dir == "" {
		return nil
	}
	if fs == nil {
		fs = OS{}
	}
	return &Disk{dir: dir, fs: fs, cap: capBytes}
}

// Dir is the tier's directory ("" for none).
func (d *Disk) Dir() string {
	if d == nil {
		return ""
	}
	return d.dir
}

// FS is the file system the tier's files are on.
func (d *Disk) FS() FS { return d.fs }

// Cap is the tier's capacity in bytes (0 for none).
func (d *Disk) Cap() int64 {
	if d == nil {
		return 0
	}
	return d.cap
}

// Used is the bytes counted (0 for none).
func (d *Disk) Used() int64 {
	if d == nil {
		return 0
	}
	return d.used
}

// Fits says whether n more bytes stay within capacity (always, for none).
func (d *Disk) Fits(n int64) bool { return d == nil || d.used+n <= d.cap }

// Add counts n more bytes (negative: fewer) as used; nothing for none.
func (d *Disk) Add(n int64) {
	if d != nil {
		d.used += n
	}
}

// UsedOnFS is Used, raised to the part of the capacity the file system
// under the tier cannot hold any more: the configured size is a promise the
// file system may not keep (other files fill it), and a server reports
// this figure so the master stops placing data on a full disk. On a file
// system other than OS it is Used.
func (d *Disk) UsedOnFS() int64 {
	if d == nil {
		return 0
	}
	used := d.used
	if _, real := d.fs.(OS); real {
		var st unix.Statfs_t
		if unix.Statfs(d.dir, &st) == nil {
			avail := int64(st.Bavail) * int64(st.Bsize)
			used = max(used, min(d.cap, d.cap-avail))
		}
	}
	return used
}

// IsFull says whether err is the file system running out of room (ENOSPC,
// EDQUOT) rather than a fault: stores answer it as errs.ErrNoSpace.
func IsFull(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// ErrShort is a file that ends before bytes its own header or index promise:
// a write that never reached the disk (a crash or power loss tore it).
var ErrShort = errors.New("tier: the file ends before the bytes its header promises (a torn write)")

// ReadPooled reads n bytes at off of f into a pooled buffer (package
// bufpool), which the caller gives back with bufpool.Put; on an error
// nothing is held. A file ending before off+n is an error wrapping
// ErrShort. The caller verifies the bytes against its own checksums before
// using them.
func ReadPooled(f io.ReaderAt, off int64, n int) (*[]byte, error) {
	bp := bufpool.Get(n)
	if _, err := f.ReadAt(*bp, off); err != nil {
		bufpool.Put(bp)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: %d bytes at %d: %v", ErrShort, n, off, err)
		}
		return nil, err
	}
	return bp, nil
}
