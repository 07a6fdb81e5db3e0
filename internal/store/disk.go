package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/tier"
)

// ---- disk tier ----
//
// A chunk file is a 20 KiB header region followed by the chunk's bytes:
//
//	0  u32 magic "GDCK"   4 u16 version   6 u16 flags (1 = sealed)
//	8  u64 length         16 u32 block size
//	20 u32 CRC32C of bytes 0..19
//	24.. the written extents (version 2 on; extents.go), in the header's pwrite
//	4096.. u32 CRC32C per 64 KiB block (up to limits.MaxChunk/limits.BlockSize entries)
//
// Writes go data first, then block CRCs, then the header, so a process killed
// in between leaves either the old length (the new bytes are ignored) or a
// block whose CRC fails (read as errs.ErrChecksum, served by another replica).
// Nothing is synced unless asked (Sync, durable.go); after a power loss any
// subset of the unsynced pages may be on disk, which the block CRCs catch
// the same way.

const (
	chunkMagic   = 0x4b434447 // "GDCK"
	chunkVersion = 2          // 2: written extents after the header; 1 is still read
	crcTableOff  = 4096
	dataOff      = crcTableOff + (limits.MaxChunk/limits.BlockSize)*4
	flagSealed   = 1
)

func (s *Store) path(id uint64) string {
	return filepath.Join(s.cfg.Dir, "chunks", fmt.Sprintf("%02x", id&0xff), strconv.FormatUint(id, 16)+".chunk")
}

func (s *Store) open(id uint64, create bool) (tier.File, error) {
	p := s.path(id)
	if !create {
		return s.fs.OpenFile(p, os.O_RDONLY, 0)
	}
	f, err := s.fs.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if os.IsNotExist(err) {
		if err := s.fs.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, err
		}
		f, err = s.fs.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	}
	return f, err
}

// writeCRCs persists block CRCs from block first on, then the header.
func (s *Store) writeCRCs(c *chunk, f tier.File, first int, newLen int64) error {
	last := blocks(newLen)
	tab := make([]byte, 4*(last-first))
	for i := range last - first {
		binary.LittleEndian.PutUint32(tab[4*i:], c.crcs[first+i])
	}
	if _, err := f.WriteAt(tab, crcTableOff+int64(4*first)); err != nil {
		return fmt.Errorf("store: write checksums of chunk %d: %w", c.id, err)
	}
	return writeHeaderTo(f, newLen, c.sealed, &c.ext)
}

func (s *Store) writeHeader(c *chunk, sealed bool) error {
	f, err := s.open(c.id, true)
	if err != nil {
		return fmt.Errorf("store: open chunk %d: %w", c.id, err)
	}
	defer f.Close()
	return writeHeaderTo(f, c.length, sealed, &c.ext)
}

// writeHeaderTo writes the header and, right after it in the same pwrite,
// the chunk's written extents.
func writeHeaderTo(f io.WriterAt, length int64, sealed bool, ext *extentSet) error {
	var buf [extRecordOff + 64]byte
	h := buf[:extRecordOff]
	binary.LittleEndian.PutUint32(h[0:], chunkMagic)
	binary.LittleEndian.PutUint16(h[4:], chunkVersion)
	if sealed {
		binary.LittleEndian.PutUint16(h[6:], flagSealed)
	}
	binary.LittleEndian.PutUint64(h[8:], uint64(length))
	binary.LittleEndian.PutUint32(h[16:], limits.BlockSize)
	binary.LittleEndian.PutUint32(h[20:], crc32.Checksum(h[:20], crc32c.Table))
	h = ext.appendRecord(h)
	if _, err := f.WriteAt(h, 0); err != nil {
		return fmt.Errorf("store: write chunk header: %w", err)
	}
	return nil
}

// readDisk reads [off, off+n) widened to whole blocks, verifies each block's
// CRC and returns the asked-for bytes and their CRC, in a pooled buffer bp
// the caller gives back with bufpool.Put (nil when n is 0). c.mu held.
func (s *Store) readDisk(c *chunk, off, n int64) (bp *[]byte, bufs [][]byte, crc uint32, err error) {
	if n == 0 {
		return nil, nil, 0, nil
	}
	f, err := s.open(c.id, false)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("store: open chunk %d: %w", c.id, err)
	}
	defer f.Close()
	bs := off / limits.BlockSize * limits.BlockSize
	be := min((off+n+limits.BlockSize-1)/limits.BlockSize*limits.BlockSize, c.length)
	bp, err = tier.ReadPooled(f, dataOff+bs, int(be-bs))
	if errors.Is(err, tier.ErrShort) {
		// The header promises bytes the file does not have: a write that
		// never reached the disk (power loss). Torn, not data.
		s.corrupt.Add(1)
		return nil, nil, 0, errs.New(errs.ErrChecksum, "store: chunk %d is shorter on disk than its header says (torn by a crash): read another replica", c.id)
	} else if err != nil {
		return nil, nil, 0, fmt.Errorf("store: read chunk %d: %w", c.id, err)
	}
	buf := *bp
	fail := func(err error) (*[]byte, [][]byte, uint32, error) {
		bufpool.Put(bp)
		return nil, nil, 0, err
	}
	for b := bs; b < be; b += limits.BlockSize {
		e := min(b+limits.BlockSize, be)
		if crc32.Checksum(buf[b-bs:e-bs], crc32c.Table) != c.crcs[b/limits.BlockSize] {
			s.corrupt.Add(1)
			return fail(errs.New(errs.ErrChecksum, "store: chunk %d block at %d fails its checksum: the disk copy is damaged; read another replica", c.id, b))
		}
	}
	crc = rangeCRC(c.crcs[bs/limits.BlockSize:], bs/limits.BlockSize, c.length, off, n, func(from, to int64) [][]byte {
		return [][]byte{buf[from-bs : to-bs]}
	})
	return bp, [][]byte{buf[off-bs : off-bs+n]}, crc, nil
}

// load scans the disk tier at start-up: chunks/<2 hex digits>/<id>.chunk.
func (s *Store) load() error {
	root := filepath.Join(s.cfg.Dir, "chunks")
	if err := s.fs.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("store: create disk tier %s: %w", root, err)
	}
	if err := s.fs.SyncDir(s.cfg.Dir); err != nil { // chunks/ itself, if just made
		return fmt.Errorf("store: sync %s: %w", s.cfg.Dir, err)
	}
	subs, err := s.fs.ReadDir(root)
	if err != nil {
		return fmt.Errorf("store: list %s: %w", root, err)
	}
	for _, sub := range subs {
		if !sub.IsDir {
			continue
		}
		dir := filepath.Join(root, sub.Name)
		s.linked[dir] = true
		es, err := s.fs.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("store: list %s: %w", dir, err)
		}
		for _, e := range es {
			if e.IsDir || !strings.HasSuffix(e.Name, ".chunk") {
				continue
			}
			p := filepath.Join(dir, e.Name)
			id, perr := strconv.ParseUint(strings.TrimSuffix(e.Name, ".chunk"), 16, 64)
			c, lerr := s.loadChunk(p, id)
			if perr != nil || lerr != nil {
				s.corrupt.Add(1)
				s.log.Warn("dropping damaged chunk file", "path", p, "err", lerr)
				_ = s.fs.Rename(p, p+".corrupt")
				continue
			}
			s.chunks[id] = c
			s.disk.Add(c.length)
		}
	}
	return nil
}

func (s *Store) loadChunk(p string, id uint64) (*chunk, error) {
	f, err := s.fs.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var h [24]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	version := le.Uint16(h[4:])
	if le.Uint32(h[0:]) != chunkMagic || (version != 1 && version != chunkVersion) ||
		le.Uint32(h[20:]) != crc32.Checksum(h[:20], crc32c.Table) || le.Uint32(h[16:]) != limits.BlockSize {
		return nil, fmt.Errorf("bad chunk header")
	}
	length := int64(le.Uint64(h[8:]))
	if length < 0 || length > limits.MaxChunk {
		return nil, fmt.Errorf("bad chunk length %d", length)
	}
	tab := make([]byte, 4*blocks(length))
	if _, err := f.ReadAt(tab, crcTableOff); err != nil {
		return nil, err
	}
	// Bytes past the length the header gives are a write that did not
	// complete (a crash between its data and its header): cut them off, so
	// that a later write leaving a hole there reads zeros, as holes do, and
	// not those bytes.
	if size, err := f.Size(); err != nil {
		return nil, err
	} else if size > dataOff+length {
		if err := f.Truncate(dataOff + length); err != nil {
			return nil, err
		}
		if err := f.Datasync(); err != nil {
			return nil, err
		}
	}
	c := &chunk{id: id, length: length, sealed: le.Uint16(h[6:])&flagSealed != 0, crcs: make([]uint32, blocks(length)), linked: true}
	// What is on disk may have been written without a sync: treat it as
	// durable-written, so a Seal syncs before its marker can reach the disk.
	c.durable.Store(true)
	for i := range c.crcs {
		c.crcs[i] = le.Uint32(tab[4*i:])
	}
	if version == 1 {
		c.ext.add(0, length) // written before extents were kept: taken as whole then
	} else {
		rec := make([]byte, extRecordMax)
		n, err := f.ReadAt(rec, extRecordOff)
		if err != nil && !errors.Is(err, io.EOF) { // a file of an empty chunk ends after its record
			return nil, err
		}
		ext, ok := parseRecord(rec[:n], length)
		if !ok {
			s.log.Warn("chunk's written extents are damaged: its bytes are kept, but no commit can claim them", "path", p)
		}
		c.ext = ext
	}
	return c, nil
}
