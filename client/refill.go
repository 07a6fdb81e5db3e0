package client

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
)

// Reads of linked files survive the loss of the server caching a chunk: S3
// holds every byte, so when no replica of a linked chunk answers, the reader
// asks the master to re-place the chunk (POST /v1/refill, docs/api.md). The
// master moves it onto a live server and answers the new map; that server
// fills the chunk from S3 on the first read (once, however many readers ask:
// its per-chunk singleflight, and the master answers every reader the same
// move). The reader retries with backoff until DefaultRefillWait
// (Config.RefillWait) has passed, which covers the master noticing a dead
// server and a new one joining.

// DefaultRefillWait is how long a read of a linked chunk keeps trying.
const DefaultRefillWait = 30 * time.Second

// Backoff between refill attempts: doubling from refillBackoffMin up to
// refillBackoffMax.
const (
	refillBackoffMin = 50 * time.Millisecond
	refillBackoffMax = 2 * time.Second
)

// linked: a sealed file with an S3 source (linked, or pulled and complete),
// whose chunks any server can fill again from S3.
func (f *File) linked() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.info.Attrs["source"] != "" && f.info.Sealed
}

// readRefilled reads dst at off of chunk c, whose replicas all failed with
// first, by asking the master to re-place the chunk and retrying.
func (f *File) readRefilled(ctx context.Context, c api.Chunk, spread int, off int64, dst []byte, first error) error {
	deadline := time.Now().Add(f.c.cfg.RefillWait)
	wait := refillBackoffMin
	last := first
	for {
		failed := make([]string, 0, len(c.Replicas))
		for _, r := range c.Replicas {
			failed = append(failed, r.Server)
		}
		var got api.Chunks
		err := f.c.call(ctx, "POST", "/v1/refill", f.info.Path, api.RefillRequest{Index: c.Index, Failed: failed}, &got)
		switch {
		case err == nil && len(got.Chunks) == 1 && got.Chunks[0].Index == c.Index && got.Chunks[0].ID != c.ID:
			// The name is another file's now (renamed or replaced since
			// the open): its chunk would read its bytes as ours.
			return errs.New(errs.ErrNotFound, "%s was replaced or renamed since it was opened: open it again", f.info.Path)
		case err == nil && len(got.Chunks) == 1 && got.Chunks[0].Index == c.Index:
			nc := got.Chunks[0]
			nc.Length = max(nc.Length, c.Length)
			if !sameServers(c, nc) {
				f.c.refills.Add(1)
			}
			f.mu.Lock()
			f.chunks[c.Index] = nc
			f.mu.Unlock()
			c = nc
			if err = f.readReplicas(ctx, c, spread, off, dst); err == nil {
				return nil
			}
			if !errors.Is(err, errs.ErrUnavailable) || noS3(err) {
				return err
			}
			last = err
		case err == nil:
			return errs.New(errs.ErrInternal, "%s: the master answered a refill of chunk %d with %d chunks", f.info.Path, c.Index, len(got.Chunks))
		case errors.Is(err, errs.ErrUnavailable):
			last = err // no live server yet, or no leader: wait
		default:
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().Add(wait).After(deadline) {
			return errs.New(errs.ErrUnavailable, "%s: chunk %d still unavailable after %s of re-placing and retrying (the wait is Config.RefillWait): %w",
				f.info.Path, c.Index, f.c.cfg.RefillWait, last)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, refillBackoffMax)
	}
}

// noS3 tells the error of a server that has no S3 configuration for
// linked files (internal/server/cold.go). Only the kind crosses the wire,
// so the message is what says it.
func noS3(err error) bool {
	return err != nil && strings.Contains(err.Error(), "has no S3 configuration")
}

func sameServers(a, b api.Chunk) bool {
	ids := func(c api.Chunk) []string {
		var out []string
		for _, r := range c.Replicas {
			out = append(out, r.Server)
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(ids(a), ids(b))
}
