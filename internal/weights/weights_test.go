package weights

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/gd2fs/gd2fs/safetensors"
)

type env struct {
	s3    *s3test.Server
	src   *cold.Source
	c     *cluster.Cluster
	cl    *client.Client
	files map[string][]byte // key -> bytes
	size  int64
}

func setup(t *testing.T) *env {
	t.Helper()
	s3 := s3test.Start("AKID", "secret")
	t.Cleanup(s3.Close)
	s3.CreateBucket("models")
	// A real safetensors file (unaligned), a second shard and a config.
	w := make([]byte, 1000*1003*2)
	for i := range w {
		w[i] = byte(i * 7)
	}
	st, err := safetensors.Build([]safetensors.Tensor{{Name: "w", DType: "BF16", Shape: []int64{1000, 1003}}, {Name: "b", DType: "U8", Shape: []int64{3}}},
		[][]byte{w, {1, 2, 3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	shard2 := bytes.Repeat([]byte("shard two "), 300_001)
	files := map[string][]byte{
		"org/m/model-00001.safetensors": st,
		"org/m/model-00002.safetensors": shard2,
		"org/m/config.json":             []byte(`{"architectures": ["LlamaForCausalLM"]}`),
	}
	e := &env{s3: s3, files: files}
	for k, v := range files {
		s3.Put("models", k, v)
		e.size += int64(len(v))
	}
	cc := cold.Config{Endpoint: s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1"}
	e.src, _ = cold.New(cc)
	e.c, err = cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), MemBytes: 64 << 20, DiskBytes: 256 << 20, Cold: &cc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.c.Close() })
	e.cl = e.c.Client()
	t.Cleanup(func() { e.cl.Close() })
	return e
}

func (e *env) check(t *testing.T, dir string) {
	t.Helper()
	for k, want := range e.files {
		f, err := e.cl.Open(context.Background(), dir+"/"+filepath.Base(k))
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s differs: %v", k, err)
		}
	}
}

func TestPullAndResume(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := &Puller{Client: e.cl, Source: e.src, PartSize: 256 << 10, Concurrency: 4, ChunkSize: 1 << 20}
	// Interrupt the first pull part-way through the big file.
	cctx, cancel := context.WithCancel(ctx)
	p.Progress = func(file string, done, total int64) {
		if done > 2<<20 && total > 2<<20 {
			cancel()
		}
	}
	if _, err := p.Pull(cctx, "s3://models/org/m", "/models/org/m"); err == nil {
		t.Fatal("interrupted pull reported success")
	}
	// The interrupted file is not complete: not sealed, no sha256.
	sts, _ := e.cl.Walk(ctx, "/models/org/m")
	partial := 0
	for _, fi := range sts {
		st, _ := e.cl.Stat(ctx, fi.Path)
		if !st.Sealed {
			partial++
			if st.Attrs["sha256"] != "" {
				t.Fatal("partial file has a sha256")
			}
		}
	}
	if partial < 1 { // the big file, and maybe one of the others pulled beside it
		t.Fatalf("%d partial files", partial)
	}
	cache := &Cache{Dir: t.TempDir()}
	if _, err := cache.Warmup(ctx, e.cl, "/models/org/m", "main", nil); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("warmup of a partial pull: %v", err)
	}
	// Resume: finishes, and fetches less than everything again.
	e.s3.ResetCounters()
	p.Progress = nil
	reps, err := p.Pull(ctx, "s3://models/org/m", "/models/org/m")
	if err != nil {
		t.Fatal(err)
	}
	resumed, skipped := int64(0), 0
	for _, r := range reps {
		resumed += r.Resumed
		if r.Skipped {
			skipped++
		}
		want := sha256.Sum256(e.files["org/"+filepath.Base(filepath.Dir(r.Path))+"/"+filepath.Base(r.Path)])
		if r.SHA256 != hex.EncodeToString(want[:]) {
			t.Fatalf("%s: sha256 %s", r.Path, r.SHA256)
		}
	}
	if resumed == 0 || skipped == 0 || e.s3.BytesSent() >= e.size {
		t.Fatalf("resume kept %d bytes, skipped %d files, fetched %d of %d", resumed, skipped, e.s3.BytesSent(), e.size)
	}
	e.check(t, "/models/org/m")
	// A third pull has nothing to do.
	e.s3.ResetCounters()
	if _, err := p.Pull(ctx, "s3://models/org/m", "/models/org/m"); err != nil || e.s3.BytesSent() != 0 {
		t.Fatalf("repeat pull fetched %d bytes: %v", e.s3.BytesSent(), err)
	}
}

func TestPullErrors(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := &Puller{Client: e.cl, Source: e.src}
	if _, err := p.Pull(ctx, "s3://nope/x", "/m"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("missing bucket: %v", err)
	}
	bad, _ := cold.New(cold.Config{Endpoint: e.s3.URL, AccessKey: "WRONG", SecretKey: "x", Region: "us-east-1"})
	if _, err := (&Puller{Client: e.cl, Source: bad}).Pull(ctx, "s3://models/org/m", "/m"); !errors.Is(err, errs.ErrUnauthorized) {
		t.Fatalf("wrong credentials: %v", err)
	}
	// S3 goes down for good mid-pull: a clear error, and nothing complete.
	flaky, _ := cold.New(cold.Config{Endpoint: e.s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1", Retries: 1})
	p = &Puller{Client: e.cl, Source: flaky, PartSize: 256 << 10, Concurrency: 2}
	p.Progress = func(file string, done, total int64) {
		if done > 1<<20 {
			e.s3.SetDown(true)
		}
	}
	_, err := p.Pull(ctx, "s3://models/org/m", "/down")
	e.s3.SetDown(false)
	if !errors.Is(err, errs.ErrUnavailable) {
		t.Fatalf("S3 down mid-pull: %v", err)
	}
	// Whatever is sealed is complete and right; the file cut off is open
	// (not complete) and has no sha256.
	open := 0
	for _, fi := range mustWalk(t, e.cl, "/down") {
		st, _ := e.cl.Stat(ctx, fi.Path)
		want := e.files["org/m/"+filepath.Base(fi.Path)]
		if !st.Sealed {
			open++
			if st.Attrs["sha256"] != "" {
				t.Fatalf("%s: cut off but has a sha256", fi.Path)
			}
			continue
		}
		f, _ := e.cl.Open(ctx, fi.Path)
		got := make([]byte, st.Size)
		f.ReadAt(got, 0)
		if !bytes.Equal(got, want) {
			t.Fatalf("%s sealed with wrong bytes after S3 went down", fi.Path)
		}
	}
	if open == 0 {
		t.Fatal("no file left open although S3 went down mid-pull")
	}
}

func mustWalk(t *testing.T, cl *client.Client, dir string) []client.FileInfo {
	fs, err := cl.Walk(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestStartupStorm: 8 loaders read the same linked model at once; S3 sends
// each byte once (1.0x the model size), not 8 times.
func TestStartupStorm(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := Link(ctx, e.cl, e.src, "s3://models/org/m", "/linked/org/m", client.LinkOptions{ChunkSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	e.s3.ResetCounters()
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	cold := make([]int64, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := e.c.Client()
			defer cl.Close()
			for k, want := range e.files {
				f, err := cl.Open(ctx, "/linked/org/m/"+filepath.Base(k))
				if err != nil {
					errc <- err
					return
				}
				var got bytes.Buffer
				if _, err := f.WriteTo(&got); err != nil || !bytes.Equal(got.Bytes(), want) {
					errc <- errors.Join(err, errors.New("loader read wrong bytes"))
					return
				}
			}
			cold[i] = cl.ReadStats().ColdFilled
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if got := e.s3.BytesSent(); got != e.size {
		t.Fatalf("8 loaders made S3 send %d bytes for a %d-byte model (%.2fx); want exactly 1.0x", got, e.size, float64(got)/float64(e.size))
	}
	var waited int64
	for _, c := range cold {
		waited += c
	}
	if waited < e.size {
		t.Fatalf("loaders saw %d cold-filled bytes, want at least the model size", waited)
	}
	// Later reads are served by the servers: S3 sends nothing more.
	e.check(t, "/linked/org/m")
	if e.s3.BytesSent() != e.size {
		t.Fatal("a warm read went to S3")
	}
}

func TestWarmupCache(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p := &Puller{Client: e.cl, Source: e.src}
	if _, err := p.Pull(ctx, "s3://models/org/m", "/models/org/m"); err != nil {
		t.Fatal(err)
	}
	Link(ctx, e.cl, e.src, "s3://models/org/m", "/models/org/linked", client.LinkOptions{})
	dir := t.TempDir()
	c := &Cache{Dir: dir, Quota: e.size + e.size/2}
	rep, err := c.Warmup(ctx, e.cl, "/models/org/m", "main", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Files != 3 || rep.LocalBytes != 0 || rep.Fetched != e.size {
		t.Fatalf("first warmup %+v", rep)
	}
	for k, want := range e.files {
		got, err := os.ReadFile(filepath.Join(rep.Snapshot, filepath.Base(k)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s in the snapshot: %v", k, err)
		}
	}
	if ref, _ := os.ReadFile(filepath.Join(dir, "models--org--m", "refs", "main")); string(ref) != rep.Rev {
		t.Fatalf("refs/main = %q, want %q", ref, rep.Rev)
	}
	if filepath.Base(filepath.Dir(rep.Snapshot)) != "snapshots" || filepath.Base(filepath.Dir(filepath.Dir(rep.Snapshot))) != "models--org--m" {
		t.Fatalf("snapshot not in the Hugging Face layout: %s", rep.Snapshot)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "models--org--m", "blobs", ".partial-*")); len(m) != 0 {
		t.Fatalf("leftover partial blobs %v", m)
	}
	again, err := c.Warmup(ctx, e.cl, "/models/org/m", "main", nil)
	if err != nil || again.LocalBytes != e.size || again.Fetched != 0 || again.Rev != rep.Rev {
		t.Fatalf("second warmup %+v %v", again, err)
	}
	// Keep a blob open, as a model server would: the quota may not evict it.
	held, err := os.Open(filepath.Join(rep.Snapshot, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Warmup(ctx, e.cl, "/models/org/linked", "main", nil)
	if !errors.Is(err, errs.ErrNoSpace) {
		t.Fatalf("quota with the only other model in use: %v", err)
	}
	held.Close()
	rep2, err := c.Warmup(ctx, e.cl, "/models/org/linked", "main", nil)
	if err != nil || len(rep2.Evicted) != 1 || rep2.Evicted[0] != "models--org--m" {
		t.Fatalf("LRU eviction: %+v %v", rep2, err)
	}
	// The linked file's sha256 was recorded on the way.
	st, _ := e.cl.Stat(ctx, "/models/org/linked/config.json")
	if st.Attrs["sha256"] == "" {
		t.Fatal("warmup did not record the sha256 of a linked file")
	}
	ms, _ := c.List()
	if len(ms) != 1 || ms[0].Name != "models--org--linked" {
		t.Fatalf("cache ls %+v", ms)
	}
	if err := c.Remove("org/linked", false); err != nil {
		t.Fatal(err)
	}
}

// TestWarmupResumesPartial: a warmup killed after a checkpoint (and after
// writing bytes its record does not cover) resumes from the record, drops
// the torn tail, and publishes exactly the file's bytes; a second process
// warming the same blob at once downloads privately.
func TestWarmupResumesPartial(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := (&Puller{Client: e.cl, Source: e.src}).Pull(ctx, "s3://models/org/m", "/models/org/m"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	blobs := filepath.Join(dir, "models--org--m", "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	want := e.files["org/m/model-00002.safetensors"]
	st, err := e.cl.Stat(ctx, "/models/org/m/model-00002.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	p, err := openPartial(blobs, st)
	if err != nil || !p.shared || p.done != 0 {
		t.Fatalf("first open: %+v %v", p, err)
	}
	if q, err := openPartial(blobs, st); err != nil || q.shared {
		t.Fatalf("a second download of a locked partial must be private: %+v %v", q, err)
	} else {
		q.close()
	}
	if _, err := p.Write(want[:1<<20]); err != nil {
		t.Fatal(err)
	}
	if err := p.checkpoint(); err != nil {
		t.Fatal(err)
	}
	p.f.Write([]byte("bytes written after the last checkpoint, then SIGKILL"))
	p.f.Close() // no close(): the process died

	rep, err := (&Cache{Dir: dir}).Warmup(ctx, e.cl, "/models/org/m", "main", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Resumed != 1<<20 {
		t.Fatalf("resumed %d bytes, want %d", rep.Resumed, 1<<20)
	}
	for k, w := range e.files {
		got, err := os.ReadFile(filepath.Join(rep.Snapshot, filepath.Base(k)))
		if err != nil || !bytes.Equal(got, w) {
			t.Fatalf("%s in the snapshot differs after a resume: %v", k, err)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(blobs, ".partial-*")); len(m) != 0 {
		t.Fatalf("partial downloads left: %v", m)
	}
}

// TestWarmupAfterServerLoss: the server caching chunks of a linked model is
// closed after the model was read once; a warmup (the warm tier read through
// the SDK) still succeeds: its chunks are re-placed and refilled from S3,
// each once.
func TestWarmupAfterServerLoss(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	if _, err := Link(ctx, e.cl, e.src, "s3://models/org/m", "/linked/org/m", client.LinkOptions{ChunkSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	e.check(t, "/linked/org/m") // every chunk filled once
	st, err := e.cl.Stat(ctx, "/linked/org/m/model-00002.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	victim := st.Chunks[0].Replicas[0].Server
	var lost int64
	for _, fi := range mustWalk(t, e.cl, "/linked/org/m") {
		st, _ := e.cl.Stat(ctx, fi.Path)
		for _, c := range st.Chunks {
			if c.Replicas[0].Server == victim {
				lost += c.Length
			}
		}
	}
	for _, s := range e.c.Servers {
		if s.ID() == victim {
			s.Close()
		}
	}
	e.s3.ResetCounters()
	cl := e.c.Client()
	defer cl.Close()
	rep, err := (&Cache{Dir: t.TempDir()}).Warmup(ctx, cl, "/linked/org/m", "main", nil)
	if err != nil {
		t.Fatalf("warmup after %s closed: %v", victim, err)
	}
	for k, want := range e.files {
		got, err := os.ReadFile(filepath.Join(rep.Snapshot, filepath.Base(k)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s differs: %v", k, err)
		}
	}
	if rs := cl.ReadStats(); rs.Refills == 0 || e.s3.BytesSent() != lost {
		t.Fatalf("refills %d, S3 sent %d bytes, want the %d bytes %s held, once", rs.Refills, e.s3.BytesSent(), lost, victim)
	}
}

// TestPartialOfAnotherFileNotResumed: a file removed and written again at
// the same path, with the same size and modification time (a clock's
// resolution, a copy that keeps times), is another file: its download must
// not resume from the bytes of the first one's partial download.
func TestPartialOfAnotherFileNotResumed(t *testing.T) {
	blobs := t.TempDir()
	first := client.FileInfo{ID: 7, Path: "/models/org/m/model.safetensors", Size: 4 << 20, Modified: time.Unix(1700000000, 0)}
	p, err := openPartial(blobs, first)
	if err != nil || !p.shared {
		t.Fatalf("open: %+v %v", p, err)
	}
	if _, err := p.Write(bytes.Repeat([]byte("A"), 1<<20)); err != nil {
		t.Fatal(err)
	}
	p.close() // kept, with its record, for the next warmup of the same file
	again, err := openPartial(blobs, first)
	if err != nil || again.done != 1<<20 {
		t.Fatalf("the same file must resume its partial download: done %d, %v", again.done, err)
	}
	again.close()

	second := first
	second.ID = 8
	q, err := openPartial(blobs, second)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	if q.done != 0 {
		t.Fatalf("a new file at the same path resumed %d bytes of the old file's download", q.done)
	}
}
