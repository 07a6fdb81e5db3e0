package master

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/meta"
)

// What was written is the servers' word (docs/kv-cache.md, "What the master
// checks"). Before a session commit records ranges as KV, the master asks
// every replica of every chunk under them which of those bytes some write
// covered (OpExtents, one parallel round trip), and refuses a range with a
// hole: a hole reads as zeros with a valid CRC, which an engine would load
// as KV — wrong bytes served as a hit. Every replica must hold every byte,
// as a replicated write is acknowledged only when every replica stored it.
// Before a file commit grows a chunk, the master asks the replicas that the
// chunk reaches that far (issue 22 finding 15).
//
// The asking happens before the commit's transaction (a round trip inside
// it would hold up every plan and commit of its group); the commit then
// checks, after its own rules, that the ranges it records are ones the
// servers vouched for (meta.CommitInput.Held). Bytes once written stay
// written until their file is removed, which also ends the plan.

// heldTimeout bounds asking the servers.
const heldTimeout = 10 * time.Second

// heldFile is what the servers hold of bytes [start, end) of one file.
type heldFile struct {
	path       string
	start, end int64
	chunkSize  int64
	chunks     map[int64]*heldChunk // by index; absent: never allocated
	err        error                // the file or a replica could not be read
}

// heldChunk is one chunk's replicas and what each holds of the range asked,
// in chunk coordinates (flat pairs).
type heldChunk struct {
	index   int64
	id      uint64
	servers []string
	ext     [][]int64
}

// askHeld asks the servers what they hold of each range, in parallel, with
// the file's chunks as the store has them now. Ranges of one file that reach
// a common chunk are asked as one span, so each chunk's replicas are asked
// once however many segments lie in it (heldHook finds a range in the span
// that holds it). A span whose file is gone comes back with its error.
func (m *Master) askHeld(ctx context.Context, rs []meta.Range) []*heldFile {
	var out []*heldFile
	type placed struct {
		f  meta.File
		cs []meta.Chunk
	}
	files := map[string]placed{}
	for _, span := range spans(rs, func(path string) int64 {
		pl, ok := files[path]
		if !ok {
			if f, cs, ok := m.memChunks(path, rs); ok {
				files[path] = placed{f, cs}
				return f.ChunkSize
			}
			f, err := m.meta.File(ctx, path)
			var cs []meta.Chunk
			if err == nil {
				cs, err = m.meta.Chunks(ctx, f.ID)
			}
			if err != nil {
				out = append(out, &heldFile{path: path, start: math.MinInt64, end: math.MaxInt64, err: err})
				return 0
			}
			pl = placed{f, cs}
			files[path] = pl
		}
		return pl.f.ChunkSize
	}) {
		pl := files[span.Path]
		out = append(out, newHeldFile(span, pl.f.ChunkSize, pl.cs))
	}
	m.askChunks(ctx, out)
	return out
}

// memChunks is the session file at path and its chunks as the leader's
// memory holds them (meta.MemSyncer), when they cover every chunk the
// ranges of rs in that file reach: what askHeld needs (each chunk's id and
// servers) without File and Chunks, which in window mode first wait for
// the leader's whole log — a flush forced by each engine commit. ok false:
// read SQL (memory may hold fewer chunks than SQL).
func (m *Master) memChunks(path string, rs []meta.Range) (meta.File, []meta.Chunk, bool) {
	ms, ok := m.meta.(meta.MemSyncer)
	if !ok {
		return meta.File{}, nil, false
	}
	f, cs, ok := ms.MemFile(path)
	if !ok || f.ChunkSize <= 0 {
		return meta.File{}, nil, false
	}
	for _, r := range rs {
		if r.Path != path || !goodRange(r) {
			continue
		}
		first, last := r.KVStart/f.ChunkSize, (r.KVStart+r.KVLength-1)/f.ChunkSize
		if last-first >= int64(len(cs)) {
			return meta.File{}, nil, false // more chunks than memory holds (and no loop over a huge range)
		}
		for idx := first; idx <= last; idx++ {
			if _, ok := meta.FindChunk(cs, idx); !ok {
				return meta.File{}, nil, false
			}
		}
	}
	return f, cs, true
}

// spans merges the ranges of each file that reach a common chunk
// (chunkSize gives a file's chunk size; 0: the file could not be read, its
// ranges are dropped), so no chunk is in two spans.
func spans(rs []meta.Range, chunkSize func(path string) int64) []meta.Range {
	byPath := map[string][]meta.Range{}
	var paths []string
	for _, r := range rs {
		if _, ok := byPath[r.Path]; !ok {
			paths = append(paths, r.Path)
		}
		byPath[r.Path] = append(byPath[r.Path], r)
	}
	var out []meta.Range
	for _, p := range paths {
		cs := chunkSize(p)
		if cs <= 0 {
			continue
		}
		rs := byPath[p]
		slices.SortFunc(rs, func(a, b meta.Range) int { return cmp.Compare(a.KVStart, b.KVStart) })
		cur := meta.Range{Path: p, KVStart: rs[0].KVStart, KVLength: rs[0].KVLength}
		for _, r := range rs[1:] {
			end := cur.KVStart + cur.KVLength
			if goodRange(cur) && goodRange(r) && r.KVStart/cs <= (end-1)/cs {
				cur.KVLength = max(end, r.KVStart+r.KVLength) - cur.KVStart
				continue
			}
			out = append(out, cur)
			cur = meta.Range{Path: p, KVStart: r.KVStart, KVLength: r.KVLength}
		}
		out = append(out, cur)
	}
	return out
}

// goodRange says r's bytes are a range newHeldFile takes; the others keep
// spans of their own, which newHeldFile refuses.
func goodRange(r meta.Range) bool {
	return r.KVStart >= 0 && r.KVLength > 0 && r.KVStart <= math.MaxInt64-r.KVLength
}

// heldParallel bounds the questions askChunks has in flight at once.
const heldParallel = 64

// newHeldFile is what to ask about range r of a file of chunks cs.
func newHeldFile(r meta.Range, chunkSize int64, cs []meta.Chunk) *heldFile {
	h := &heldFile{path: r.Path, start: r.KVStart, end: r.KVStart + r.KVLength, chunkSize: chunkSize, chunks: map[int64]*heldChunk{}}
	if chunkSize <= 0 || h.start < 0 || h.end <= h.start {
		h.err = errs.New(errs.ErrBadRequest, "%s bytes %d to %d: no such range", r.Path, h.start, h.end)
		return h
	}
	first, last := h.start/chunkSize, (h.end-1)/chunkSize
	for _, c := range cs {
		if c.Index >= first && c.Index <= last {
			h.chunks[c.Index] = &heldChunk{index: c.Index, id: c.ID, servers: c.Replicas, ext: make([][]int64, len(c.Replicas))}
		}
	}
	return h
}

// askChunks asks every replica of every chunk of hs in parallel, at most
// heldParallel at once.
func (m *Master) askChunks(ctx context.Context, hs []*heldFile) {
	ctx, cancel := context.WithTimeout(ctx, heldTimeout)
	defer cancel()
	sem := make(chan struct{}, heldParallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	fail := func(h *heldFile, err error) {
		mu.Lock()
		if h.err == nil {
			h.err = err
		}
		mu.Unlock()
	}
	for _, h := range hs {
		if h.err != nil {
			continue
		}
		for _, hc := range h.chunks {
			cs := hc.index * h.chunkSize
			from, to := max(h.start, cs)-cs, min(h.end, cs+h.chunkSize)-cs
			for k, sv := range hc.servers {
				addr, ok := m.serverAddr(sv)
				if !ok {
					fail(h, errs.New(errs.ErrUnavailable, "chunk %d of %s is on server %s, which this master does not know (yet): retry the commit", hc.index, h.path, sv))
					continue
				}
				m.metrics.heldAsks.Inc()
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-sem; wg.Done() }()
					ext, err := m.replicaHeld(ctx, addr, hc.id, from, to)
					if err != nil {
						fail(h, errs.New(errs.ErrUnavailable, "could not ask server %s (%s) what it holds of chunk %d of %s: %v; retry the commit", sv, addr, hc.index, h.path, err))
						return
					}
					hc.ext[k] = ext
				}()
			}
		}
	}
	wg.Wait()
}

// replicaHeld is what server addr holds of [from, to) of chunk id. A server
// that does not hold the chunk holds none of it; one too old to answer
// OpExtents is taken at its chunk's length (the check before extents).
func (m *Master) replicaHeld(ctx context.Context, addr string, id uint64, from, to int64) ([]int64, error) {
	ext, _, _, err := m.peers.ChunkExtents(ctx, addr, id, from, to-from)
	switch {
	case errors.Is(err, errs.ErrNotFound):
		return nil, nil
	case errors.Is(err, errs.ErrUnknownOp):
		n, _, err := m.peers.StatChunk(ctx, addr, id)
		if err != nil || min(n, to) <= from {
			return nil, err
		}
		return []int64{from, min(n, to)}, nil
	}
	return ext, err
}

func (m *Master) serverAddr(id string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.servers[id]
	if s == nil || s.info.Addr == "" {
		return "", false
	}
	return s.info.Addr, true
}

// gap is the first bytes of [start, end) of h that some replica does not
// hold (file coordinates), and that replica's server ("" when no chunk was
// ever allocated there); ok is false when every replica holds all of it.
func (h *heldFile) gap(start, end int64) (gs, ge int64, server string, ok bool) {
	for at := start; at < end; {
		idx := at / h.chunkSize
		cs := idx * h.chunkSize
		ce := min(end, cs+h.chunkSize)
		c := h.chunks[idx]
		if c == nil || len(c.servers) == 0 {
			return at, ce, "", true
		}
		// The first byte from at on that some replica lacks.
		next, who := ce, ""
		for k, ext := range c.ext {
			if miss := firstMissing(ext, at-cs, ce-cs) + cs; miss < next {
				next, who = miss, c.servers[k]
			}
		}
		if next < ce {
			// It ends where that replica holds bytes again.
			k := indexOf(c.servers, who)
			return next, min(ce, firstHeld(c.ext[k], next-cs, ce-cs)+cs), who, true
		}
		at = ce
	}
	return 0, 0, "", false
}

// firstMissing is the first offset in [from, to) that no range of ext (flat
// pairs, in order) covers, or to.
func firstMissing(ext []int64, from, to int64) int64 {
	at := from
	for k := 0; k < len(ext) && at < to; k += 2 {
		if ext[k] > at {
			break
		}
		at = max(at, ext[k+1])
	}
	return min(at, to)
}

// firstHeld is the first offset in [from, to) that a range of ext covers, or to.
func firstHeld(ext []int64, from, to int64) int64 {
	for k := 0; k < len(ext); k += 2 {
		if ext[k+1] > from {
			return min(max(ext[k], from), to)
		}
	}
	return to
}

func indexOf(ss []string, s string) int {
	for i, x := range ss {
		if x == s {
			return i
		}
	}
	return 0
}

// heldHook is meta.CommitInput.Held for a commit whose ranges the servers
// were asked about (asked): a range about to be recorded must lie in one of
// them and be held whole; one that was not asked about is asked now.
// partial says the ranges are an engine's saved segments (its kvcache_params
// or fresh_kvcache): a hole there is named by TP rank, as the engine's bug.
func (m *Master) heldHook(ctx context.Context, asked []*heldFile, partial bool) func(meta.Layout, []meta.Range) error {
	return func(l meta.Layout, fresh []meta.Range) error {
		for i, r := range fresh {
			start, end := r.KVStart, r.KVStart+r.KVLength
			var h *heldFile
			for _, a := range asked {
				if a.path == r.Path && a.start <= start && end <= a.end {
					h = a
					break
				}
			}
			if h == nil {
				// Not foreseen (the servers are never asked inside the
				// commit: on SQLite its transaction holds the store's one
				// connection, which the lookup of the chunks needs).
				return errs.New(errs.ErrUnavailable, "%s bytes %d to %d were not asked about before the commit (the plan changed meanwhile?): retry the commit", r.Path, start, end)
			}
			if h.err != nil {
				return h.err
			}
			if gs, ge, server, ok := h.gap(start, end); ok {
				return holeErr(l, i, r, gs, ge, server, partial)
			}
		}
		return nil
	}
}

// holeErr says which bytes of range i were not written, on which server,
// which TP rank's region they are in, and whose bug that is.
func holeErr(l meta.Layout, i int, r meta.Range, gs, ge int64, server string, partial bool) error {
	where := "no chunk was ever allocated there"
	if server != "" {
		where = "server " + server + " holds no write of them"
	}
	what := fmt.Sprintf("bytes %d to %d of %s (%s)", gs, ge, r.Path, where)
	if n := int64(l.Regions()); n > 1 && r.KVLength%n == 0 {
		region := r.KVLength / n
		rank := (gs - r.KVStart) / region
		what = fmt.Sprintf("TP rank %d's region (bytes %d to %d of %s) is not written from byte %d to %d (%s)",
			rank, r.KVStart+rank*region, r.KVStart+(rank+1)*region, r.Path, gs, ge, where)
	}
	if partial {
		return errs.New(errs.ErrBadRequest, "saved segment %d (tokens %d to %d) not written: %s; the engine reported it saved, but no write covered those bytes: a bug of the engine's connector (every rank must write its own region; docs/engines.md), not of the cache; nothing recorded",
			i, r.TokenStart, r.TokenStart+r.TokenLength, what)
	}
	return errs.New(errs.ErrBadRequest, "fresh range (tokens %d to %d) not written: %s; write the plan's whole fresh range (its fresh_files) before commit; nothing recorded",
		r.TokenStart, r.TokenStart+r.TokenLength, what)
}

// sessionHeld asks the servers about the ranges a session commit will
// record, before its transaction: an engine's saved segments as given, or
// the fresh range the plan reserved. A plan that is not outstanding is
// left to the commit (a repeat of an applied commit, or an error).
func (m *Master) sessionHeld(ctx context.Context, in meta.CommitInput) []*heldFile {
	return m.sessionsHeld(ctx, []meta.CommitInput{in})[0]
}

// sessionsHeld is sessionHeld for the commits of a batch at once: the
// chunks their plans placed are asked about in one parallel round, and
// those the store must be read for (no placed chunks remembered, or a gap
// in them) in a second, so a batch costs the servers one question per
// chunk replica, as each commit alone did, in at most two round trips
// however many commits it holds. out[i] is what commit i's heldHook looks
// in; commits of the second round share one list (a range is found in it
// by its file's path).
func (m *Master) sessionsHeld(ctx context.Context, ins []meta.CommitInput) [][]*heldFile {
	out := make([][]*heldFile, len(ins))
	var placed []*heldFile
	for i, in := range ins {
		if !in.Partial {
			if h := m.planHeld.take(in.PlanID); h != nil {
				out[i] = []*heldFile{h}
				placed = append(placed, h)
			}
		}
	}
	if len(placed) > 0 {
		m.askChunks(ctx, placed)
	}
	var rs []meta.Range
	var again []int
	for i, in := range ins {
		if out[i] != nil {
			h := out[i][0]
			if _, _, _, gap := h.gap(h.start, h.end); !gap && h.err == nil {
				continue
			}
			// A refusal is decided on the store's chunks, not on what the
			// plan placed (a repair may have moved a replica since).
			out[i] = nil
		}
		r := in.Saved
		if !in.Partial {
			r = nil
			if pr, ok := m.sessions.(meta.PlanReader); ok && in.PlanID > 0 {
				if fr, err := pr.OutstandingPlan(ctx, in.Session, in.PlanID); err == nil && fr.KVLength > 0 {
					r = []meta.Range{fr}
				}
			}
		}
		if len(r) > 0 {
			rs = append(rs, r...)
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		hs := m.askHeld(ctx, rs)
		for _, i := range again {
			out[i] = hs
		}
	}
	return out
}

// checkChunksHeld refuses a file commit that grows a chunk past what one of
// its replicas holds (issue 22 finding 15: a commit could claim any size
// its allocated chunks reached). grown maps chunk index to the length the
// commit claims, for chunks it makes longer than recorded. Holes inside a
// file are allowed (a positional write past the end leaves one, read as
// zeros, as in a POSIX file); the bytes of a session range are checked
// whole by the session commit.
func (m *Master) checkChunksHeld(ctx context.Context, f meta.File, chunks []meta.Chunk, grown map[int64]int64) error {
	if len(grown) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, heldTimeout)
	defer cancel()
	errc := make(chan error, 16)
	var wg sync.WaitGroup
	for _, c := range chunks {
		want, ok := grown[c.Index]
		if !ok {
			continue
		}
		for _, sv := range c.Replicas {
			addr, ok := m.serverAddr(sv)
			if !ok {
				return errs.New(errs.ErrUnavailable, "commit of %s: chunk %d is on server %s, which this master does not know (yet): retry", f.Path, c.Index, sv)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, _, err := m.peers.StatChunk(ctx, addr, c.ID)
				switch {
				case errors.Is(err, errs.ErrNotFound):
					n, err = 0, nil
				case err != nil:
					err = errs.New(errs.ErrUnavailable, "commit of %s: could not ask server %s (%s) for chunk %d: %v; retry", f.Path, sv, addr, c.Index, err)
				}
				if err == nil && n < want {
					err = errs.New(errs.ErrBadRequest, "commit of %s: chunk %d length %d claimed, but server %s holds %d bytes of it: write the bytes before Sync (nothing recorded)", f.Path, c.Index, want, sv, n)
				}
				if err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}()
		}
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// planChunks remembers, for plans that placed their fresh range's chunks
// (the default format's fresh_files), the range and its chunks, so that
// their commit asks the servers without reading the plan, the file and its
// chunks again. Bounded: when full it forgets everything (those commits
// then read the store, as engine commits do).
type planChunks struct {
	mu sync.Mutex
	m  map[int64]*heldFile
}

const maxPlanChunks = 16384

func (pc *planChunks) put(id int64, fresh []meta.Range, f meta.File, cs []meta.Chunk) {
	if len(fresh) == 0 || len(cs) == 0 {
		return
	}
	r := meta.Range{Path: fresh[0].Path, KVStart: fresh[0].KVStart}
	for _, x := range fresh {
		r.KVLength += x.KVLength
	}
	h := newHeldFile(r, f.ChunkSize, cs)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.m == nil || len(pc.m) >= maxPlanChunks {
		pc.m = map[int64]*heldFile{}
	}
	pc.m[id] = h
}

// take returns plan id's range and chunks, fresh to ask, and forgets them
// (a commit that fails is asked again from the store).
func (pc *planChunks) take(id int64) *heldFile {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	h := pc.m[id]
	if h == nil || h.err != nil {
		return nil
	}
	delete(pc.m, id)
	fresh := *h
	fresh.chunks = make(map[int64]*heldChunk, len(h.chunks))
	for k, c := range h.chunks {
		cc := *c
		cc.ext = make([][]int64, len(c.servers))
		fresh.chunks[k] = &cc
	}
	return &fresh
}
