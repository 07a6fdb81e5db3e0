package weights

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// One file at a time into the cache, for `gd2fs mount` (internal/mount): the
// mount's hot tier is this cache, with the same layout, quota, LRU and
// crash-safe partial downloads as warmup. A file /a/b/c/f.bin is a blob of
// the model folder of its directory (RepoDir("/a/b/c") = models--b--c), so a
// warmup of /a/b/c and a mount reading f.bin share one copy.

// BlobPath returns the blob of fi in the cache when it is there: fi must
// carry its sha256 (pulled files do; linked files do once a warmup or a
// mount has read them whole).
func (c *Cache) BlobPath(fi client.FileInfo) (string, bool) {
	sum := fi.Attrs["sha256"]
	if sum == "" {
		return "", false
	}
	p := filepath.Join(c.Dir, RepoDir(path.Dir(fi.Path)), "blobs", sum)
	st, err := os.Stat(p)
	if err != nil || st.Size() != fi.Size {
		return "", false
	}
	return p, true
}

// Fill is one file being copied into the cache. While it runs, ReadAt
// serves the prefix already written (fsynced or not: it is the partial file
// itself, read through the page cache); once it is done, Blob names the
// published, checked copy.
type Fill struct {
	Info client.FileInfo

	mu      sync.RWMutex // held for reading while a ReadAt uses f
	f       *os.File     // the partial file, then the published blob (read-only)
	done    int64
	blob    string
	err     error
	changed chan struct{} // closed and replaced whenever done, blob or err change
	end     chan struct{} // closed when the fill has finished (blob or err set)
}

// StartFill starts copying fi (a sealed file) into the cache in the
// background, under ctx. Room is made first (least recently used models no
// process has open are evicted); a file larger than the quota fails the
// fill at once (Err), and the caller reads from the servers instead.
func (c *Cache) StartFill(ctx context.Context, cl *client.Client, fi client.FileInfo) *Fill {
	f := &Fill{Info: fi, changed: make(chan struct{}), end: make(chan struct{})}
	go f.run(ctx, c, cl)
	return f
}

func (f *Fill) run(ctx context.Context, c *Cache, cl *client.Client) {
	blob, err := f.copy(ctx, c, cl)
	f.mu.Lock()
	if err == nil {
		var ro *os.File
		if ro, err = os.Open(blob); err == nil {
			if f.f != nil {
				f.f.Close()
			}
			f.f, f.blob, f.done = ro, blob, f.Info.Size
		}
	}
	if err != nil {
		f.err = err
		if f.f != nil {
			f.f.Close()
			f.f = nil
		}
	}
	close(f.changed)
	close(f.end)
	f.mu.Unlock()
}

// fillWriter records progress as CopyToFrom writes into the partial file.
type fillWriter struct {
	p *partial
	f *Fill
}

func (w fillWriter) Write(b []byte) (int, error) {
	n, err := w.p.Write(b)
	w.f.mu.Lock()
	w.f.done = w.p.done
	close(w.f.changed)
	w.f.changed = make(chan struct{})
	w.f.mu.Unlock()
	return n, err
}

func (f *Fill) copy(ctx context.Context, c *Cache, cl *client.Client) (string, error) {
	fi := f.Info
	if !fi.Sealed {
		return "", errs.New(errs.ErrBadRequest, "%s is not sealed: only complete files are cached", fi.Path)
	}
	if p, ok := c.BlobPath(fi); ok {
		return p, c.touch(path.Dir(fi.Path), fi.Size, 0)
	}
	model := RepoDir(path.Dir(fi.Path))
	blobs := filepath.Join(c.Dir, model, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return "", err
	}
	if _, err := c.makeRoom(fi.Size, model); err != nil {
		return "", err
	}
	pd, err := openPartial(blobs, fi)
	if err != nil {
		return "", err
	}
	defer pd.close()
	// The partial file is read by ReadAt while it grows: a second handle,
	// so reads never move the writer's offset.
	rd, err := os.Open(pd.path)
	if err != nil {
		return "", err
	}
	f.mu.Lock()
	f.f, f.done = rd, pd.done
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
	src, err := cl.Open(ctx, fi.Path)
	if err != nil {
		return "", err
	}
	if id := src.Info().ID; fi.ID != 0 && id != fi.ID {
		// Another file has the name now (renamed over, or replaced): its
		// bytes are not fi's, nor is the sha256 they hash to.
		src.Close()
		return "", errs.New(errs.ErrNotFound, "%s was replaced since it was opened: nothing was cached", fi.Path)
	}
	resumed := pd.done
	if _, err = src.CopyToFrom(ctx, fillWriter{pd, f}, pd.done, nil); err == nil {
		err = pd.finish()
	}
	if err != nil {
		return "", fmt.Errorf("cache %s: %w", fi.Path, err)
	}
	sum := hex.EncodeToString(pd.h.Sum(nil))
	if want := fi.Attrs["sha256"]; want != "" && sum != want {
		pd.discard()
		return "", errs.New(errs.ErrChecksum, "%s: sha256 %s, recorded %s: the bytes are not the ones written; nothing was cached", fi.Path, sum, want)
	}
	dst := filepath.Join(blobs, sum)
	if err := pd.publish(dst); err != nil {
		return "", err
	}
	if fi.Attrs["sha256"] == "" { // a linked file: record what it hashes to
		cl.SetAttrs(ctx, fi.Path, map[string]string{"sha256": sum})
	}
	return dst, c.touch(path.Dir(fi.Path), 0, fi.Size-resumed)
}

// touch records a use of a model folder (LRU) and the bytes it cost.
func (c *Cache) touch(dir string, hit, fetched int64) error {
	return c.update(func(ix *index) {
		name := RepoDir(dir)
		u := ix.Models[name]
		if u == nil {
			u = &modelUse{}
			ix.Models[name] = u
		}
		u.LastUsed, u.Uses = time.Now().UTC(), u.Uses+1
		ix.HitBytes += hit
		ix.Fetched += fetched
	})
}

// Done is closed when the fill has finished, well or not.
func (f *Fill) Done() <-chan struct{} { return f.end }

// Result is the published blob, or why there is none; both empty while
// the fill runs.
func (f *Fill) Result() (blob string, err error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.blob, f.err
}

// Filled is how many leading bytes ReadAt can serve now.
func (f *Fill) Filled() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.err != nil {
		return 0
	}
	return f.done
}

// WaitFor blocks until the first end bytes are filled, the fill fails
// (its error), or ctx ends.
func (f *Fill) WaitFor(ctx context.Context, end int64) error {
	for {
		f.mu.RLock()
		done, err, ch := f.done, f.err, f.changed
		f.mu.RUnlock()
		if err != nil {
			return err
		}
		if done >= end {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ReadAt reads from the filled prefix; a range past it is an error (wait
// with WaitFor first).
func (f *Fill) ReadAt(p []byte, off int64) (int, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.err != nil {
		return 0, f.err
	}
	if f.f == nil || off+int64(len(p)) > f.done {
		return 0, errs.New(errs.ErrOutOfRange, "%s: bytes %d..%d are not in the cache yet", f.Info.Path, off, off+int64(len(p)))
	}
	return f.f.ReadAt(p, off)
}

// Used records a read of fi served by its blob (the LRU and the hit
// counter of `gd2fs cache ls`).
func (c *Cache) Used(fi client.FileInfo) { c.touch(path.Dir(fi.Path), fi.Size, 0) }
