package mount

import (
	"context"
	"errors"
	"syscall"

	"github.com/gd2fs/gd2fs/errs"
)

// errStale: the inode's file is no longer at its name (ESTALE).
var errStale = errors.New("the file was replaced under its name")

// errno is the one translation of an SDK error to what a POSIX program
// sees (the table in doc.go and docs/mount.md).
func errno(err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, errStale):
		return syscall.ESTALE
	case errors.Is(err, errs.ErrNotFound):
		return syscall.ENOENT
	case errors.Is(err, errs.ErrExists):
		return syscall.EEXIST
	case errors.Is(err, errs.ErrNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, errs.ErrIsDir):
		return syscall.EISDIR
	case errors.Is(err, errs.ErrNotDir):
		return syscall.ENOTDIR
	case errors.Is(err, errs.ErrSealed):
		return syscall.EPERM
	case errors.Is(err, errs.ErrBusy): // being written, or held by a KV session
		return syscall.EBUSY
	case errors.Is(err, errs.ErrNoSpace):
		return syscall.ENOSPC
	case errors.Is(err, errs.ErrBadRequest):
		return syscall.EINVAL
	case errors.Is(err, errs.ErrTooLarge):
		return syscall.EFBIG
	case errors.Is(err, errs.ErrUnauthorized):
		return syscall.EACCES
	default: // unavailable (master or servers down past the retry window), checksum, internal
		return syscall.EIO
	}
}

// Extended attributes are not stored: setting one is not supported (and
// Getxattr answers ENODATA, go-fuse's default).
func (d *dirNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return syscall.EOPNOTSUPP
}

func (n *fileNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return syscall.EOPNOTSUPP
}
