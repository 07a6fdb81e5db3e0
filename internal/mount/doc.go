// Package mount is `gd2fs mount`: a gd2fs folder as a POSIX file system
// (FUSE, github.com/hanwen/go-fuse/v2), so that vLLM, SGLang and PyTorch
// open and mmap model weights from a path.
//
// # Reads
//
// Sealed and linked files are immutable, so the kernel is told to cache
// them: entries and attributes for Options.AttrTimeout, and pages across
// opens (FOPEN_KEEP_CACHE). Processes that mmap one file share the
// kernel's page cache, so eight tensor-parallel workers read it from the
// cluster once. A file's inode number is derived from its path, size and
// modification time, so a file replaced under the same name is a new inode
// with an empty page cache, never stale bytes.
//
// The kernel asks for at most 1 MiB per request. Under it, one reader per
// inode (shared by every open handle and process) reads the file in blocks
// of Options.BlockSize through the SDK; concurrent misses of one block wait
// on one fetch, and a read that follows a block read lately starts the
// next Options.ReadAhead bytes as parallel block fetches (client.File
// spreads them over servers; linked files fill from S3 once per cluster,
// on the servers). A block is dropped once the kernel has had all its
// pages, and read-ahead never evicts a block a reader may still ask for
// (reader.go says why): a sequential read fetches each byte once.
//
// # The hot tier
//
// With Options.Cache (internal/weights.Cache: the same layout, quota, LRU
// and crash-safe partial downloads as `gd2fs warmup`), the first open of a
// sealed file starts copying it into the cache; reads of the filled prefix
// come from the partial file, reads just past it wait for it, reads far
// past it go to the servers. Once a file is complete in the cache, a new
// open hands the kernel the local file as the FUSE passthrough backing file
// (Linux 6.9+, root): reads and mmap then go to the local file without this
// process. Where the kernel or the privileges lack passthrough, hot reads
// take the plain FUSE path, from the local file (FS.Passthrough says which,
// and why). The kernel allows one I/O mode per inode at a time, so an inode
// that has plain handles open gets its next passthrough handle only after
// they are closed.
//
// # Writes
//
// The honest subset: create a new file, write it from offset 0 onwards
// without gaps, close: close (the first flush) commits and seals it. A
// writer killed by a signal (its exit code, read at the flush the kernel
// sends as it dies) leaves the file committed and unsealed instead. The
// rest answers (see docs/mount.md):
//
//	open for writing an existing file, O_TRUNC     EPERM (sealed files are immutable)
//	write at any offset but the end               EOPNOTSUPP
//	write after close / a second flush            EPERM
//	truncate to another size, fallocate           EOPNOTSUPP (new files), EPERM (sealed)
//	rename of a closed file or a folder           done on the cluster (one master step)
//	rename of a file being written, of a KV       EBUSY
//	session's file
//	rename RENAME_NOREPLACE onto a name / EXCHANGE EEXIST / EINVAL
//	link, symlink, mknod                           EPERM
//	setxattr                                       EOPNOTSUPP
//	chmod, chown, utimes                           accepted, not stored
//	unlink, mkdir, rmdir (empty)                   done on the cluster (a file open for
//	                                               reading here: at its last close)
//	any op on a read-only mount                    EROFS
//
// SDK errors map once (errno.go): not found ENOENT, exists EEXIST, not
// empty ENOTEMPTY, no space ENOSPC, a master or servers that stay down past
// the client's retry windows EIO.
package mount
