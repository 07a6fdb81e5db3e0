// Package weights moves model weights through the three tiers (DESIGN.md §7):
// cold (an S3-compatible store), warm (the cluster's servers) and hot (a
// local cache folder laid out like the Hugging Face cache, which vLLM and
// PyTorch load as-is).
package weights

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cold"
)

// Progress is told how far each file is.
type Progress func(file string, done, total int64)

// Puller imports objects from S3 into gd2fs.
type Puller struct {
	Client      *client.Client
	Source      *cold.Source
	Concurrency int   // parallel range GETs per file (default 8)
	Files       int   // files pulled at once (default 4)
	PartSize    int64 // bytes per range GET (default 8 MiB)
	Pool        string
	ChunkSize   int64
	Progress    Progress
}

// FileReport says what happened to one file.
type FileReport struct {
	Path    string
	Size    int64
	SHA256  string
	Skipped bool  // already complete
	Resumed int64 // bytes kept from an interrupted pull
}

// objects lists the objects under an s3:// prefix, with their paths
// relative to it.
func objects(ctx context.Context, src *cold.Source, uri string) (bucket, prefix string, objs []cold.Object, err error) {
	bucket, prefix, err = cold.ParseURI(uri)
	if err != nil {
		return "", "", nil, err
	}
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	objs, err = src.List(ctx, bucket, prefix)
	if err == nil && len(objs) == 0 {
		err = errs.New(errs.ErrNotFound, "nothing under %s", uri)
	}
	return bucket, prefix, objs, err
}

// Pull copies every object under s3uri into the gd2fs directory dst with
// parallel range GETs, recording each file's sha256. An interrupted pull
// resumes: complete files are skipped, partial ones continue from the bytes
// they hold. A file is sealed only when every byte is in; until then it is
// open (not complete) and has no sha256.
func (p *Puller) Pull(ctx context.Context, s3uri, dst string) ([]FileReport, error) {
	bucket, prefix, objs, err := objects(ctx, p.Source, s3uri)
	if err != nil {
		return nil, err
	}
	par := p.Files
	if par <= 0 {
		par = 4
	}
	out := make([]FileReport, len(objs))
	errs := make([]error, len(objs))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i, o := range objs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			rel := strings.TrimPrefix(o.Key, prefix)
			out[i], errs[i] = p.pullOne(ctx, bucket, o, path.Join(dst, rel))
			if errs[i] != nil {
				errs[i] = fmt.Errorf("pull s3://%s/%s: %w (run the same pull again to resume)", bucket, o.Key, errs[i])
			}
		}()
	}
	wg.Wait()
	var done []FileReport
	var first error
	for i := range objs {
		if errs[i] == nil {
			done = append(done, out[i])
		} else if first == nil {
			first = errs[i]
		}
	}
	return done, first
}

func (p *Puller) pullOne(ctx context.Context, bucket string, o cold.Object, dst string) (FileReport, error) {
	rep := FileReport{Path: dst, Size: o.Size}
	source := "s3://" + bucket + "/" + o.Key
	var f *client.File
	if st, err := p.Client.Stat(ctx, dst); err == nil {
		same := st.Attrs["source"] == source && st.Attrs["etag"] == o.ETag
		// An empty open file with no identity is a pull interrupted between
		// creating the file and recording what it pulls: nothing to lose.
		adopt := !st.Sealed && st.Size == 0 && st.Attrs["source"] == "" && st.Attrs["etag"] == ""
		switch {
		case adopt:
			if err := p.setIdentity(ctx, dst, source, o.ETag); err != nil {
				return rep, err
			}
			if f, err = p.Client.Open(ctx, dst); err != nil {
				return rep, err
			}
		case same && st.Sealed && st.Size == o.Size && st.Attrs["sha256"] != "":
			rep.Skipped, rep.SHA256 = true, st.Attrs["sha256"]
			if p.Progress != nil {
				p.Progress(dst, o.Size, o.Size)
			}
			return rep, nil
		case same && st.Sealed && st.Size == o.Size:
			// Sealed, but stopped before its sha256 was recorded: hash it.
			g, err := p.Client.Open(ctx, dst)
			if err != nil {
				return rep, err
			}
			h := sha256.New()
			if err := hashPrefix(ctx, g, st.Size, h); err != nil {
				return rep, err
			}
			rep.Skipped, rep.SHA256 = true, hex.EncodeToString(h.Sum(nil))
			return rep, p.setAttrs(ctx, dst, map[string]string{"sha256": rep.SHA256})
		case same && !st.Sealed:
			if f, err = p.Client.Open(ctx, dst); err != nil {
				return rep, err
			}
		default:
			return rep, errs.New(errs.ErrExists, "%s exists and is not this object: remove it or pull elsewhere", dst)
		}
	} else if !errors.Is(err, errs.ErrNotFound) {
		return rep, err
	}
	if f == nil {
		var err error
		if f, err = p.Client.Create(ctx, dst, client.CreateOptions{Pool: p.Pool, ChunkSize: p.ChunkSize}); err != nil {
			return rep, err
		}
		// Identity first, so an interrupted pull knows what it was pulling.
		if err := p.setIdentity(ctx, dst, source, o.ETag); err != nil {
			return rep, err
		}
	}
	h := sha256.New()
	part := p.PartSize
	if part <= 0 {
		part = 8 << 20
	}
	// Keep what an interrupted pull committed (whole parts it wrote before
	// it stopped, however it stopped), hashing it again from the servers.
	from := f.Size()
	if from > 0 {
		if err := hashPrefix(ctx, f, from, h); err != nil {
			return rep, err
		}
		rep.Resumed = from
	}
	if err := p.fetch(ctx, bucket, o, f, from, part, h); err != nil {
		f.Sync(context.Background()) // keep what is in for the resume
		return rep, err
	}
	rep.SHA256 = hex.EncodeToString(h.Sum(nil))
	// Seal, not Close: the committer synced every part, so this handle may
	// have nothing unsynced, and Close seals only what is.
	if err := f.Seal(ctx); err != nil {
		return rep, err
	}
	return rep, p.setAttrs(ctx, dst, map[string]string{"sha256": rep.SHA256})
}

// setIdentity records what dst is pulled from. It is not cut short by a
// cancelled pull: a file created must say what it holds, or the next pull
// cannot resume it.
func (p *Puller) setIdentity(ctx context.Context, dst, source, etag string) error {
	return p.setAttrs(ctx, dst, map[string]string{"source": source, "etag": etag})
}

// setAttrs sets attributes that must follow what was already done to the
// file (its creation, its sealing), even when the pull is being cancelled.
func (p *Puller) setAttrs(ctx context.Context, dst string, attrs map[string]string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return p.Client.SetAttrs(ctx, dst, attrs)
}

func hashPrefix(ctx context.Context, f *client.File, n int64, h hash.Hash) error {
	buf := make([]byte, 16<<20)
	for off := int64(0); off < n; {
		k := min(int64(len(buf)), n-off)
		if _, err := f.ReadAtContext(ctx, buf[:k], off); err != nil {
			return fmt.Errorf("re-read the pulled prefix: %w", err)
		}
		h.Write(buf[:k])
		off += k
	}
	return nil
}

// fetch GETs parts [from, size) in parallel and writes and hashes them in
// order. Progress is committed as it goes (see committer), so a pull killed
// at any moment loses only the parts in flight: the next pull keeps every
// byte the master has as committed, because a commit covers only parts
// whose writes the servers acknowledged.
func (p *Puller) fetch(ctx context.Context, bucket string, o cold.Object, f *client.File, from, part int64, h hash.Hash) error {
	conc := p.Concurrency
	if conc <= 0 {
		conc = 8
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		off int64
		buf []byte
		err error
	}
	nparts := (o.Size - from + part - 1) / part
	results := make([]chan result, nparts)
	for i := range results {
		results[i] = make(chan result, 1)
	}
	free := make(chan []byte, conc+2)
	for i := 0; i < conc+2; i++ {
		free <- make([]byte, part)
	}
	next := make(chan int64)
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				// Take a buffer before a part: the part the writer waits
				// for then always has one, so buffers held by later parts
				// can never starve it.
				var buf []byte
				select {
				case buf = <-free:
				case <-ctx.Done():
					return
				}
				i, ok := <-next
				if !ok {
					return
				}
				off := from + i*part
				buf = buf[:min(part, o.Size-off)]
				err := p.Source.ReadRangeETag(ctx, bucket, o.Key, o.ETag, off, buf)
				results[i] <- result{off: off, buf: buf, err: err}
			}
		}()
	}
	go func() {
		defer close(next)
		for i := int64(0); i < nparts; i++ {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer wg.Wait()
	cm := startCommitter(ctx, f)
	defer cm.stop()
	done := from
	for i := int64(0); i < nparts; i++ {
		var r result
		select {
		case r = <-results[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
		if r.err != nil {
			cancel()
			return r.err
		}
		if _, err := f.WriteAtContext(ctx, r.buf, r.off); err != nil {
			cancel()
			return err
		}
		h.Write(r.buf)
		done += int64(len(r.buf))
		free <- r.buf[:cap(r.buf)]
		if err := cm.written(); err != nil {
			cancel()
			return err
		}
		if p.Progress != nil {
			p.Progress(f.Name(), done, o.Size)
		}
	}
	return cm.stop()
}

// committer records a pull's progress at the master (client.File.Sync:
// size and chunk lengths) in the background, one commit at a time, each
// covering every part written before it started. The committed size thus
// trails the written bytes by at most the parts written during one commit
// (a few milliseconds), without a round trip to the master per part on the
// data path. A commit only ever covers bytes the servers acknowledged: Sync
// sends what WriteAt recorded after its writes returned.
type committer struct {
	f    *client.File
	ctx  context.Context
	kick chan struct{}
	done chan struct{}
	once sync.Once
	mu   sync.Mutex
	err  error
}

func startCommitter(ctx context.Context, f *client.File) *committer {
	c := &committer{f: f, ctx: ctx, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go c.loop()
	return c
}

func (c *committer) loop() {
	defer close(c.done)
	for range c.kick {
		if err := c.f.Sync(c.ctx); err != nil {
			c.mu.Lock()
			if c.err == nil {
				c.err = err
			}
			c.mu.Unlock()
		}
	}
}

// written says a part was written; it returns a failed commit's error.
func (c *committer) written() error {
	select {
	case c.kick <- struct{}{}:
	default: // a commit is pending: it will cover this part too
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// stop waits for the last commit and returns the first error.
func (c *committer) stop() error {
	c.once.Do(func() { close(c.kick) })
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// LinkedAttr marks a file that model link made (its bytes stay in S3).
const LinkedAttr = "linked"

// Link registers every object under s3uri as a linked file under dst: no
// bytes move; servers fill chunks from S3 on first read.
func Link(ctx context.Context, c *client.Client, src *cold.Source, s3uri, dst string, o client.LinkOptions) ([]client.FileInfo, error) {
	bucket, prefix, objs, err := objects(ctx, src, s3uri)
	if err != nil {
		return nil, err
	}
	var out []client.FileInfo
	for _, ob := range objs {
		fi, err := c.Link(ctx, path.Join(dst, strings.TrimPrefix(ob.Key, prefix)), "s3://"+bucket+"/"+ob.Key, ob.Size, ob.ETag, o)
		if err != nil {
			return out, err
		}
		// Marked so the console and model inspect can tell it from a
		// pulled file, which has the same source and, once checked, sha256.
		if err := c.SetAttrs(ctx, fi.Path, map[string]string{LinkedAttr: "s3"}); err != nil {
			return out, err
		}
		out = append(out, fi)
	}
	return out, nil
}
