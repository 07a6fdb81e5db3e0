package weights

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// Cache is a local hot cache laid out like the Hugging Face hub cache:
//
//	<dir>/models--<org>--<name>/blobs/<sha256>
//	<dir>/models--<org>--<name>/snapshots/<rev>/<file>  -> ../../blobs/<sha256>
//	<dir>/models--<org>--<name>/refs/main               (contains <rev>)
//
// so `vllm serve <dir>/models--org--name/snapshots/<rev>` (or HF_HUB_CACHE=<dir>)
// loads it unchanged. Blobs are downloaded as blobs/.partial-* files with a
// progress record (partial.go), checked against their sha256 and renamed into
// place; a snapshot is built in a temporary folder and renamed, so no reader
// ever sees a partial file or snapshot, and a killed warmup resumes its
// blobs where their last checkpoint left them.
// A size quota is kept by evicting least recently used models that no
// process has open.
type Cache struct {
	Dir   string
	Quota int64 // bytes; 0 = no limit
	// Parallel files downloaded at once (default 4).
	Parallel int
}

// index is <dir>/.gd2fs-cache.json: use times and the tier counters.
type index struct {
	Models   map[string]*modelUse `json:"models"`
	HitBytes int64                `json:"local_hit_bytes"`   // warmups served by blobs already here
	Fetched  int64                `json:"fetched_bytes"`     // bytes read from the cluster's servers
	Cold     int64                `json:"cold_filled_bytes"` // of those, bytes the servers had to fetch from S3
}

type modelUse struct {
	LastUsed time.Time `json:"last_used"`
	Uses     int       `json:"uses"`
}

var indexMu sync.Mutex // serialises index updates within a process

func (c *Cache) indexPath() string { return filepath.Join(c.Dir, ".gd2fs-cache.json") }

func (c *Cache) loadIndex() *index {
	ix := &index{Models: map[string]*modelUse{}}
	if b, err := os.ReadFile(c.indexPath()); err == nil {
		json.Unmarshal(b, ix)
		if ix.Models == nil {
			ix.Models = map[string]*modelUse{}
		}
	}
	return ix
}

func (c *Cache) saveIndex(ix *index) error {
	b, _ := json.MarshalIndent(ix, "", "  ")
	return atomicWrite(c.indexPath(), b)
}

func (c *Cache) update(fn func(ix *index)) error {
	indexMu.Lock()
	defer indexMu.Unlock()
	ix := c.loadIndex()
	fn(ix)
	return c.saveIndex(ix)
}

func atomicWrite(p string, b []byte) error {
	tmp := fmt.Sprintf("%s.tmp-%d", p, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// RepoDir names a model's folder: /models/org/name -> models--org--name.
func RepoDir(modelPath string) string {
	parts := strings.Split(strings.Trim(modelPath, "/"), "/")
	if len(parts) > 2 {
		parts = parts[len(parts)-2:]
	}
	return "models--" + strings.Join(parts, "--")
}

// WarmupReport says where a warmup's bytes came from.
type WarmupReport struct {
	Snapshot   string // the folder to load the model from
	Rev        string
	Files      int
	Bytes      int64
	LocalBytes int64 // already in the cache
	Resumed    int64 // kept from partial downloads of an interrupted warmup
	Fetched    int64 // read from the cluster's servers
	ColdFilled int64 // of those, filled from S3 by the servers on the way
	Evicted    []string
}

type warmFile struct {
	rel  string
	info client.FileInfo
}

// Warmup materialises the gd2fs model folder modelPath into the cache and
// returns the snapshot folder. rev names the ref to point at it (main).
func (c *Cache) Warmup(ctx context.Context, cl *client.Client, modelPath, ref string, progress Progress) (WarmupReport, error) {
	var rep WarmupReport
	if ref == "" {
		ref = "main"
	}
	files, err := cl.Walk(ctx, modelPath)
	if err != nil {
		return rep, err
	}
	if len(files) == 0 {
		return rep, errs.New(errs.ErrNotFound, "no files under %s", modelPath)
	}
	var wf []warmFile
	for _, f := range files {
		st, err := cl.Stat(ctx, f.Path)
		if err != nil {
			return rep, err
		}
		if !st.Sealed {
			return rep, errs.New(errs.ErrBadRequest, "%s is not complete (an interrupted pull?): finish the pull first", f.Path)
		}
		wf = append(wf, warmFile{rel: strings.TrimPrefix(f.Path, strings.TrimSuffix(modelPath, "/")+"/"), info: st})
		rep.Bytes += st.Size
	}
	repo := filepath.Join(c.Dir, RepoDir(modelPath))
	blobs := filepath.Join(repo, "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return rep, err
	}
	// Room first: what is missing must fit under the quota.
	var need int64
	for _, f := range wf {
		if sum := f.info.Attrs["sha256"]; sum == "" || !exists(filepath.Join(blobs, sum)) {
			need += f.info.Size
		}
	}
	if rep.Evicted, err = c.makeRoom(need, RepoDir(modelPath)); err != nil {
		return rep, err
	}
	before := cl.ReadStats()
	sums := make([]string, len(wf))
	par := c.Parallel
	if par <= 0 {
		par = 4
	}
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i, f := range wf {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			sum, local, resumed, err := c.blob(ctx, cl, blobs, f, progress)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = err
			}
			sums[i] = sum
			if local {
				rep.LocalBytes += f.info.Size
			}
			rep.Resumed += resumed
		}()
	}
	wg.Wait()
	if first != nil {
		return rep, first
	}
	after := cl.ReadStats()
	rep.Fetched, rep.ColdFilled = after.FromServers-before.FromServers, after.ColdFilled-before.ColdFilled
	// The revision is a hash of the file list, like a commit id.
	h := sha1.New()
	for i, f := range wf {
		fmt.Fprintf(h, "%s %s\n", f.rel, sums[i])
	}
	rep.Rev = hex.EncodeToString(h.Sum(nil))
	rep.Files = len(wf)
	snap := filepath.Join(repo, "snapshots", rep.Rev)
	rep.Snapshot = snap
	if !exists(snap) {
		tmp := filepath.Join(repo, "snapshots", fmt.Sprintf(".%s.tmp-%d", rep.Rev, os.Getpid()))
		os.RemoveAll(tmp)
		for i, f := range wf {
			link := filepath.Join(tmp, filepath.FromSlash(f.rel))
			if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
				return rep, err
			}
			depth := strings.Count(f.rel, "/") + 2 // snapshots/<rev>/<rel...>
			target := strings.Repeat("../", depth) + "blobs/" + sums[i]
			if err := os.Symlink(target, link); err != nil {
				return rep, err
			}
		}
		if err := os.Rename(tmp, snap); err != nil && !exists(snap) {
			return rep, err
		}
		os.RemoveAll(tmp)
	}
	if err := os.MkdirAll(filepath.Join(repo, "refs"), 0o755); err != nil {
		return rep, err
	}
	if err := atomicWrite(filepath.Join(repo, "refs", ref), []byte(rep.Rev)); err != nil {
		return rep, err
	}
	err = c.update(func(ix *index) {
		u := ix.Models[RepoDir(modelPath)]
		if u == nil {
			u = &modelUse{}
			ix.Models[RepoDir(modelPath)] = u
		}
		u.LastUsed, u.Uses = time.Now().UTC(), u.Uses+1
		ix.HitBytes += rep.LocalBytes
		ix.Fetched += rep.Fetched
		ix.Cold += rep.ColdFilled
	})
	return rep, err
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// blob makes sure the file's blob is in the cache and returns its sha256.
// local reports it was there already; resumed is how many bytes an
// interrupted warmup had left in its partial download (partial.go).
func (c *Cache) blob(ctx context.Context, cl *client.Client, blobs string, f warmFile, progress Progress) (sum string, local bool, resumed int64, err error) {
	want := f.info.Attrs["sha256"]
	if want != "" && exists(filepath.Join(blobs, want)) {
		if progress != nil {
			progress(f.rel, f.info.Size, f.info.Size)
		}
		return want, true, 0, nil
	}
	pd, err := openPartial(blobs, f.info)
	if err != nil {
		return "", false, 0, err
	}
	defer pd.close() // removes what is not published, except a resumable partial
	src, err := cl.Open(ctx, f.info.Path)
	if err != nil {
		return "", false, 0, err
	}
	resumed = pd.done
	_, err = src.CopyToFrom(ctx, pd, pd.done, func(n int64) {
		if progress != nil {
			progress(f.rel, n, f.info.Size)
		}
	})
	if err == nil {
		err = pd.finish()
	}
	if err != nil {
		return "", false, resumed, fmt.Errorf("download %s: %w (run the same warmup again to resume)", f.info.Path, err)
	}
	sum = hex.EncodeToString(pd.h.Sum(nil))
	if want != "" && sum != want {
		pd.discard()
		return "", false, resumed, errs.New(errs.ErrChecksum, "%s: sha256 %s, recorded %s: the bytes are not the ones pulled; nothing was published", f.info.Path, sum, want)
	}
	if err := pd.publish(filepath.Join(blobs, sum)); err != nil {
		return "", false, resumed, err
	}
	if want == "" { // a linked file: record what it hashes to
		cl.SetAttrs(ctx, f.info.Path, map[string]string{"sha256": sum})
	}
	return sum, false, resumed, nil
}

// ModelInfo describes a cached model.
type ModelInfo struct {
	Name     string
	Bytes    int64
	LastUsed time.Time
	Uses     int
	InUse    bool
}

// List returns the cached models, least recently used first.
func (c *Cache) List() ([]ModelInfo, error) {
	ents, err := os.ReadDir(c.Dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	ix := c.loadIndex()
	open := OpenPaths(c.Dir)
	var out []ModelInfo
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "models--") {
			continue
		}
		dir := filepath.Join(c.Dir, e.Name())
		mi := ModelInfo{Name: e.Name(), Bytes: dirBytes(filepath.Join(dir, "blobs"))}
		if u := ix.Models[e.Name()]; u != nil {
			mi.LastUsed, mi.Uses = u.LastUsed, u.Uses
		}
		for p := range open {
			if strings.HasPrefix(p, dir+string(filepath.Separator)) {
				mi.InUse = true
			}
		}
		out = append(out, mi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastUsed.Before(out[j].LastUsed) })
	return out, nil
}

// Stats are the cache's cumulative tier counters.
func (c *Cache) Stats() (hit, fetched, cold int64) {
	ix := c.loadIndex()
	return ix.HitBytes, ix.Fetched, ix.Cold
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// Remove deletes a cached model; a model some process has open is refused
// unless force.
func (c *Cache) Remove(name string, force bool) error {
	if !strings.HasPrefix(name, "models--") {
		name = RepoDir(name)
	}
	dir := filepath.Join(c.Dir, name)
	if !exists(dir) {
		return errs.New(errs.ErrNotFound, "no cached model %s in %s", name, c.Dir)
	}
	if !force && inUse(dir) {
		return errs.New(errs.ErrExists, "%s is in use by a running process: stop it first (or --force)", name)
	}
	// Rename first: the model disappears at once, never half removed.
	gone := filepath.Join(c.Dir, fmt.Sprintf(".removing-%s-%d", name, os.Getpid()))
	if err := os.Rename(dir, gone); err != nil {
		return err
	}
	if err := os.RemoveAll(gone); err != nil {
		return err
	}
	return c.update(func(ix *index) { delete(ix.Models, name) })
}

// GC evicts least recently used models not in use until the cache holds at
// most quota bytes; it returns what went.
func (c *Cache) GC(quota int64) ([]string, error) {
	return c.evict(quota, "")
}

// makeRoom evicts until need more bytes fit under the quota.
func (c *Cache) makeRoom(need int64, keep string) ([]string, error) {
	if c.Quota <= 0 {
		return nil, nil
	}
	if need > c.Quota {
		return nil, errs.New(errs.ErrNoSpace, "the model needs %d bytes, more than the %d-byte cache quota: raise --quota", need, c.Quota)
	}
	return c.evict(c.Quota-need, keep)
}

func (c *Cache) evict(limit int64, keep string) ([]string, error) {
	ms, err := c.List()
	if err != nil {
		return nil, err
	}
	var total int64
	for _, m := range ms {
		total += m.Bytes
	}
	var evicted []string
	for _, m := range ms { // least recently used first
		if total <= limit {
			break
		}
		if m.Name == keep || m.InUse {
			continue // never a file in use
		}
		if err := c.Remove(m.Name, false); err != nil {
			continue
		}
		total -= m.Bytes
		evicted = append(evicted, m.Name)
	}
	if total > limit {
		return evicted, errs.New(errs.ErrNoSpace, "cache %s holds %d bytes over its limit of %d, and the rest is in use: stop a model server or raise --quota", c.Dir, total-limit, limit)
	}
	return evicted, nil
}

// inUse reports whether any process has a file under dir open or mapped.
func inUse(dir string) bool {
	for p := range OpenPaths(filepath.Dir(dir)) {
		if strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// OpenPaths returns the files under root that some process has open (an fd)
// or mapped (vLLM and safetensors mmap weights), from /proc. Symlinks of a
// snapshot resolve to blobs, which is what the kernel reports.
func OpenPaths(root string) map[string]bool {
	out := map[string]bool{}
	root, _ = filepath.Abs(root)
	if r, err := filepath.EvalSymlinks(root); err == nil {
		root = r
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if p.Name()[0] < '0' || p.Name()[0] > '9' {
			continue
		}
		base := path.Join("/proc", p.Name())
		fds, _ := os.ReadDir(path.Join(base, "fd"))
		for _, fd := range fds {
			if t, err := os.Readlink(path.Join(base, "fd", fd.Name())); err == nil && strings.HasPrefix(t, root) {
				out[t] = true
			}
		}
		if maps, err := os.ReadFile(path.Join(base, "maps")); err == nil {
			for _, line := range strings.Split(string(maps), "\n") {
				if i := strings.Index(line, root); i >= 0 {
					out[strings.TrimSuffix(line[i:], " (deleted)")] = true
				}
			}
		}
	}
	return out
}
