package store

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/tier"
)

// Durability.
//
// A write returns when its bytes are in the page cache (and DRAM): that
// survives the server process dying, not the machine losing power. Sync
// makes the writes of a chunk that have returned durable: fdatasync of the
// chunk file (its bytes, block CRCs, header and size), and for a chunk file
// new since the last Sync, fsync of the directory that names it (and, for
// a new directory, of its parent).
//
// Concurrent Syncs of one chunk share fdatasyncs (group commit): a caller
// whose write an fdatasync already covered returns without one; the others
// wait for the running one and then one of them runs the next, covering
// every write that returned meanwhile.
//
// What the disk holds after a power loss, for a chunk whose writes were not
// all synced, is whatever subset of its recent page writes the kernel had
// written back: every 64 KiB block is then either as it was after some
// write (its CRC matches) or fails its CRC (errs.ErrChecksum), and a file
// shorter than its header reads as errs.ErrChecksum too. Never other bytes.

// SyncPolicy says which chunk writes a server makes durable (fdatasync)
// before it acknowledges them.
type SyncPolicy int

const (
	// SyncReplicated, the default: writes to chunks with more than one
	// replica (the ha pool); one-replica chunks are in the page cache.
	SyncReplicated SyncPolicy = iota
	// SyncAlways: every write, one-replica chunks too.
	SyncAlways
	// SyncNever: no write; the page cache only. Replicated data then
	// survives losing servers, not a power loss of all its replicas.
	SyncNever
)

func (p SyncPolicy) String() string {
	switch p {
	case SyncAlways:
		return "always"
	case SyncNever:
		return "never"
	}
	return "replicated"
}

// ParseSyncPolicy reads "replicated", "always" or "never".
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	for _, p := range []SyncPolicy{SyncReplicated, SyncAlways, SyncNever} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, errs.New(errs.ErrBadRequest, "sync policy %q: say replicated (writes to chunks of more than one replica, the default), always or never", s)
}

// Sync makes every write to chunk id that has returned so far survive power
// loss, and makes a later Seal of the chunk durable too. Without a disk tier
// it does nothing: DRAM is lost with the process either way.
func (s *Store) Sync(id uint64) error {
	if s.cfg.Dir == "" {
		return nil
	}
	c, err := s.get(id)
	if err != nil {
		return err
	}
	return s.sync(c)
}

// sync is Sync for c; it may be called with c.mu held (by Seal), never
// the other way round: the fdatasync itself runs without c.mu, so writes
// to the chunk go on meanwhile and are covered by the next one.
func (s *Store) sync(c *chunk) error {
	c.durable.Store(true)
	want := c.written.Load()
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	if c.synced >= want && c.linked {
		return nil // an fdatasync that started after our write covered it
	}
	covers := c.written.Load()
	f, err := s.open(c.id, false)
	if err != nil {
		if os.IsNotExist(err) {
			return notFound(c.id) // deleted meanwhile
		}
		return fmt.Errorf("store: sync chunk %d: %w", c.id, err)
	}
	err = f.Datasync()
	f.Close()
	s.syncs.Add(1)
	if err != nil {
		return fmt.Errorf("store: sync chunk %d: %w", c.id, err)
	}
	if !c.linked {
		if err := s.syncDirOf(s.path(c.id)); err != nil {
			return err
		}
		c.linked = true
	}
	c.synced = covers
	return nil
}

// syncDirOf makes the entry of p durable: fsync of its directory, and the
// first time for each directory, of the directory above it.
func (s *Store) syncDirOf(p string) error {
	dir := filepath.Dir(p)
	if err := s.fs.SyncDir(dir); err != nil {
		return fmt.Errorf("store: sync directory %s: %w", dir, err)
	}
	s.dirMu.Lock()
	defer s.dirMu.Unlock()
	if s.linked[dir] {
		return nil
	}
	if err := s.fs.SyncDir(filepath.Dir(dir)); err != nil {
		return fmt.Errorf("store: sync directory %s: %w", filepath.Dir(dir), err)
	}
	s.linked[dir] = true
	return nil
}

// WriteFileAtomic replaces the file at path with data so that a crash or a
// power loss at any moment leaves either the old file or the new one, never
// a part: it writes a temporary file beside it, fsyncs it, renames it over
// path and fsyncs the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return tier.OS{}.SyncDir(filepath.Dir(path))
}
