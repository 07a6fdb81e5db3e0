package master

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/frames"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

// HTTP limits of the master (docs/security.md). A request must send its
// headers within ReadHeaderTimeout and its whole body within ReadTimeout; an
// idle keep-alive connection is closed after IdleTimeout. Together with the
// connection limit (Config.MaxConns) no client holds descriptors for long.
const (
	DefaultMaxConns    = 4096
	ReadHeaderTimeout  = 10 * time.Second
	DefaultReadTimeout = 60 * time.Second
	WriteTimeout       = 60 * time.Second
	DefaultIdleTimeout = 2 * time.Minute
	MaxHeaderBytes     = 64 << 10
	// DefaultMaxConnsPerIP bounds the connections of one address that have
	// not authenticated yet; PreAuthTimeout bounds any read of one
	// (netguard.Protect, guard.go).
	DefaultMaxConnsPerIP = 512
	PreAuthTimeout       = 10 * time.Second
)

func (c *Config) fillLimits() {
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
}

func newHTTPServer(h http.Handler, cfg Config) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: min(ReadHeaderTimeout, cfg.ReadTimeout), ReadTimeout: cfg.ReadTimeout,
		WriteTimeout: WriteTimeout, IdleTimeout: cfg.IdleTimeout, MaxHeaderBytes: MaxHeaderBytes, ConnContext: connContext,
		ErrorLog: quietLog(cfg.Log)}
}

// readJSON is the one JSON decoder of every handler: a body of at most
// limits.MaxJSONBody bytes holding exactly one JSON value that is not null,
// with no unknown fields and nothing after it.
//
// The body is read into a pooled buffer: every decoder copies what it keeps
// (strings, ids, hashes, raw values), none keeps a view of the body. A
// chat turn's plan body carries the prompt's token ids, and io.ReadAll's
// growing buffers were the master's largest allocation at 64 chats (15 % of
// its bytes: docs/benchmarks.md, "Thirteenth session").
func readJSON(r *http.Request, v any) error {
	buf := bodies.Get()
	defer bodies.Put(buf)
	return readJSONInto(r, v, buf)
}

// readJSONInto is readJSON with the body read into buf.
func readJSONInto(r *http.Request, v any, buf *bytes.Buffer) error {
	buf.Reset()
	if n := r.ContentLength; n > 0 && n <= limits.MaxJSONBody {
		// Room for what is announced, up to preGrow: past it the buffer
		// grows as bytes arrive, so a client that announces 4 MiB and
		// sends nothing holds no more than that. ReadFrom asks for
		// bytes.MinRead of room before each read, the one that finds the
		// end too.
		buf.Grow(int(min(n, preGrow)) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(nil, r.Body, limits.MaxJSONBody)); err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return errs.New(errs.ErrTooLarge, "JSON body over %d bytes", limits.MaxJSONBody)
		}
		return errs.New(errs.ErrBadRequest, "reading the body: %w", err)
	}
	return decodeStrict(buf.Bytes(), v)
}

// bodies are readJSON's buffers, kept up to 1 MiB.
var bodies = bufpool.NewBuffers(1 << 20)

// preGrow bounds the room readJSON makes for an announced body at once.
const preGrow = 64 << 10

// decodeStrict decodes exactly one non-null JSON value from b into v: by
// v's hand decoder when it has one (planjson.go), v is a zero value and b
// is in its plain form, else by encoding/json.
func decodeStrict(b []byte, v any) error {
	if pd, ok := v.(plainDecoder); ok && reflect.ValueOf(v).Elem().IsZero() && pd.decodePlain(b) {
		return nil
	}
	if t := bytes.TrimSpace(b); len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return errs.New(errs.ErrBadRequest, "bad JSON body: want an object, got %q", t)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errs.New(errs.ErrBadRequest, "bad JSON body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errs.New(errs.ErrBadRequest, "bad JSON body: data after the first value")
	}
	return nil
}

// queryInt reads an integer query parameter: def when absent, a bad request
// when it is not a number in [lo, hi].
func queryInt(r *http.Request, name string, def, lo, hi int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, errs.New(errs.ErrBadRequest, "?%s=%q: want an integer from %d to %d", name, s, lo, hi)
	}
	return n, nil
}

// tokenOK compares the bearer token in constant time. Both sides are hashed
// first so the comparison does not leak the token's length either.
func tokenOK(r *http.Request, token string) bool {
	got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
	want := sha256.Sum256([]byte("Bearer " + token))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// checkLinkChunks bounds the chunks a link places (each is held in memory
// and inserted in one transaction) before anything is allocated.
func checkLinkChunks(size, chunkSize int64) error {
	if chunkSize == 0 {
		chunkSize = DefaultChunkSize
	}
	if chunkSize < limits.BlockSize || chunkSize > limits.MaxChunk {
		return nil // createFile refuses it with the full explanation
	}
	if n := limits.CeilDiv(size, chunkSize); n > limits.MaxChunksPerRequest {
		return errs.New(errs.ErrTooLarge, "link of %d bytes in %d-byte chunks needs %d chunks; at most %d: pass a larger chunk_size (up to %d)",
			size, chunkSize, n, limits.MaxChunksPerRequest, int64(limits.MaxChunk))
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	buf := answers.Get().(*answerBuf)
	b, ok := plainAnswer(buf.B[:0], v)
	if ok {
		w.Write(b)
	}
	putAnswer(buf, b)
	if !ok {
		json.NewEncoder(w).Encode(v)
	}
}

// answerBuf is a pooled buffer of writeJSON's (and marshalPlan's).
type answerBuf struct{ B []byte }

var answers = sync.Pool{New: func() any { return &answerBuf{B: make([]byte, 0, 1024)} }}

// putAnswer returns buf to the pool, keeping b (what was appended to
// buf.B) as its bytes unless it grew past 64 KiB: a large answer's buffer
// is left to the collector.
func putAnswer(buf *answerBuf, b []byte) {
	if b != nil && cap(b) <= 64<<10 {
		buf.B = b[:0]
	}
	answers.Put(buf)
}

// plainAnswer appends the answers of a chat turn (a plan, an engine's
// plan, a commit's session, and batches of plans and of commits) written by hand, to the bytes json.Encoder writes for them
// (api.AppendPlanJSON; FuzzPlainEncode in internal/api compares); false
// for any other answer, or one with a value without a plain form.
func plainAnswer(b []byte, v any) ([]byte, bool) {
	var ok bool
	switch a := v.(type) {
	case api.Plan:
		b, ok = api.AppendPlanJSON(b, &a)
	case api.Session:
		b, ok = api.AppendSessionJSON(b, &a)
	case api.EnginePlan:
		b, ok = api.AppendEnginePlanJSON(b, &a)
	case api.PlanBatchAnswer: // a client's coalesced plans
		b, ok = api.AppendPlanBatchAnswerJSON(b, &a)
	case api.CommitBatchAnswer: // and commits
		b, ok = api.AppendCommitBatchAnswerJSON(b, &a)
	}
	return append(b, '\n'), ok // as json.Encoder ends a value
}

func writeErr(w http.ResponseWriter, err error) {
	if errors.Is(err, api.ErrRetryLater) {
		w.Header().Set("Retry-After", "1") // clients retry: nothing was done
	}
	writeJSON(w, api.HTTPStatus(err), api.Error{Error: err.Error(), Code: errs.Code(err)})
}

func pathArg(r *http.Request) (string, error) {
	return nspath.Clean("/" + r.PathValue("path"))
}

// Handler is the master's HTTP API.
func (m *Master) Handler() http.Handler {
	mux := http.NewServeMux()
	h := func(pattern string, fn func(r *http.Request) (any, error)) {
		mux.Handle(pattern, m.metrics.instrument(pattern, m.auth(func(w http.ResponseWriter, r *http.Request) {
			v, err := fn(r)
			if err != nil {
				writeErr(w, err)
				return
			}
			writeJSON(w, http.StatusOK, v)
		})))
	}
	h("POST /v1/servers/heartbeat", func(r *http.Request) (any, error) {
		var hb api.Heartbeat
		if err := readJSON(r, &hb); err != nil {
			return nil, err
		}
		return m.heartbeat(r.Context(), hb)
	})
	h("GET /v1/status", func(r *http.Request) (any, error) { return m.status(r.Context()) })
	h("GET /v1/members", func(r *http.Request) (any, error) { return m.membership(r.Context()) })
	h("POST /v1/servers/{id}/drain", m.drainRoute)
	h("GET /v1/files/{path...}", m.stat)
	h("PUT /v1/files/{path...}", m.create)
	h("DELETE /v1/files/{path...}", m.remove)
	h("POST /v1/rename/{path...}", m.rename)
	h("POST /v1/alloc/{path...}", m.alloc)
	h("POST /v1/commit/{path...}", m.commit)
	h("POST /v1/link/{path...}", m.link)
	h("POST /v1/refill/{path...}", m.refillRoute)
	h("PUT /v1/attrs/{path...}", func(r *http.Request) (any, error) {
		p, err := pathArg(r)
		if err != nil {
			return nil, err
		}
		var attrs map[string]string
		if err := readJSON(r, &attrs); err != nil {
			return nil, err
		}
		return struct{}{}, m.meta.SetAttrs(r.Context(), p, attrs)
	})
	h("GET /v1/list/{path...}", m.list)
	h("PUT /v1/dirs/{path...}", func(r *http.Request) (any, error) {
		p, err := pathArg(r)
		if err != nil {
			return nil, err
		}
		return api.File{Path: p, IsDir: true}, m.meta.Mkdir(r.Context(), p, time.Now().UTC())
	})
	m.sessionRoutes(h)
	mux.Handle("/ui/", m.console.Handler())
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	mux.Handle("GET /metrics", m.metrics.handler())
	m.healthRoutes(mux)   // /healthz, /readyz: health.go
	top := m.protect(mux) // guard.go
	// A framed connection is upgraded from a request that passed the guard
	// and the token check, and each of its calls passes them again, through
	// top, as a plain request would (package frames).
	mux.Handle("GET "+frames.Path, m.auth(func(w http.ResponseWriter, r *http.Request) { m.frames.Upgrade(w, r, top) }))
	return top
}

func (m *Master) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !m.leader.Load() {
			leader, _ := m.meta.Leader(r.Context())
			w.Header().Set(api.LeaderHeader, leader)
			// Behind a load-balanced address (a Kubernetes Service over every
			// master) the client's retry must be free to land on another
			// master: a kept-alive connection would bring it back here.
			w.Header().Set("Connection", "close")
			writeErr(w, errs.New(errs.ErrUnavailable, "this master (%s) is a standby; the leader is %s: list every master in --master / GD2FS_MASTER (%w)", m.url, leader, api.ErrRetryLater))
			return
		}
		if m.cfg.Token != "" && !tokenOK(r, m.cfg.Token) {
			writeErr(w, errs.New(errs.ErrUnauthorized, "wrong or missing cluster token: give the cluster's token with --token-file or GD2FS_TOKEN_FILE (or GD2FS_TOKEN)"))
			return
		}
		next(w, r)
	}
}
