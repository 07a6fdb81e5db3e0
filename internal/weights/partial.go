package weights

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gd2fs/gd2fs/client"
)

// A warmup downloads each blob into blobs/.partial-<key>, where key names
// the gd2fs file (its id, path, size, modification time, recorded identity), and
// keeps beside it a small progress record, blobs/.partial-<key>.json: how
// many bytes of the partial file are known good, and the sha256 state after
// them. The record is written (atomically, by rename) only after those bytes
// were fsynced, every checkpointEvery bytes or checkpointInterval, and when a
// download stops on an error. A warmup killed at any moment therefore
// leaves a partial file that is not a blob (never published, never in a
// snapshot) and a record of a prefix of it; the next warmup truncates the
// file to that prefix, restores the hash state, and continues from there, so
// the sha256 it checks covers every byte of the blob. A partial file is
// locked (flock) by the process writing it; a second process warming the
// same model at once downloads into a private temporary file instead.

const (
	checkpointEvery    = 64 << 20
	checkpointInterval = 500 * time.Millisecond
)

type partialRecord struct {
	ID   int64  `json:"id"` // the gd2fs file's id: never another file's, even at the same path
	Path string `json:"path"`
	Size int64  `json:"size"`
	Done int64  `json:"done"`
	Hash []byte `json:"sha256_state"` // crypto/sha256's MarshalBinary
}

type partial struct {
	f         *os.File
	path, rec string
	shared    bool // the resumable .partial-<key> (false: a private temp file)
	info      client.FileInfo
	h         hash.Hash
	done      int64 // bytes in f and in h
	saved     int64 // done at the last checkpoint
	savedAt   time.Time
	published bool
}

// partialKey names the download of one version of a gd2fs file. The file's
// id is in it: a file removed and written again at the same path, with the
// same size and within the clock's resolution, is another file, and
// resuming its download from the first one's bytes would publish a mix.
func partialKey(fi client.FileInfo) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d\x00%s\x00%d\x00%s\x00%s\x00%s\x00%s", fi.ID, fi.Path, fi.Size, fi.Modified.UTC().Format(time.RFC3339Nano),
		fi.Attrs["sha256"], fi.Attrs["source"], fi.Attrs["etag"])
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// openPartial opens (or resumes) the partial download of fi in blobs.
func openPartial(blobs string, fi client.FileInfo) (*partial, error) {
	p := &partial{path: filepath.Join(blobs, ".partial-"+partialKey(fi)), info: fi, h: sha256.New(), savedAt: time.Now()}
	p.rec = p.path + ".json"
	f, err := os.OpenFile(p.path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		// Another process is downloading this blob now: do it privately.
		f.Close()
		if f, err = os.CreateTemp(blobs, ".partial-*.private"); err != nil {
			return nil, err
		}
		p.f, p.path = f, f.Name()
		return p, nil
	}
	p.f, p.shared = f, true
	if r, ok := p.readRecord(); ok {
		if u, ok := p.h.(encoding.BinaryUnmarshaler); ok && u.UnmarshalBinary(r.Hash) == nil {
			p.done = r.Done
		} else {
			p.h.Reset()
		}
	}
	// Bytes past the record may be torn (a crash between a write and its
	// checkpoint): drop them.
	if err := f.Truncate(p.done); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(p.done, 0); err != nil {
		f.Close()
		return nil, err
	}
	p.saved = p.done
	return p, nil
}

func (p *partial) readRecord() (partialRecord, bool) {
	var r partialRecord
	b, err := os.ReadFile(p.rec)
	if err != nil || json.Unmarshal(b, &r) != nil {
		return r, false
	}
	st, err := p.f.Stat()
	ok := err == nil && r.ID == p.info.ID && r.Path == p.info.Path && r.Size == p.info.Size && r.Done >= 0 && r.Done <= r.Size && r.Done <= st.Size()
	return r, ok
}

// Write appends to the partial file and the hash (io.Writer for CopyToFrom).
func (p *partial) Write(b []byte) (int, error) {
	n, err := p.f.Write(b)
	p.h.Write(b[:n])
	p.done += int64(n)
	if err != nil {
		return n, err
	}
	if p.done-p.saved >= checkpointEvery || time.Since(p.savedAt) >= checkpointInterval {
		if err := p.checkpoint(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// checkpoint makes the bytes so far durable, then records them.
func (p *partial) checkpoint() error {
	p.savedAt = time.Now()
	if !p.shared || p.done == p.saved {
		return nil
	}
	m, ok := p.h.(encoding.BinaryMarshaler)
	if !ok {
		return errors.New("sha256 state cannot be saved")
	}
	state, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	if err := p.f.Sync(); err != nil {
		return err
	}
	b, _ := json.Marshal(partialRecord{ID: p.info.ID, Path: p.info.Path, Size: p.info.Size, Done: p.done, Hash: state})
	if err := atomicWrite(p.rec, b); err != nil {
		return err
	}
	p.saved = p.done
	return nil
}

// finish makes the whole download durable before it is published.
func (p *partial) finish() error {
	if p.done != p.info.Size {
		return fmt.Errorf("got %d of %d bytes", p.done, p.info.Size)
	}
	return p.f.Sync()
}

// publish renames the complete, checked download to dst (read-only).
func (p *partial) publish(dst string) error {
	if err := p.f.Chmod(0o444); err != nil {
		return err
	}
	if err := os.Rename(p.path, dst); err != nil {
		return err
	}
	p.published = true
	os.Remove(p.rec)
	return nil
}

// discard drops the download (its bytes did not check): the next warmup
// starts it again.
func (p *partial) discard() {
	p.f.Close()
	os.Remove(p.path)
	os.Remove(p.rec)
	p.published = true // nothing left to keep
}

// close keeps a shared partial download for the next warmup (recording how
// far it got) and removes a private one.
func (p *partial) close() {
	if !p.published && p.shared {
		p.checkpoint()
	}
	p.f.Close()
	if !p.published && !p.shared {
		os.Remove(p.path)
	}
}
