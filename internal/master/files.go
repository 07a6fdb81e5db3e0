package master

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

func (m *Master) pool(ctx context.Context, name string) (meta.Pool, error) {
	ps, err := m.meta.Pools(ctx)
	if err != nil {
		return meta.Pool{}, err
	}
	var names []string
	for _, p := range ps {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return meta.Pool{}, errs.New(errs.ErrNotFound, "no pool %q: pools are %s", name, strings.Join(names, ", "))
}

// chunksOut turns meta chunks into API chunks with addresses and liveness.
func (m *Master) chunksOut(cs []meta.Chunk) []api.Chunk {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]api.Chunk, len(cs))
	for i, c := range cs {
		ac := api.Chunk{Index: c.Index, ID: c.ID, Length: c.Length}
		for _, id := range c.Replicas {
			r := api.Replica{Server: id}
			if s := m.servers[id]; s != nil {
				r.Addr, r.Up = s.info.Addr, s.serving() || s.presumed
			}
			ac.Replicas = append(ac.Replicas, r)
		}
		out[i] = ac
	}
	return out
}

// sessionDir is where the master puts session files.
const sessionDir = "/kv-sessions"

func fileOut(f meta.File) api.File {
	return api.File{ID: f.ID, Path: f.Path, Pool: f.Pool, ChunkSize: f.ChunkSize, Size: f.Size, Sealed: f.Sealed, Modified: f.Modified}
}

// commitRecordsSize says whether f is a session's file, whose size a
// session commit records (api.File.CommitRecordsSize): unsealed, under
// sessionDir, and made by a plan (not a file a user put there).
func (m *Master) commitRecordsSize(ctx context.Context, f meta.File) (bool, error) {
	sf, ok := m.meta.(meta.SessionFiler)
	if !ok || f.Sealed || !strings.HasPrefix(f.Path, sessionDir+"/") {
		return false, nil
	}
	return sf.SessionFile(ctx, f.Path)
}

func (m *Master) stat(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	f, cs, ok := m.statMem(p)
	var out api.File
	if ok {
		out = fileOut(f)
		out.CommitRecordsSize = true // StatMem answers a session's own files only
	} else {
		if f, cs, err = m.fileAndChunks(r.Context(), p); errors.Is(err, errs.ErrIsDir) {
			return api.File{Path: p, IsDir: true}, nil
		}
		if err != nil {
			return nil, err
		}
		out = fileOut(f)
		if out.CommitRecordsSize, err = m.commitRecordsSize(r.Context(), f); err != nil {
			return nil, err
		}
	}
	out.Chunks = m.chunksOut(cs)
	if out.Attrs, err = m.meta.Attrs(r.Context(), p); len(out.Attrs) == 0 {
		out.Attrs = nil
	}
	return out, err
}

// statMem answers a stat of a session file from the leader's memory in
// window mode (meta.MemSyncer.StatMem): an engine opens the session's file
// on its first write, and a load opens it to read, and File and Chunks
// each wait for the leader's whole log — a flush forced by every new chat.
// Memory's size and chunk lengths are what the commits and Syncs it
// answered made them (a Sync or commit run in SQL raises or reloads them
// there too), so a reader sees every committed range; an allocation, a
// seal or a replica moved in SQL makes memory forget the file, and SQL
// answers. ok false: read SQL.
func (m *Master) statMem(p string) (meta.File, []meta.Chunk, bool) {
	ms, ok := m.meta.(meta.MemSyncer)
	if !ok || !strings.HasPrefix(p, sessionDir+"/") {
		return meta.File{}, nil, false
	}
	return ms.StatMem(p)
}

// fileAndChunks reads a file and its chunks as one consistent answer. They
// are two queries: a remove (or a remove and a create) committed between
// them would pair the file's size with no chunks, which a client reads as
// holes, zeros where data was (the chaos harness found it). So the file is
// read again after its chunks: a file gone meanwhile is not found, one
// removed and created again is looked up again.
func (m *Master) fileAndChunks(ctx context.Context, p string) (meta.File, []meta.Chunk, error) {
	for attempt := 0; ; attempt++ {
		f, err := m.meta.File(ctx, p)
		if err != nil {
			return meta.File{}, nil, err
		}
		cs, err := m.meta.Chunks(ctx, f.ID)
		if err != nil {
			return meta.File{}, nil, err
		}
		again, err := m.meta.File(ctx, p)
		if err != nil {
			return meta.File{}, nil, err
		}
		if again.ID == f.ID {
			// Still the same file. f, not again: every chunk under f's
			// committed size was allocated before that commit, so cs
			// (read after f) holds them all; again's size may be newer.
			return f, cs, nil
		}
		if attempt == 3 {
			return meta.File{}, nil, errs.New(errs.ErrUnavailable, "%s changed during the lookup (removed and created again): retry", p)
		}
	}
}

// link registers a file whose bytes live in a cold source: every chunk is
// placed now, the file is sealed at its final size, and the chunks fill on
// first read by the server that owns them.
func (m *Master) link(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.LinkRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	if err := checkS3Source(req.Source); err != nil { // validate.go
		return nil, err
	}
	if err := meta.CheckSize(req.Size); err != nil {
		return nil, err
	}
	if req.Pool == "" {
		req.Pool = "perf"
	}
	if err := checkLinkChunks(req.Size, req.ChunkSize); err != nil {
		return nil, err
	}
	ctx := r.Context()
	if old, err := m.meta.File(ctx, p); err == nil {
		attrs, _ := m.meta.Attrs(ctx, p)
		if attrs["source"] == req.Source && attrs["etag"] == req.ETag && old.Size == req.Size {
			out := fileOut(old) // linked already
			out.Attrs = attrs
			return out, nil
		}
		return nil, errs.New(errs.ErrExists, "%s exists with other contents: remove it first", p)
	}
	f, err := m.createFile(ctx, p, req.Pool, req.ChunkSize, "")
	if err != nil {
		return nil, err
	}
	if err := m.linkChunks(ctx, f, req); err != nil {
		m.meta.RemoveFile(ctx, p)
		return nil, err
	}
	if f, err = m.meta.File(ctx, p); err != nil {
		return nil, err
	}
	out := fileOut(f)
	out.Attrs, err = m.meta.Attrs(ctx, p)
	return out, err
}

func (m *Master) linkChunks(ctx context.Context, f meta.File, req api.LinkRequest) error {
	pool, err := m.pool(ctx, f.Pool)
	if err != nil {
		return err
	}
	n := (req.Size + f.ChunkSize - 1) / f.ChunkSize
	want := make([]meta.Chunk, n)
	lengths := make(map[int64]int64, n)
	for i := range want {
		idx := int64(i)
		want[i].Index = idx
		if want[i].Replicas, err = m.place(f.ID, idx, pool.Replicas, f.ChunkSize); err != nil {
			return err
		}
		lengths[idx] = min(f.ChunkSize, req.Size-idx*f.ChunkSize)
	}
	if _, err := m.meta.AddChunks(ctx, f.ID, want); err != nil {
		return err
	}
	if _, err := m.meta.Commit(ctx, f.ID, req.Size, lengths, true, time.Now().UTC()); err != nil {
		return err
	}
	return m.meta.SetAttrs(ctx, f.Path, map[string]string{"source": req.Source, "etag": req.ETag})
}

func (m *Master) create(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.CreateRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	f, err := m.createFile(r.Context(), p, req.Pool, req.ChunkSize, req.RequestID)
	if errors.Is(err, errs.ErrExists) && req.RequestID != "" {
		// A repeat of a create whose answer was lost (the client retried
		// across a failover): the file is the one it made.
		if old, ferr := m.meta.File(r.Context(), p); ferr == nil {
			if attrs, aerr := m.meta.Attrs(r.Context(), p); aerr == nil && attrs[meta.CreateIDAttr] == req.RequestID {
				return fileOut(old), nil
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return fileOut(f), nil
}

// createFile validates the pool and chunk size (defaults: ha, 16 MiB) and creates p.
func (m *Master) createFile(ctx context.Context, p, pool string, chunkSize int64, createID string) (meta.File, error) {
	if pool == "" {
		pool = "ha"
	}
	if _, err := m.pool(ctx, pool); err != nil {
		return meta.File{}, err
	}
	if chunkSize == 0 {
		chunkSize = DefaultChunkSize
	}
	if chunkSize < limits.BlockSize || chunkSize > limits.MaxChunk || chunkSize%limits.BlockSize != 0 {
		return meta.File{}, errs.New(errs.ErrBadRequest, "chunk size %d: must be a multiple of %d between %d and %d", chunkSize, limits.BlockSize, limits.BlockSize, limits.MaxChunk)
	}
	return m.meta.CreateFile(ctx, meta.File{Path: p, Pool: pool, ChunkSize: chunkSize, Modified: time.Now().UTC(), CreateID: createID})
}

func (m *Master) remove(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	if dir, err := m.meta.IsDir(r.Context(), p); err != nil {
		return nil, err
	} else if dir {
		return struct{}{}, m.meta.RemoveDir(r.Context(), p)
	}
	// Chunks are deleted by their servers when they next heartbeat.
	return struct{}{}, m.meta.RemoveFile(r.Context(), p)
}

// rename moves a sealed file or a directory (meta.Rename has the rules)
// and answers what is now at the new name.
func (m *Master) rename(r *http.Request) (any, error) {
	from, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.RenameRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	to, err := nspath.Clean(req.To)
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	err = m.meta.Rename(ctx, from, to, meta.RenameOptions{NoReplace: req.NoReplace, RequestID: req.RequestID}, time.Now().UTC())
	if errors.Is(err, errs.ErrNotFound) && req.RequestID != "" {
		// A repeat of a rename whose answer was lost (the client retried
		// across a failover): the file it moved is at the new name.
		if attrs, aerr := m.meta.Attrs(ctx, to); aerr == nil && attrs[meta.RenameIDAttr] == req.RequestID {
			err = nil
		}
	}
	if err != nil {
		return nil, err
	}
	f, err := m.meta.File(ctx, to)
	if errors.Is(err, errs.ErrIsDir) {
		return api.File{Path: to, IsDir: true}, nil
	}
	if err != nil {
		return nil, err
	}
	return fileOut(f), nil
}

func (m *Master) alloc(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.AllocRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	if len(req.Indexes) > limits.MaxChunksPerRequest {
		return nil, errs.New(errs.ErrTooLarge, "at most %d chunks per allocation", limits.MaxChunksPerRequest)
	}
	if cs, ok := m.allocMem(r.Context(), p, req.Indexes); ok {
		return api.Chunks{Chunks: m.chunksOut(cs)}, nil
	}
	f, err := m.meta.File(r.Context(), p)
	if err != nil {
		return nil, err
	}
	if f.Sealed {
		return nil, errs.New(errs.ErrSealed, "%s is sealed: it was closed and is immutable", p)
	}
	pool, err := m.pool(r.Context(), f.Pool)
	if err != nil {
		return nil, err
	}
	want := make([]meta.Chunk, 0, len(req.Indexes))
	existing, err := m.meta.Chunks(r.Context(), f.ID)
	if err != nil {
		return nil, err
	}
	have := map[int64]bool{}
	for _, c := range existing {
		have[c.Index] = true
	}
	for _, idx := range req.Indexes {
		if idx < 0 || idx > math.MaxInt64/f.ChunkSize-1 {
			return nil, errs.New(errs.ErrOutOfRange, "chunk index %d out of range", idx)
		}
		c := meta.Chunk{Index: idx}
		if !have[idx] {
			if c.Replicas, err = m.place(f.ID, idx, pool.Replicas, f.ChunkSize); err != nil {
				return nil, err
			}
		}
		want = append(want, c)
	}
	cs, err := m.meta.AddChunks(r.Context(), f.ID, want)
	if err != nil {
		return nil, err
	}
	if err := m.touch(r.Context(), f); err != nil { // the writer is alive (unsealed.go)
		return nil, err
	}
	return api.Chunks{Chunks: m.chunksOut(cs)}, nil
}

// allocMem answers, from the leader's memory, an allocation of chunks
// that a plan already allocated in a session file memory holds: a writer
// whose handle on the file is older than the plan (pygd2fs keeps one a
// path) asks for the chunk the plan placed, and gets its id and servers,
// as the plan answered them (in flush mode once they are in SQL). ok
// false: some index has no chunk in memory, or memory does not hold the
// file: AddChunks runs, which waits for the leader's log and makes memory
// forget the file until a slow operation reloads it (every plan and
// commit of the session in SQL until then).
func (m *Master) allocMem(ctx context.Context, p string, indexes []int64) ([]meta.Chunk, bool) {
	ms, ok := m.meta.(meta.MemSyncer)
	if !ok || len(indexes) == 0 {
		return nil, false
	}
	_, chunks, ok := ms.MemFile(p)
	if !ok {
		return nil, false
	}
	out := make([]meta.Chunk, 0, len(indexes))
	for _, idx := range indexes {
		i, ok := meta.FindChunk(chunks, idx)
		if !ok {
			return nil, false
		}
		out = append(out, chunks[i])
	}
	// In flush mode a chunk is answered once it is in SQL, as the plan
	// that allocated it was.
	return out, ms.Settled(ctx)
}

func (m *Master) commit(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	var req api.CommitRequest
	if err := readJSON(r, &req); err != nil {
		return nil, err
	}
	if !req.Seal {
		if f, ok, err := m.syncMem(r.Context(), p, req); ok {
			if err != nil {
				return nil, err
			}
			return fileOut(f), nil
		}
	}
	f, err := m.meta.File(r.Context(), p)
	if err != nil {
		return nil, err
	}
	if err := meta.CheckSize(req.Size); err != nil {
		return nil, err
	}
	if f.Sealed && req.Seal && req.Size == f.Size {
		// A repeat of the sealing commit (its answer was lost in a
		// failover): already done.
		return fileOut(f), nil
	}
	if err := m.checkCommit(r.Context(), f, req); err != nil { // validate.go
		return nil, err
	}
	f, err = m.meta.Commit(r.Context(), f.ID, req.Size, req.Lengths, req.Seal, time.Now().UTC())
	if err != nil {
		return nil, err
	}
	return fileOut(f), nil
}

// syncMem answers a Sync (a commit that does not seal) of a session file
// from the leader's memory (meta/syncmem.go): the same checks as commit's,
// on the file and chunks as memory holds them. ok false: memory does not
// hold the file, or a check failed on memory's view, which may hold less
// than SQL: commit then reads SQL, which decides.
func (m *Master) syncMem(ctx context.Context, p string, req api.CommitRequest) (meta.File, bool, error) {
	ms, ok := m.meta.(meta.MemSyncer)
	if !ok {
		return meta.File{}, false, nil
	}
	f, chunks, ok := ms.MemFile(p)
	if !ok {
		return meta.File{}, false, nil
	}
	if err := m.checkCommitOn(ctx, f, chunks, req); err != nil {
		return meta.File{}, false, nil
	}
	return ms.SyncMem(ctx, f, req.Size, req.Lengths, time.Now().UTC())
}

func (m *Master) list(r *http.Request) (any, error) {
	p, err := pathArg(r)
	if err != nil {
		return nil, err
	}
	es, err := m.meta.List(r.Context(), p)
	if err != nil {
		return nil, err
	}
	es, next, err := pageEntries(r, es) // validate.go: ?after=&limit=
	if err != nil {
		return nil, err
	}
	out := api.Listing{Entries: make([]api.File, 0, len(es)), Next: next}
	for _, e := range es {
		if e.IsDir {
			out.Entries = append(out.Entries, api.File{Path: e.Path, IsDir: true})
		} else {
			out.Entries = append(out.Entries, fileOut(e.File))
		}
	}
	return out, nil
}
