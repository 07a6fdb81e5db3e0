package master

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/store"
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
}

func newHTTPServer(h http.Handler, cfg Config) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: min(ReadHeaderTimeout, cfg.ReadTimeout), ReadTimeout: cfg.ReadTimeout,
		WriteTimeout: WriteTimeout, IdleTimeout: cfg.IdleTimeout, MaxHeaderBytes: MaxHeaderBytes}
}

// readJSON is the one JSON decoder of every handler: a body of at most
// limits.MaxJSONBody bytes holding exactly one JSON value that is not null,
// with no unknown fields and nothing after it.
func readJSON(r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limits.MaxJSONBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return errs.New(errs.ErrTooLarge, "JSON body over %d bytes", limits.MaxJSONBody)
		}
		return errs.New(errs.ErrBadRequest, "reading the body: %w", err)
	}
	return decodeStrict(b, v)
}

// decodeStrict decodes exactly one non-null JSON value from b into v.
func decodeStrict(b []byte, v any) error {
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
	if chunkSize < store.BlockSize || chunkSize > store.MaxChunk {
		return nil // createFile refuses it with the full explanation
	}
	if n := limits.CeilDiv(size, chunkSize); n > limits.MaxChunksPerRequest {
		return errs.New(errs.ErrTooLarge, "link of %d bytes in %d-byte chunks needs %d chunks; at most %d: pass a larger chunk_size (up to %d)",
			size, chunkSize, n, limits.MaxChunksPerRequest, int64(store.MaxChunk))
	}
	return nil
}
