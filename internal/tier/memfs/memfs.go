// Package memfs is an in-memory tier.FS that knows what a power loss keeps,
// for the power-loss model tests of the disk tiers (internal/store's
// TestPowerLossModel, internal/kvstore's TestKVPowerLossModel). It is test
// support: no product code imports it.
package memfs

import (
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/gd2fs/gd2fs/internal/tier"
)

// FS is an in-memory file system that knows what a power loss keeps, as
// bbolt's failpoint tests model it: every file has the bytes the page cache
// holds (what reads see) and the bytes the disk holds (as of its last
// fdatasync), and the names likewise (as of each directory's last fsync).
// Crash throws the page cache away: each write since the file's last sync
// is dropped, kept, or kept in part (page by page, any subset, in any
// order), and each name created, renamed or removed since its directory's
// last sync is either as it was or as it is. Directories themselves are
// durable when made (the store syncs its parent directories; that part is
// not modelled).
//
// Every method is safe for concurrent use.
type FS struct {
	mu    sync.Mutex
	files map[string]*memFile // names as the running system sees them
	disk  map[string]*memFile // names as the disk has them
	dirs  map[string]bool

	// NoSync makes fdatasync and directory fsync do nothing: a store
	// that never syncs, for the test that the model check catches it. Set
	// it before the FS is used.
	NoSync bool
	syncs  int
}

type memFile struct {
	data    []byte // the page cache's view
	synced  []byte // the disk's
	pending []memWrite
}

type memWrite struct {
	off   int64
	p     []byte
	trunc bool // a truncation to off
}

const memPage = 4096

// New returns an empty file system holding only the directory "/".
func New() *FS {
	return &FS{files: map[string]*memFile{}, disk: map[string]*memFile{}, dirs: map[string]bool{"/": true}}
}

func notExist(op, name string) error {
	return &os.PathError{Op: op, Path: name, Err: syscall.ENOENT}
}

func (m *FS) OpenFile(name string, flag int, _ os.FileMode) (tier.File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.files[name]
	switch {
	case f == nil:
		if flag&os.O_CREATE == 0 || !m.dirs[filepath.Dir(name)] {
			return nil, notExist("open", name)
		}
		f = &memFile{}
		m.files[name] = f
	case flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL:
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EEXIST}
	case flag&os.O_TRUNC != 0 && len(f.data) > 0:
		f.data = f.data[:0]
		f.pending = append(f.pending, memWrite{off: 0, trunc: true})
	}
	return &memHandle{m: m, f: f}, nil
}

func (m *FS) MkdirAll(path string, _ os.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p := path; !m.dirs[p]; p = filepath.Dir(p) {
		m.dirs[p] = true
	}
	return nil
}

func (m *FS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.files[name] == nil {
		return notExist("remove", name)
	}
	delete(m.files, name)
	return nil
}

func (m *FS) Rename(oldpath, newpath string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.files[oldpath]
	if f == nil {
		return notExist("rename", oldpath)
	}
	delete(m.files, oldpath)
	m.files[newpath] = f
	return nil
}

func (m *FS) ReadDir(dir string) ([]tier.DirEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []tier.DirEntry
	for p := range m.dirs {
		if p != dir && filepath.Dir(p) == dir {
			out = append(out, tier.DirEntry{Name: filepath.Base(p), IsDir: true})
		}
	}
	for p := range m.files {
		if filepath.Dir(p) == dir {
			out = append(out, tier.DirEntry{Name: filepath.Base(p)})
		}
	}
	slices.SortFunc(out, func(a, b tier.DirEntry) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out, nil
}

func (m *FS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.NoSync {
		return nil
	}
	m.syncs++
	for p := range m.disk {
		if filepath.Dir(p) == dir && m.files[p] == nil {
			delete(m.disk, p)
		}
	}
	for p, f := range m.files {
		if filepath.Dir(p) == dir {
			m.disk[p] = f
		}
	}
	return nil
}

// Syncs is how many fdatasyncs and directory fsyncs took effect.
func (m *FS) Syncs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs
}

// Crash loses the page cache (see FS) and leaves what the disk holds,
// which then is both views; r decides each unsynced write's fate, so a
// seeded r replays the same crash. Files open before it must not be used
// after it: reopen them.
func (m *FS) Crash(r *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := map[string]*memFile{}
	for p, f := range m.disk {
		names[p] = f
	}
	// In name order, so that a seed replays the same crash.
	for _, p := range sortedKeys(m.files) {
		if f := m.files[p]; names[p] != f && r.IntN(2) == 0 { // an unsynced name change that made it
			names[p] = f
		}
	}
	for _, p := range sortedKeys(m.disk) {
		if m.files[p] == nil && r.IntN(2) == 0 { // an unsynced removal that made it
			delete(names, p)
		}
	}
	after := map[*memFile]*memFile{}
	m.files, m.disk = map[string]*memFile{}, map[string]*memFile{}
	for _, p := range sortedKeys(names) {
		f := names[p]
		g := after[f]
		if g == nil {
			img := slices.Clone(f.synced)
			for _, w := range f.pending {
				switch r.IntN(3) {
				case 0: // lost
				case 1, 2:
					if w.trunc && int64(len(img)) > w.off {
						img = img[:w.off]
					}
				}
				if w.trunc {
					continue
				}
				switch r.IntN(3) {
				case 0: // lost
				case 1:
					img = writeAt(img, w.off, w.p)
				case 2: // torn: any subset of its pages
					for o := int64(0); o < int64(len(w.p)); {
						n := min(int64(len(w.p))-o, memPage-(w.off+o)%memPage)
						if r.IntN(2) == 0 {
							img = writeAt(img, w.off+o, w.p[o:o+n])
						}
						o += n
					}
				}
			}
			g = &memFile{data: img, synced: slices.Clone(img)}
			after[f] = g
		}
		m.files[p], m.disk[p] = g, g
	}
}

func writeAt(b []byte, off int64, p []byte) []byte {
	if end := off + int64(len(p)); end > int64(len(b)) {
		b = append(b, make([]byte, end-int64(len(b)))...)
	}
	copy(b[off:], p)
	return b
}

type memHandle struct {
	m *FS
	f *memFile
}

func (h *memHandle) ReadAt(p []byte, off int64) (int, error) {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	if off >= int64(len(h.f.data)) {
		return 0, io.EOF
	}
	n := copy(p, h.f.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (h *memHandle) WriteAt(p []byte, off int64) (int, error) {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	h.f.data = writeAt(h.f.data, off, p)
	h.f.pending = append(h.f.pending, memWrite{off: off, p: slices.Clone(p)})
	return len(p), nil
}

func (h *memHandle) WriteVAt(bufs [][]byte, off int64) (int, error) {
	var all []byte
	for _, b := range bufs {
		all = append(all, b...)
	}
	return h.WriteAt(all, off)
}

func (h *memHandle) Datasync() error {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	if h.m.NoSync {
		return nil
	}
	h.m.syncs++
	h.f.synced = slices.Clone(h.f.data)
	h.f.pending = nil
	return nil
}

func (h *memHandle) Size() (int64, error) {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	return int64(len(h.f.data)), nil
}

func (h *memHandle) Truncate(size int64) error {
	h.m.mu.Lock()
	defer h.m.mu.Unlock()
	if int64(len(h.f.data)) > size {
		h.f.data = h.f.data[:size]
	} else {
		h.f.data = writeAt(h.f.data, size, nil)
	}
	h.f.pending = append(h.f.pending, memWrite{off: size, trunc: true})
	return nil
}

func (h *memHandle) Close() error { return nil }

func sortedKeys(m map[string]*memFile) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
