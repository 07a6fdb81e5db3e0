package master

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/meta"
)

// Refill after failure (docs/api.md, POST /v1/refill): S3 holds every byte of
// a linked file, so losing the server that caches one of its chunks must
// cost a refill, never an error. A reader whose replicas of a linked chunk
// did not answer asks here; the master moves the chunk onto a live server
// (which fills it from S3 on the first read, once, with its singleflight),
// records the move in meta (the old server gets a tombstone, so it deletes
// its copy when it comes back) and answers the chunk's new map.
//
// Many readers ask at once after a server dies. refillMu serialises the
// decisions and every request first looks whether a live replica the asker
// has not tried is there already: the first request moves the chunk and
// every later one answers that move, so all readers converge on one server
// and S3 is read once more per chunk, not once per reader.

// probeTimeout bounds the master's own check of a server a reader reports
// failed while its heartbeats still say it is up (SIGKILLed a moment ago,
// or stopped). probeMemory is how long a failed probe is believed, so a dead
// server holding many chunks costs one probe, not one per chunk.
const (
	probeTimeout = 2 * time.Second
	probeMemory  = 5 * time.Second
)

// maxRefillFailed bounds the failed list of a request (a chunk has a few replicas).
const maxRefillFailed = 64

type refiller struct {
	mu     sync.Mutex           // serialises re-placements (see above)
	probed map[string]time.Time // server id -> when its probe failed
}

func (m *Master) refillRoute(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.RefillRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	if len(req.Failed) > maxRefillFailed {
		return nil, errs.New(errs.ErrTooLarge, "refill: at most %d failed servers", maxRefillFailed)
	}
	c, err := m.refill(r.Context(), p, req.Index, req.Failed)
	if err != nil {
		return nil, err
	}
	return api.Chunks{Chunks: []api.Chunk{c}}, nil
}

// refill re-places chunk idx of the linked file p off the servers in failed
// that are down or do not answer, and returns its map.
func (m *Master) refill(ctx context.Context, p string, idx int64, failed []string) (api.Chunk, error) {
	f, err := m.meta.File(ctx, p)
	if err != nil {
		return api.Chunk{}, err
	}
	attrs, err := m.meta.Attrs(ctx, p)
	if err != nil {
		return api.Chunk{}, err
	}
	if attrs["source"] == "" || !f.Sealed {
		// Sealed too: a pull in progress records its source before its
		// bytes are in, and a chunk it is still writing must not be filled
		// from S3 (and sealed) elsewhere.
		return api.Chunk{}, errs.New(errs.ErrBadRequest, "%s is not a complete linked (or pulled) file: only chunks of sealed files with an S3 source are re-placed and refilled from S3; an HA chunk is re-replicated by the master, a perf chunk is back when its server is", p)
	}
	m.refills.mu.Lock()
	defer m.refills.mu.Unlock()
	c, err := m.chunkAt(ctx, f.ID, idx, p)
	if err != nil {
		return api.Chunk{}, err
	}
	bad := map[string]bool{}
	for _, id := range failed {
		bad[id] = true
	}
	// Idempotent: a replica the reader has not tried (a move made for
	// another reader, or a map newer than the reader's) is the answer, even
	// one the master believes down: the reader tries it and reports it if
	// it fails. Moving it on the master's word alone would move chunks off
	// a live server whose heartbeats are late on a loaded machine.
	for _, id := range c.Replicas {
		if !bad[id] {
			return m.chunksOut([]meta.Chunk{c})[0], nil
		}
	}
	// Every replica failed the reader. Which are gone: down at the master,
	// or not answering the master's probe either.
	var gone []string
	for _, id := range c.Replicas {
		if !m.isServing(id) || !m.probe(ctx, id, c.ID) {
			gone = append(gone, id)
		}
	}
	if len(gone) == 0 {
		// Every replica answers the master: the reader's trouble was
		// passing (or its own network's); it retries the same servers.
		return m.chunksOut([]meta.Chunk{c})[0], nil
	}
	if m.warming() {
		return api.Chunk{}, m.errWarming() // a new leader has not heard every server yet: retry
	}
	skip := map[string]bool{}
	for _, id := range c.Replicas {
		skip[id] = true
	}
	for id := range bad {
		skip[id] = true
	}
	moved := 0
	for _, old := range gone {
		to, err := m.placeExcept(f.ID, idx, 1, c.Length, skip)
		if err != nil {
			if moved > 0 {
				break // some replica moved: the reader has a server to try
			}
			m.metrics.refills.WithLabelValues("no_server").Inc()
			return api.Chunk{}, errs.New(errs.ErrUnavailable, "%s: chunk %d cannot be refilled: its server(s) %s are down and no other live server has %d bytes free (%v): start a data server (gd2fs server) or bring one back; the chunk then fills from S3 on its next read",
				p, idx, strings.Join(gone, ", "), c.Length, err)
		}
		if err := m.meta.ReplaceReplica(ctx, c.ID, old, to[0]); err != nil {
			m.metrics.refills.WithLabelValues("failed").Inc()
			return api.Chunk{}, err
		}
		skip[to[0]] = true
		moved++
		m.metrics.refills.WithLabelValues("ok").Inc()
		m.log.Info("linked chunk re-placed after its server failed; it refills from S3 on its next read",
			"path", p, "chunk", idx, "id", c.ID, "from", old, "to", to[0])
	}
	if c, err = m.chunkAt(ctx, f.ID, idx, p); err != nil {
		return api.Chunk{}, err
	}
	return m.chunksOut([]meta.Chunk{c})[0], nil
}

func (m *Master) chunkAt(ctx context.Context, fileID, idx int64, p string) (meta.Chunk, error) {
	cs, err := m.meta.Chunks(ctx, fileID)
	if err != nil {
		return meta.Chunk{}, err
	}
	i := sort.Search(len(cs), func(i int) bool { return cs[i].Index >= idx })
	if i == len(cs) || cs[i].Index != idx {
		return meta.Chunk{}, errs.New(errs.ErrOutOfRange, "%s has no chunk %d (it has %d)", p, idx, len(cs))
	}
	return cs[i], nil
}

func (m *Master) isServing(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.servers[id]
	return s != nil && s.serving()
}

// probe asks server id about chunk: any answer from the server itself (the
// chunk's length, or "no such chunk") means it is alive; no connection or
// no answer within probeTimeout means it is not. Called with refills.mu held.
func (m *Master) probe(ctx context.Context, id string, chunk uint64) bool {
	if t, ok := m.refills.probed[id]; ok && time.Since(t) < probeMemory {
		return false
	}
	m.mu.Lock()
	var addr string
	if s := m.servers[id]; s != nil {
		addr = s.info.Addr
	}
	m.mu.Unlock()
	if addr == "" {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, _, err := m.peers.StatChunk(pctx, addr, chunk)
	if err == nil || errors.Is(err, errs.ErrNotFound) {
		delete(m.refills.probed, id)
		return true
	}
	m.log.Warn("server does not answer the master's probe; its linked chunks move", "id", id, "addr", addr, "err", fmt.Sprint(err))
	m.refills.probed[id] = time.Now()
	return false
}
