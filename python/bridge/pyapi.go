package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// The blocking calls of the Pythonic layer (pygd2fs.connect). Python passes
// plain buffers here (bytes, bytearray, numpy, torch), pinned for the call;
// there is no IOMEM to check them against, so the Python side derives
// address and length from the object itself.

// ReadInto reads len(dst) bytes of path at off into dst and returns how many
// it read (fewer at the end of the file).
func (e *Engine) ReadInto(path string, off int64, dst []byte) (int64, error) {
	if err := e.alive(); err != nil {
		return 0, err
	}
	clean, err := CleanPath(path)
	if err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, errs.New(errs.ErrBadRequest, "read %s: negative offset %d", path, off)
	}
	ctx := e.ctx
	ent := e.files.get(clean)
	var f *client.File
	if ent != nil && ent.covers(off, int64(len(dst))) {
		f = ent.f
	} else if f, err = e.c.Open(ctx, clean); err != nil {
		return 0, err
	} else {
		e.files.put(clean, newEntry(f))
	}
	n, err := f.ReadAtContext(ctx, dst, off)
	if err == io.EOF {
		err = nil
	}
	return int64(n), err
}

// WriteFrom writes src at off of path, creating the file (pool from opts,
// default perf) when it is missing, and makes it visible to other clients
// (in a session's file, with the session commit that names it: write).
func (e *Engine) WriteFrom(path string, off int64, src []byte, opts string) (int64, error) {
	if err := e.alive(); err != nil {
		return 0, err
	}
	clean, err := CleanPath(path)
	if err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, errs.New(errs.ErrBadRequest, "write %s: negative offset %d", path, off)
	}
	o, err := ParseOptions(opts)
	if err != nil {
		return 0, err
	}
	if len(src) == 0 {
		_, err := e.files.forWrite(e.ctx, clean, o)
		return 0, err
	}
	return e.write(e.ctx, clean, off, [][]byte{src}, o)
}

// OpenFile opens path for the Pythonic File object: mode "r" (must exist),
// "w" (create; replace an existing file) or "x" (create; fail if it exists).
// It returns a handle for FileReadAt/FileWriteAt/FileClose.
func (e *Engine) OpenFile(path, mode, opts string) (uint64, error) {
	if err := e.alive(); err != nil {
		return 0, err
	}
	clean, err := CleanPath(path)
	if err != nil {
		return 0, err
	}
	o, err := ParseOptions(opts)
	if err != nil {
		return 0, err
	}
	var f *client.File
	switch mode {
	case "r":
		f, err = e.c.Open(e.ctx, clean)
	case "w", "x":
		f, err = e.c.Create(e.ctx, clean, client.CreateOptions{Pool: o.Pool, ChunkSize: o.ChunkSize, Overwrite: mode == "w"})
		e.files.forget(clean)
	default:
		return 0, errs.New(errs.ErrBadRequest, "open %s: mode %q: want r, w or x", path, mode)
	}
	if err != nil {
		return 0, err
	}
	id := e.id()
	e.mu.Lock()
	e.handles[id] = f
	e.mu.Unlock()
	return id, nil
}

func (e *Engine) handle(id uint64) (*client.File, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.handles[id]
	if f == nil {
		return nil, errs.New(errs.ErrBadRequest, "file handle %d is closed", id)
	}
	return f, nil
}

// FileReadAt reads into dst at off; it returns the bytes read (fewer at the
// end of the file).
func (e *Engine) FileReadAt(id uint64, dst []byte, off int64) (int64, error) {
	f, err := e.handle(id)
	if err != nil {
		return 0, err
	}
	n, err := f.ReadAtContext(e.ctx, dst, off)
	if err == io.EOF {
		err = nil
	}
	return int64(n), err
}

// FileWriteAt writes src at off.
func (e *Engine) FileWriteAt(id uint64, src []byte, off int64) (int64, error) {
	f, err := e.handle(id)
	if err != nil {
		return 0, err
	}
	n, err := f.WriteAtContext(e.ctx, src, off)
	return int64(n), err
}

// FileSize is the size as the handle sees it (its own writes included).
func (e *Engine) FileSize(id uint64) (int64, error) {
	f, err := e.handle(id)
	if err != nil {
		return 0, err
	}
	return f.Size(), nil
}

// FileClose closes a handle; a handle that wrote seals its file.
func (e *Engine) FileClose(id uint64) error {
	e.mu.Lock()
	f := e.handles[id]
	delete(e.handles, id)
	e.mu.Unlock()
	if f == nil {
		return nil
	}
	return f.Close()
}

// KV calls. Keys are opaque bytes; pool "" is perf.

// KVPut stores value under key; it reports whether the key existed.
func (e *Engine) KVPut(pool, key string, value []byte, overwrite bool) (bool, error) {
	if err := e.alive(); err != nil {
		return false, err
	}
	return e.c.KV(pool).PutWith(e.ctx, key, value, client.PutOptions{Overwrite: overwrite})
}

// KVGetInto reads key's value into dst and returns its length.
func (e *Engine) KVGetInto(pool, key string, dst []byte) (int64, error) {
	if err := e.alive(); err != nil {
		return 0, err
	}
	n, err := e.c.KV(pool).GetInto(e.ctx, key, dst)
	return int64(n), err
}

// KVGet returns key's value in a new buffer.
func (e *Engine) KVGet(pool, key string) ([]byte, error) {
	if err := e.alive(); err != nil {
		return nil, err
	}
	return e.c.KV(pool).Get(e.ctx, key)
}

// KVBatchGetInto reads keys[i] into dsts[i]; out[i] is the value's length,
// or minus a status code (-1: not found, which also stands for a key whose
// owner is unreachable).
func (e *Engine) KVBatchGetInto(pool string, keys []string, dsts [][]byte) ([]int64, error) {
	if err := e.alive(); err != nil {
		return nil, err
	}
	ns, err := e.c.KV(pool).BatchGetInto(e.ctx, keys, dsts)
	if ns == nil {
		return nil, err
	}
	var be *client.BatchError
	errors.As(err, &be)
	out := make([]int64, len(keys))
	for i, n := range ns {
		switch {
		case n >= 0:
			out[i] = int64(n)
		case be != nil && i < len(be.Errs) && be.Errs[i] != nil:
			out[i] = -int64(Code(be.Errs[i]))
		default:
			out[i] = -CodeNotFound
		}
	}
	return out, nil
}

// KVBatchPut stores values[i] under keys[i]; out[i] is 0 or minus a status
// code.
func (e *Engine) KVBatchPut(pool string, keys []string, values [][]byte) ([]int64, error) {
	if err := e.alive(); err != nil {
		return nil, err
	}
	if len(keys) != len(values) {
		return nil, errs.New(errs.ErrBadRequest, "%d keys but %d values", len(keys), len(values))
	}
	err := e.c.KV(pool).BatchPut(e.ctx, keys, values)
	out := make([]int64, len(keys))
	var be *client.BatchError
	if errors.As(err, &be) {
		for i, x := range be.Errs {
			if x != nil && i < len(out) {
				out[i] = -int64(Code(x))
			}
		}
	} else if err != nil {
		return nil, err
	}
	return out, nil
}

// KVBatchExists reports which keys are stored and how many leading ones.
func (e *Engine) KVBatchExists(pool string, keys []string) ([]bool, int, error) {
	if err := e.alive(); err != nil {
		return nil, 0, err
	}
	hits, prefix, err := e.c.KV(pool).BatchExists(e.ctx, keys)
	var be *client.BatchError
	if errors.As(err, &be) {
		err = nil // unreachable owners count as misses, as in the Go API
	}
	return hits, prefix, err
}

// Call runs a control-plane call named method with JSON params and returns
// its JSON answer. Keeping these behind one entry point keeps the C ABI
// small; they are not on the data path.
func (e *Engine) Call(method string, params []byte) ([]byte, error) {
	if err := e.alive(); err != nil {
		return nil, err
	}
	var p struct {
		Path, Dir, Pool, Key, Prefix, Model, Session string
		NewID                                        string `json:"new_id"`
		PlanID                                       int64  `json:"plan_id"`
		Layout                                       *client.Layout
		Plan                                         *client.PlanRequest
		Saved                                        *[]client.KVRange
		After                                        string
		Limit                                        int
		Opts                                         string
		Size                                         int64
		Retain                                       *retainParams
	}
	if len(params) > 0 {
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, errs.New(errs.ErrBadRequest, "%s: params: %w", method, err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	s := e.c.Sessions()
	var out any
	var err error
	switch method {
	case "parse_uri": // one URI parser for Go and Python: the client's
		var u client.URI
		if u, err = client.ParseURI(p.Path); err == nil {
			out = map[string]any{"masters": u.Masters, "cluster": u.Cluster, "path": u.Path}
		}
	case "create": // Client.Create: a file the engine writes into next
		err = e.create(ctx, p.Path, p.Size, p.Opts)
	case "status":
		out, err = e.c.Status(ctx)
	case "stat":
		out, err = e.c.Stat(ctx, p.Path)
	case "list":
		out, err = e.c.List(ctx, p.Dir)
	case "mkdir":
		err = e.c.Mkdir(ctx, p.Dir)
	case "remove":
		err = e.c.Remove(ctx, p.Path)
		e.files.forget(p.Path)
	case "kv_stat":
		out, err = e.c.KV(p.Pool).Stat(ctx, p.Key)
	case "kv_delete":
		err = e.c.KV(p.Pool).Delete(ctx, p.Key)
	case "kv_delete_prefix":
		out, err = e.c.KV(p.Pool).DeleteByPrefix(ctx, p.Prefix)
	case "kv_retain": // pin, priority, TTL of a key (or, with prefix, of every key starting with it)
		out, err = kvRetain(ctx, e.c.KV(p.Pool), p.Key, p.Prefix, p.Retain)
	case "set_layout":
		if p.Layout == nil {
			return nil, errs.New(errs.ErrBadRequest, "set_layout: no layout")
		}
		err = s.SetLayout(ctx, *p.Layout)
	case "get_layout":
		out, err = s.Layout(ctx, p.Model)
	case "plan":
		if p.Plan == nil {
			return nil, errs.New(errs.ErrBadRequest, "plan: no request")
		}
		if p.Plan.Format == "vllm" || p.Plan.Format == "sglang" {
			out, err = s.PlanEngine(ctx, p.Session, *p.Plan)
		} else {
			out, err = s.Plan(ctx, p.Session, *p.Plan)
		}
	case "commit":
		if p.Saved != nil { // what an engine saved of a vllm-format plan
			out, err = s.CommitSaved(ctx, p.Session, p.PlanID, *p.Saved)
		} else {
			out, err = s.Commit(ctx, p.Session, p.PlanID)
		}
	case "fork":
		out, err = s.Fork(ctx, p.Session, p.NewID)
	case "get_session":
		out, err = s.Get(ctx, p.Session)
	case "list_sessions":
		out, err = s.List(ctx, p.After, p.Limit)
	case "delete_session":
		err = s.Delete(ctx, p.Session)
	default:
		return nil, errs.New(errs.ErrBadRequest, "unknown call %q", method)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// create makes path an empty file (with the pool and chunk size opts give,
// as Write would) unless it exists already, which is no error: engines
// create before they write, and two ranks may race to do it. size must be
// 0 — a file grows as it is written, there is nothing to preallocate.
func (e *Engine) create(ctx context.Context, path string, size int64, opts string) error {
	p, err := CleanPath(path)
	if err != nil {
		return err
	}
	if size != 0 {
		return errs.New(errs.ErrBadRequest, "create %s: size %d: give 0 (a gd2fs file grows as it is written; nothing is preallocated)", p, size)
	}
	o, err := ParseOptions(opts)
	if err != nil {
		return err
	}
	_, err = e.files.forWrite(ctx, p, o)
	return err
}

// retainParams is kv_retain's change: absent fields change nothing.
type retainParams struct {
	Pin      string `json:"pin"`
	Priority *int   `json:"priority"`
	TTLMs    *int64 `json:"ttl_ms"`
	Persist  bool   `json:"persist"`
}

// kvRetain serves kv_retain: with no change, the key's retention.
func kvRetain(ctx context.Context, kv *client.KV, key, prefix string, p *retainParams) (any, error) {
	var o client.RetainOptions
	if p != nil {
		o.Pin, o.Persist = p.Pin, p.Persist
		if p.Priority != nil {
			o.SetPriority, o.Priority = true, *p.Priority
		}
		if p.TTLMs != nil {
			o.SetTTL, o.TTL = true, time.Duration(*p.TTLMs)*time.Millisecond
		}
	}
	if prefix != "" {
		return kv.RetainPrefix(ctx, prefix, o)
	}
	var r client.Retention
	var gone bool
	var err error
	if o == (client.RetainOptions{}) {
		r, err = kv.Retention(ctx, key)
	} else {
		r, gone, err = kv.Retain(ctx, key, o)
	}
	if err != nil {
		return nil, err
	}
	return map[string]any{"pin": r.Pin, "priority": r.Priority, "ttl_ms": r.TTL.Milliseconds(), "gone": gone}, nil
}
