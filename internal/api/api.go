// Package api holds the master's HTTP/JSON types and a small client for them.
// It is a leaf the client SDK depends on: it must not import the metadata
// engine (internal/meta) or anything that links a database driver
// (client/deps_test.go checks).
// docs/api.md documents the endpoints; both the Go SDK and the data servers
// speak to the master through Client.
package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/frames"
	"github.com/gd2fs/gd2fs/internal/placement"
	"github.com/gd2fs/gd2fs/kvlayout"
)

// ServerInfo is a data server as the master sees it.
type ServerInfo struct {
	ID       string    `json:"id"`
	Addr     string    `json:"addr"`
	State    string    `json:"state"` // "up" or "down"
	MemCap   int64     `json:"mem_cap"`
	MemUsed  int64     `json:"mem_used"`
	DiskCap  int64     `json:"disk_cap"`
	DiskUsed int64     `json:"disk_used"`
	Chunks   int       `json:"chunks"`
	LastSeen time.Time `json:"last_seen"`
	// Bytes this server sent to clients from file chunks, and bytes it
	// fetched from the cold tier (S3) to fill chunks of linked files, since
	// it started.
	ServedBytes int64 `json:"served_bytes"`
	ColdBytes   int64 `json:"cold_bytes"`
	// KV is the server's KV cache figures; nil without KV tiers (and from
	// servers older than this field).
	KV *KVStats `json:"kv,omitempty"`
	// Unhealthy, when set, says why the server cannot serve (its listener
	// fails to accept, e.g. out of file descriptors): the master leaves it
	// out of placement and membership until it clears.
	Unhealthy string `json:"unhealthy,omitempty"`
}

// KVStats is a server's KV cache figures as of a heartbeat. Counters count
// since the server started; the master's console turns two samples into
// rates and ratios.
type KVStats struct {
	Keys       int64  `json:"keys"`     // blocks held, in either tier or both
	MemKeys    int64  `json:"mem_keys"` // blocks with a DRAM copy
	MemCap     int64  `json:"mem_cap"`
	MemUsed    int64  `json:"mem_used"`
	DiskCap    int64  `json:"disk_cap"`
	DiskUsed   int64  `json:"disk_used"`
	MemHits    uint64 `json:"mem_hits"`
	DiskHits   uint64 `json:"disk_hits"`
	Misses     uint64 `json:"misses"`
	Puts       uint64 `json:"puts"`
	Demotions  uint64 `json:"demotions"`
	Promotions uint64 `json:"promotions"`
	Evictions  uint64 `json:"evictions"`
	// Pins and TTLs (gd2fs kv pin, kv ttl; kvstore's retention).
	PinnedKeys   int64  `json:"pinned_keys,omitempty"`
	PinnedMem    int64  `json:"pinned_mem,omitempty"`  // bytes pinned in DRAM
	PinnedDisk   int64  `json:"pinned_disk,omitempty"` // bytes pinned on disk
	PinQuotaMem  int64  `json:"pin_quota_mem,omitempty"`
	PinQuotaDisk int64  `json:"pin_quota_disk,omitempty"`
	ExpiringKeys int64  `json:"expiring_keys,omitempty"` // blocks with a TTL
	Expired      uint64 `json:"expired,omitempty"`
	// Latency holds, per operation ("kv_get", "kv_put", "kv_exists"), the
	// cumulative count of operations served within each of LatencyBounds
	// (the last entry counts all operations).
	Latency map[string][]uint64 `json:"latency,omitempty"`
}

// LatencyBounds are the upper bounds, in seconds, of KVStats.Latency's
// buckets: 20µs doubling to about 2.6s, the server's histogram buckets.
var LatencyBounds = func() []float64 {
	b := make([]float64, 18)
	for i := range b {
		b[i] = 20e-6 * float64(uint64(1)<<i)
	}
	return b
}()

// Free is the space placement may still use on s.
func (s ServerInfo) Free() int64 {
	if s.DiskCap > 0 {
		return s.DiskCap - s.DiskUsed
	}
	return s.MemCap - s.MemUsed
}

// Heartbeat is what a server posts every interval; Deleted acknowledges
// chunk deletions asked for in earlier replies.
type Heartbeat struct {
	ServerInfo
	Deleted []uint64 `json:"deleted,omitempty"`
	// Held lists the chunks a server found on its disk when it started; sent
	// until the master acknowledges it (HeartbeatReply.Reconciled), so the
	// master can have the ones it no longer knows deleted.
	Held []uint64 `json:"held,omitempty"`
}

// HeartbeatReply carries the membership map and chunks the server must delete.
type HeartbeatReply struct {
	Membership
	Delete     []uint64 `json:"delete,omitempty"`
	Reconciled bool     `json:"reconciled,omitempty"` // the Held list was processed
}

// Membership is the map clients and servers compute KV owners from: the up
// servers and the pools, as of an epoch.
type Membership struct {
	Epoch   int64              `json:"epoch"`
	Members []placement.Member `json:"members"`
	Pools   []Pool             `json:"pools"`
	// Previous holds the last distinct member lists before this one, newest
	// first (at most two, kept in the master's memory): a key whose owner
	// moved is still found on its owner under them until it has been moved
	// (docs/kv-cache.md, "Membership changes").
	Previous []PastMembers `json:"previous,omitempty"`
	// Draining lists up servers that are leaving (gd2fs server drain): not
	// members, but still serving the blocks they hold until those moved.
	Draining []placement.Member `json:"draining,omitempty"`
}

// PastMembers is an earlier member list and the epoch it ended at.
type PastMembers struct {
	Epoch   int64              `json:"epoch"`
	Members []placement.Member `json:"members"`
}

// Replicas is pool's replica count, or 0 when there is no such pool.
func (m Membership) Replicas(pool string) int {
	for _, p := range m.Pools {
		if p.Name == pool {
			return p.Replicas
		}
	}
	return 0
}

// Pool is a replication policy.
type Pool struct {
	Name     string `json:"name"`
	Replicas int    `json:"replicas"`
}

// Replica is one copy of a chunk.
type Replica struct {
	Server string `json:"server"`
	Addr   string `json:"addr"`
	Up     bool   `json:"up"`
}

// Chunk is one chunk of a file.
type Chunk struct {
	Index    int64     `json:"index"`
	ID       uint64    `json:"id"`
	Length   int64     `json:"length"`
	Replicas []Replica `json:"replicas"`
}

// File is a namespace entry: a file, or a directory when IsDir.
type File struct {
	// ID is the file's number on the master, which no other file ever
	// has: a name can be removed, renamed or replaced, the id tells one
	// file from the next under it (0 for directories).
	ID        int64  `json:"id,omitempty"`
	Path      string `json:"path"`
	IsDir     bool   `json:"is_dir,omitempty"`
	Pool      string `json:"pool,omitempty"`
	ChunkSize int64  `json:"chunk_size,omitempty"`
	Size      int64  `json:"size"`
	Sealed    bool   `json:"sealed,omitempty"`
	// CommitRecordsSize: a session file, whose bytes a session commit
	// records itself once the servers vouch for them (docs/kv-cache.md,
	// "An engine's turn without a Sync"): a writer of a plan's fresh range
	// may leave out the Sync. Absent from masters before it.
	CommitRecordsSize bool      `json:"commit_records_size,omitempty"`
	Modified          time.Time `json:"modified"`
	Chunks            []Chunk   `json:"chunks,omitempty"`
	// Attrs: "source" (s3://bucket/key a linked file fills from), "etag",
	// "sha256" (hex, recorded by pull and warmup).
	Attrs map[string]string `json:"attrs,omitempty"`
}

// LinkRequest registers a file whose chunks fill from a cold source on first read.
type LinkRequest struct {
	Source    string `json:"source"` // s3://bucket/key
	Size      int64  `json:"size"`
	ETag      string `json:"etag,omitempty"`
	Pool      string `json:"pool,omitempty"` // default perf: S3 keeps the durable copy
	ChunkSize int64  `json:"chunk_size,omitempty"`
}

// CreateRequest creates a file (and its parent directories).
type CreateRequest struct {
	Pool      string `json:"pool"`
	ChunkSize int64  `json:"chunk_size"`
	// RequestID, when set, makes the create idempotent: a repeat with the
	// same id (a retry after the first answer was lost) returns the file
	// the first one made instead of "exists".
	RequestID string `json:"request_id,omitempty"`
}

// RenameRequest moves the file or directory named in the URL to To
// (POST /v1/rename/{path}). An existing sealed file at To is replaced, as
// POSIX rename does, unless NoReplace.
type RenameRequest struct {
	To        string `json:"to"`
	NoReplace bool   `json:"no_replace,omitempty"`
	// RequestID, when set, makes a file's rename idempotent: a repeat
	// after the first answer was lost finds the file at To and succeeds.
	RequestID string `json:"request_id,omitempty"`
}

// AllocRequest asks for chunks at the given indexes (existing ones are returned as they are).
type AllocRequest struct {
	Indexes []int64 `json:"indexes"`
}

// Chunks is a list of chunks.
type Chunks struct {
	Chunks []Chunk `json:"chunks"`
}

// RefillRequest asks the master to re-place chunk Index of a linked file
// whose replicas did not answer the reader (POST /v1/refill/{path}).
// Failed names the servers (ids) the reader tried; the master moves the
// chunk off those it finds down, or that do not answer its own probe.
type RefillRequest struct {
	Index  int64    `json:"index"`
	Failed []string `json:"failed,omitempty"`
}

// CommitRequest records what a writer wrote: the file size, each touched
// chunk's length, and whether the file is now sealed.
type CommitRequest struct {
	Size    int64           `json:"size"`
	Lengths map[int64]int64 `json:"lengths,omitempty"`
	Seal    bool            `json:"seal,omitempty"`
}

// Listing is a directory's entries.
type Listing struct {
	Entries []File `json:"entries"`
	// Next, when set, is the ?after= of the next page: the listing was cut
	// at ?limit= entries.
	Next string `json:"next,omitempty"`
}

// Status is the cluster overview.
type Status struct {
	Cluster string       `json:"cluster"`
	Epoch   int64        `json:"epoch"`
	Servers []ServerInfo `json:"servers"`
	Pools   []Pool       `json:"pools"`
	Files   int64        `json:"files"`
	Bytes   int64        `json:"bytes"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// HTTPStatus maps an error to an HTTP status code.
func HTTPStatus(err error) int {
	switch errs.Code(err) {
	case "not_found":
		return http.StatusNotFound
	case "exists", "not_empty", "sealed", "busy", "is_dir", "not_dir":
		return http.StatusConflict
	case "bad_request", "out_of_range", "too_large":
		return http.StatusBadRequest
	case "unauthorized":
		return http.StatusUnauthorized
	case "no_space", "unavailable":
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// ErrNoRoute marks a master's answer of 404 or 405 without a gd2fs error:
// the HTTP router of a master older than the route turned it down (an
// unknown path, or a known path pattern with another method), so a client
// may fall back to the routes that master has.
var ErrNoRoute = errors.New("the master has no such route (an older master?)")

// LeaderHeader, on a standby master's 503 answers, names the leader's URL.
const LeaderHeader = "X-Gd2fs-Leader"

// ErrRetryLater marks a master's refusal that did nothing and will pass: a
// standby, or a new leader still waiting for the servers' heartbeats. The
// master answers it as 503 with a Retry-After header, which clients retry on
// whatever the request.
var ErrRetryLater = errors.New("retry in a moment")

// DefaultRetryFor is how long Client.Do keeps retrying while no master leads.
const DefaultRetryFor = 30 * time.Second

// RoleHeader says what kind of caller sends a request (Client.Role).
const RoleHeader = "X-GD2FS-Role"

// Client calls the master.
type Client struct {
	// Base is the master's URL, or several comma-separated (masters sharing
	// PostgreSQL): calls go to the one that answered last and move on when it
	// is unreachable or a standby.
	Base  string // e.g. http://127.0.0.1:7070
	Token string
	HTTP  *http.Client
	// RetryFor bounds how long Do retries, with backoff, while no master
	// answers as leader (a failover): default DefaultRetryFor; negative:
	// one pass over the masters, no waiting.
	RetryFor time.Duration
	// Role, when set, is sent in the RoleHeader of every request: data
	// servers send "server", which a master without a token requires of
	// heartbeats (a header no web page can add to a cross-origin request).
	Role string
	// Frames, when set, carries the calls Framed names on persistent
	// framed connections (package frames) instead of HTTP requests, to a
	// master that takes them; others, and every call to a master that
	// does not, go as plain HTTP through HTTP.
	Frames *frames.Client

	cur      atomic.Int32
	answered atomic.Bool // some master has answered this client once
}

// bases splits Base.
func (c *Client) bases() []string {
	var out []string
	for _, b := range strings.Split(c.Base, ",") {
		if b = strings.TrimRight(strings.TrimSpace(b), "/"); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// EscapePath turns a namespace path into a URL path suffix.
func EscapePath(p string) string {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// RequestIDParam is the query parameter naming a session plan or fork
// request, so that a repeat (a connection cut mid-request, a failover) is
// answered as the first was: POST /v1/sessions/{id}/plan?request_id=R.
const RequestIDParam = "request_id"

// Idempotent reports whether sending method path twice has the effect of
// sending it once, so that Do may repeat it after a failure that leaves
// unknown whether the master applied it (a connection cut mid-request by a
// leader's death). Reads are; so are creating a file with a request id (a
// repeat finds the file it made), allocating chunks (existing ones come
// back as they are), committing (sizes only grow; sealing a sealed file at
// the same size is a no-op), linking (a repeat finds the link), attributes,
// directories (mkdir -p), heartbeats, deletes (Do turns a repeat's
// not_found into success), and session commits (the master answers a repeat
// of a session's last commit as done), and session plans and forks that
// carry a request_id (RequestIDParam: the master answers a repeat with the
// plan it made, or the fork as done). Plans and forks without one are sent
// again only when the master surely did not get them. Batches of plans
// (POST /v1/sessions/plans) are taken as idempotent because the SDK names
// every plan of a batch with a request id; batches of commits are, as
// their commits are.
func Idempotent(method, path string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPut:
		return !strings.HasPrefix(path, "/v1/models/") && !strings.HasPrefix(path, "/v1/sessions")
	case http.MethodDelete:
		return strings.HasPrefix(path, "/v1/files/")
	case http.MethodPost:
		p, q, hasQuery := strings.Cut(path, "?")
		if strings.HasPrefix(p, "/v1/sessions/") && strings.HasSuffix(p, "/commit") {
			return true
		}
		if p == "/v1/sessions/plans" || p == "/v1/sessions/commits" {
			return true
		}
		if hasQuery && strings.HasPrefix(p, "/v1/sessions/") && (strings.HasSuffix(p, "/plan") || strings.HasSuffix(p, "/fork")) {
			v, err := url.ParseQuery(q)
			return err == nil && v.Get(RequestIDParam) != ""
		}
		for _, p := range []string{"/v1/alloc/", "/v1/commit/", "/v1/link/", "/v1/servers/heartbeat"} {
			if strings.HasPrefix(path, p) {
				return true
			}
		}
	}
	return false
}

// outcome classifies one attempt's failure.
type outcome int

const (
	done      outcome = iota // an answer (success or a final error)
	untouched                // the master surely did nothing: unreachable, standby, not ready
	unknown                  // the request may have been applied: cut mid-way
)

// Do sends in (JSON, when not nil) and decodes the answer into out (when
// not nil), failing over between masters. While no master leads (one died
// and a standby is taking over, or a new leader waits for heartbeats) it
// retries with backoff for up to RetryFor: any request the master surely did
// not apply, and an Idempotent one whose fate is unknown. A client that has
// never reached any master, and finds every one refusing connections, fails
// at once instead: nothing is running there (a typo, a cluster not started),
// and waiting would only delay saying so.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var ok bool
		if body, ok = appendRequest(nil, in); !ok { // plainenc.go
			var err error
			if body, err = json.Marshal(in); err != nil {
				return err
			}
		}
	}
	bases := c.bases()
	if len(bases) == 0 {
		return errs.New(errs.ErrBadRequest, "no master address: set --master or GD2FS_MASTER")
	}
	retryFor := c.RetryFor
	if retryFor == 0 {
		retryFor = DefaultRetryFor
	}
	deadline := time.Now().Add(retryFor)
	idem := Idempotent(method, path)
	var err error
	ambiguous := false // an earlier attempt may have been applied
	backoff := 50 * time.Millisecond
	for pass := 0; ; pass++ {
		start := int(c.cur.Load())
		allRefused := true
		for i := range bases {
			k := (start + i) % len(bases)
			var o outcome
			o, err = c.do1(ctx, bases[k], method, path, body, in != nil, out)
			if o == unknown && !idem {
				return err // it may have happened: repeating it could do it twice
			}
			if o == done {
				c.cur.Store(int32(k))
				if ambiguous && method == http.MethodDelete && errors.Is(err, errs.ErrNotFound) {
					return nil // the attempt cut short did delete it
				}
				return err
			}
			ambiguous = ambiguous || o == unknown
			allRefused = allRefused && o == untouched && !c.answered.Load()
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if allRefused && !c.answered.Load() {
			return err
		}
		if retryFor < 0 || time.Now().Add(backoff).After(deadline) {
			if retryFor > 0 {
				return fmt.Errorf("no master led within %s: %w", retryFor, err)
			}
			return err
		}
		// Jittered so that many clients do not arrive at a new leader at once.
		t := time.NewTimer(backoff/2 + time.Duration(rand.Int64N(int64(backoff))))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (the call's context ended while waiting for a leader: %v)", err, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// do1 calls one master and says what became of the request.
func (c *Client) do1(ctx context.Context, base, method, path string, body []byte, hasBody bool, out any) (outcome, error) {
	h := make(http.Header, 3)
	if c.Token != "" {
		h.Set("Authorization", "Bearer "+c.Token)
	}
	if hasBody || method == http.MethodPost || method == http.MethodPut {
		// The master takes POST and PUT only as JSON (its guard against
		// web pages), bodiless ones included.
		h.Set("Content-Type", "application/json")
	}
	if c.Role != "" {
		h.Set(RoleHeader, c.Role)
	}
	if c.Frames != nil && Framed(method, path) {
		if o, err, ok := c.doFramed(ctx, base, method, path, h, body, out); ok {
			return o, err
		}
	}
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return done, errs.New(errs.ErrBadRequest, "master address %q: %w", base, err)
	}
	req.Header = h
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return c.failed(ctx, base, err)
	}
	defer resp.Body.Close()
	return c.answer(base, method, path, resp.StatusCode, resp.Status, resp.Header, resp.Body, out)
}

// Framed says which calls go on a framed connection when Client.Frames
// is set: the POSTs of explicit sessions (plans, commits, their batches),
// a chat turn's calls, whose answers are small; and a file's commit (an
// engine's Sync of the KV it saved) and a session file's stat (an
// engine's Open), to a master that says it takes them
// (frames.TakesHeader: an older one would refuse them there).
func Framed(method, path string) bool {
	switch method {
	case http.MethodPost:
		return strings.HasPrefix(path, "/v1/sessions") || strings.HasPrefix(path, "/v1/commit/")
	case http.MethodGet:
		return strings.HasPrefix(path, "/v1/files/kv-sessions/")
	}
	return false
}

// doFramed sends the call on a framed connection (Client.Frames); ok is
// false when it was not sent there (frames.ErrNotUsed): send it as plain
// HTTP. Its failures are classified as a plain call's are: nothing sent
// (the dial or the upgrade failed) is untouched, a call without an answer
// within HTTP.Timeout is unknown (so an idempotent one moves on to the
// next master), the caller's own context ending is final.
func (c *Client) doFramed(ctx context.Context, base, method, path string, h http.Header, body []byte, out any) (o outcome, err error, ok bool) {
	cctx := ctx
	if c.HTTP != nil && c.HTTP.Timeout > 0 {
		// As http.Client bounds a plain call.
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, c.HTTP.Timeout)
		defer cancel()
	}
	a, err := c.Frames.Do(cctx, base, method, path, h, body, Idempotent(method, path))
	if errors.Is(err, frames.ErrNotUsed) {
		return 0, nil, false
	}
	if err != nil {
		if ctx.Err() == nil && cctx.Err() != nil {
			err = fmt.Errorf("no answer within %s: %w", c.HTTP.Timeout, err)
		}
		o, err := c.failed(ctx, base, err)
		return o, err, true
	}
	o, err = c.answer(base, method, path, a.Status, "", a.Header, bytes.NewReader(a.Body), out)
	return o, err, true
}

// failed classifies a call that got no answer; ctx is the caller's.
func (c *Client) failed(ctx context.Context, base string, err error) (outcome, error) {
	if ctx.Err() != nil {
		return done, ctx.Err()
	}
	o := unknown
	switch {
	case isTLSError(err):
		o = done // a certificate or protocol mismatch does not pass
	case isDialError(err), errors.Is(err, frames.ErrNotSent):
		o = untouched
	}
	hint := "is it running? start one with 'gd2fs up' or set --master"
	if isTLSError(err) {
		hint = "TLS failed: check --tls-ca (GD2FS_TLS_CA) names the CA of the master's certificate, --tls-cert/--tls-key where it verifies clients, and https:// in --master"
	}
	return o, errs.New(errs.ErrUnavailable, "master %s unreachable: %w (%s)", base, err, hint)
}

// answer reads a master's answer into out (when not nil) and says what
// became of the request; status is the status line's text ("" to make it
// from code, for an error only).
func (c *Client) answer(base, method, path string, code int, status string, hdr http.Header, body io.Reader, out any) (outcome, error) {
	c.answered.Store(true)
	if code/100 != 2 {
		if status == "" {
			status = fmt.Sprintf("%d %s", code, http.StatusText(code))
		}
		var e Error
		b, _ := io.ReadAll(io.LimitReader(body, 1<<20))
		o := done
		if code == http.StatusServiceUnavailable && (hdr.Get(LeaderHeader) != "" || hdr.Get("Retry-After") != "" || strings.Contains(string(b), "standby")) {
			o = untouched
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			body := strings.TrimSpace(string(b))
			if len(body) > 200 {
				body = body[:200] + "…"
			}
			if code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
				return o, errs.New(errs.ErrInternal, "%s answered %s %s with %s without a gd2fs error: an older master without the route, or not a gd2fs master (check --master) (%s): %w",
					base, method, path, status, body, ErrNoRoute)
			}
			return o, errs.New(errs.ErrInternal, "%s answered %s without a gd2fs error: is it a gd2fs master? check --master (%s)", base, status, body)
		}
		return o, errs.FromCode(e.Code, e.Error)
	}
	if out == nil {
		return done, nil
	}
	if err := readAnswer(body, out); err != nil { // answerjson.go
		// The master answered and then the connection broke: it did the work.
		if idem := Idempotent(method, path); idem {
			return unknown, errs.New(errs.ErrUnavailable, "master %s: answer to %s %s cut short: %w", base, method, path, err)
		}
		return done, fmt.Errorf("decode master answer to %s %s: %w", method, path, err)
	}
	return done, nil
}

// isTLSError: the TLS handshake failed on certificates or the protocol
// (https to a plain-HTTP master): retrying cannot help.
func isTLSError(err error) bool {
	var cv *tls.CertificateVerificationError
	var rh tls.RecordHeaderError
	var ae tls.AlertError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	return errors.As(err, &cv) || errors.As(err, &rh) || errors.As(err, &ae) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) ||
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") || strings.Contains(err.Error(), "tls: ")
}

// isDialError: the connection was never made, so the master got nothing.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// Layout is a model's KV layout.
type Layout = kvlayout.Layout

// KVRange is one entry of stored_kv_cache or fresh_kv_cache (DESIGN.md §6).
type KVRange struct {
	TokenStart  int64  `json:"token_start"`
	TokenLength int64  `json:"token_length"`
	KVURI       string `json:"kv_uri"`
	KVStart     int64  `json:"kv_start"`
	KVLength    int64  `json:"kv_length"`
}

// PlanRequest asks the master, before a request runs, what is cached.
type PlanRequest struct {
	Model        string   `json:"model"`
	Prefixes     []string `json:"prefixes,omitempty"` // shared prefix files, used when the session is created
	PromptTokens int64    `json:"prompt_tokens"`      // may be left out with token_ids
	// The prompt's content, so that stored KV is used only for the very
	// tokens it was computed from (docs/kv-cache.md "The content check"):
	// its token ids, or its block hashes (kvlayout.BlockHashes in the
	// model's page_tokens). A plan needs one of the two, unless
	// UnsafeCountOnly plans on token counts alone — which serves KV of other
	// text after a user edits an earlier message.
	TokenIDs        []uint32             `json:"token_ids,omitempty"`
	BlockHashes     []kvlayout.BlockHash `json:"block_hashes,omitempty"`
	UnsafeCountOnly bool                 `json:"unsafe_count_only,omitempty"`
	DecodeTokens    int64                `json:"decode_tokens,omitempty"` // room for generated tokens in the fresh range
	NewFile         bool                 `json:"new_file,omitempty"`      // put this turn's KV in a new file
	// Format "vllm" answers an EnginePlan: whole blocks, kvcache_params as
	// vLLM's explicit-offloading connector takes it (docs/kv-cache.md).
	Format        string `json:"format,omitempty"`
	LoadThreshold int64  `json:"load_threshold,omitempty"` // passed through in kvcache_params
	// Flags are passed through in kvcache_params.flags (vllm format), e.g.
	// {"prefill-only": true}: the engine then saves only the prompt's range.
	// gd2fs does not interpret them; at most MaxEngineFlags, keys of at most
	// 64 bytes, values JSON scalars.
	Flags map[string]any `json:"flags,omitempty"`
}

// PlanBatchRequest plans many requests in one call (POST /v1/sessions/plans),
// for a scheduler that plans a batch of requests at once: each plan is
// made exactly as POST /v1/sessions/{id}/plan makes it, and the plans of a
// batch share the master's group transactions.
type PlanBatchRequest struct {
	Plans []PlanBatchItem `json:"plans"`
}

// PlanBatchItem is one plan of a batch: the session, the request id that
// makes a repeat of the batch answer this plan as the first time
// (RequestIDParam), and the plan request.
type PlanBatchItem struct {
	Session   string      `json:"session"`
	RequestID string      `json:"request_id,omitempty"`
	Plan      PlanRequest `json:"plan"`
}

// PlanBatchAnswer answers a PlanBatchRequest, one result per plan in order.
type PlanBatchAnswer struct {
	Plans []PlanBatchResult `json:"plans"`
}

// PlanBatchResult is a Plan (or, with format vllm or sglang, an
// EnginePlan) or the error that plan alone met.
type PlanBatchResult struct {
	Plan  json.RawMessage `json:"plan,omitempty"`
	Error *Error          `json:"error,omitempty"`
}

// MaxPlanBatch bounds the plans of one PlanBatchRequest.
const MaxPlanBatch = 256

// CommitBatchRequest commits many plans in one call, as a client
// coalesces the commits of its concurrent turns: each is checked and
// recorded exactly as POST /v1/sessions/{id}/commit checks and records it,
// and the commits of a batch share the master's group transactions and
// one round of questions to the servers.
//
// Two routes take it. POST /v1/sessions/commits takes plain commits only
// (a plan id, written or not) and refuses an item with Fresh. POST
// /v1/sessions/commits/saved takes engine commits too (an item with
// Fresh: what the engine saved). The split is for masters from before
// engine items: they decode an item strictly, and would refuse the whole
// batch at the first route; at the second they answer 404, so a client
// learns to send its engine commits one at a time, and no master ever
// records an engine commit as a plain one.
type CommitBatchRequest struct {
	Commits []CommitBatchItem `json:"commits"`
}

// CommitBatchItem is one commit of a batch: session Session's plan PlanID,
// whose whole fresh range was written (Written: into the chunks of the
// plan's fresh_files, without a Sync), or — Fresh not nil, at
// /v1/sessions/commits/saved only — whose engine saved the segments
// *Fresh (CommitSessionRequest.Fresh; at most limits.MaxSavedSegments).
type CommitBatchItem struct {
	Session string     `json:"session"`
	PlanID  int64      `json:"plan_id"`
	Written bool       `json:"written,omitempty"`
	Fresh   *[]KVRange `json:"fresh_kvcache,omitempty"`
}

// CommitBatchAnswer answers a CommitBatchRequest, one result per commit in
// order.
type CommitBatchAnswer struct {
	Commits []CommitBatchResult `json:"commits"`
}

// CommitBatchResult is the session as the commit left it, or the error
// that commit alone met.
type CommitBatchResult struct {
	Session *Session `json:"session,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// MaxCommitBatch bounds the commits of one CommitBatchRequest.
const MaxCommitBatch = 256

// MaxEngineFlags bounds PlanRequest.Flags.
const MaxEngineFlags = 16

// CheckEngineFlags says what is wrong with plan flags, nil when nothing:
// they are copied into every plan answer, so they are kept small.
func CheckEngineFlags(f map[string]any) error {
	if len(f) > MaxEngineFlags {
		return fmt.Errorf("%d flags: at most %d", len(f), MaxEngineFlags)
	}
	for k, v := range f {
		if k == "" || len(k) > 64 {
			return fmt.Errorf("flag name %q: want 1 to 64 bytes", k)
		}
		switch x := v.(type) {
		case bool, float64, nil:
		case string:
			if len(x) > 256 {
				return fmt.Errorf("flag %q: value over 256 bytes", k)
			}
		default:
			return fmt.Errorf("flag %q: value must be a boolean, number, string or null, not %T", k, v)
		}
	}
	return nil
}

// KVCacheParams is vLLM's kv_transfer_params["kvcache_params"]: what to load
// before prefill (stored_kvcache) and where to save new KV (fresh_kvcache);
// in the engine's answer, fresh_kvcache is what it actually saved.
//
// It is the one place where gd2fs decodes JSON leniently: an engine answers
// with its own kvcache_params (vLLM's newest connector adds "flags", and may
// add more), and those answers are not ours to be strict about. Unknown
// fields here, and in its segments, are ignored; everywhere else in the API
// an unknown field is still a 400.
type KVCacheParams struct {
	ID            string         `json:"id"`
	Stored        []KVRange      `json:"stored_kvcache"`
	Fresh         []KVRange      `json:"fresh_kvcache"`
	LoadThreshold int64          `json:"load_threshold"`
	Flags         map[string]any `json:"flags,omitempty"` // the plan request's flags, passed through
}

// UnmarshalJSON decodes kvcache_params ignoring unknown fields (see
// KVCacheParams): a strict decoder of an enclosing request calls it, and
// the plain decoder used here is not strict.
func (k *KVCacheParams) UnmarshalJSON(b []byte) error {
	type plain KVCacheParams // no methods: no recursion
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*k = KVCacheParams(p)
	return nil
}

// EnginePlan is a plan in the vllm format: pass it (or just its
// kvcache_params) as the request's kv_transfer_params.
type EnginePlan struct {
	KVCacheParams KVCacheParams `json:"kvcache_params"`
	PlanID        int64         `json:"plan_id"`
	CachedTokens  int64         `json:"cached_tokens"`
	// VerifiedTokens: the prompt's leading tokens whose content matched
	// what the session stored (the whole prompt on counts alone).
	VerifiedTokens int64 `json:"verified_tokens"`
	// Shortened says why the stored part ends before what the session
	// holds for the prompt: "server_down" (bytes on a server that is down;
	// an engine is never sent there), ShortenedTokens by how many tokens.
	Shortened       string   `json:"shortened,omitempty"`
	ShortenedTokens int64    `json:"shortened_tokens,omitempty"`
	PrefillTokens   int64    `json:"prefill_tokens"`
	DecodeTokens    int64    `json:"decode_tokens"`
	LoadBytes       int64    `json:"load_bytes"`
	HitRate         float64  `json:"hit_rate"`
	Evicted         []string `json:"evicted_sessions,omitempty"`
}

// Plan is the answer: exactly which ranges are stored and where new KV goes.
type Plan struct {
	PlanID          int64     `json:"plan_id"`
	Stored          []KVRange `json:"stored_kv_cache"`
	Fresh           []KVRange `json:"fresh_kv_cache"`
	CachedTokens    int64     `json:"cached_tokens"`
	VerifiedTokens  int64     `json:"verified_tokens"`            // as in EnginePlan
	Shortened       string    `json:"shortened,omitempty"`        // as in EnginePlan
	ShortenedTokens int64     `json:"shortened_tokens,omitempty"` // as in EnginePlan
	PrefillTokens   int64     `json:"prefill_tokens"`
	DecodeTokens    int64     `json:"decode_tokens"`
	LoadBytes       int64     `json:"load_bytes"`
	HitRate         float64   `json:"hit_rate"`
	Evicted         []string  `json:"evicted_sessions,omitempty"`
	// FreshFiles: the files of the fresh ranges with the chunks that hold
	// their bytes, already allocated, so a client writes them with no
	// master call and commits with Written (docs/kv-cache.md, "What a turn
	// costs"). Absent when the master could not place them.
	FreshFiles []File `json:"fresh_files,omitempty"`
}

// CommitSessionRequest commits a plan: its whole fresh range, or what the
// engine saved of it — the kvcache_params of the engine's kv_transfer_params,
// or a fresh_kvcache list (present and empty: nothing was saved). Without a
// plan_id the plan is found by the first saved segment.
type CommitSessionRequest struct {
	PlanID        int64          `json:"plan_id,omitempty"`
	KVCacheParams *KVCacheParams `json:"kvcache_params,omitempty"`
	Fresh         *[]KVRange     `json:"fresh_kvcache,omitempty"`
	// Written: the committed bytes were written into the chunks the plan's
	// fresh_files named, without a Sync; the commit records their size.
	Written bool `json:"written,omitempty"`
}

// ForkRequest names the new session of a fork.
type ForkRequest struct {
	NewID string `json:"new_id"`
}

// Session is a session and its committed ranges.
type Session struct {
	ID       string    `json:"id"`
	Model    string    `json:"model"`
	Tokens   int64     `json:"tokens"`
	Bytes    int64     `json:"bytes"`
	LastUsed time.Time `json:"last_used"`
	Created  time.Time `json:"created"`
	Ranges   []KVRange `json:"ranges,omitempty"`
	// HashedTokens: the leading tokens whose content the session's block
	// hashes record; plans that check content use nothing stored past them.
	HashedTokens int64 `json:"hashed_tokens"`
}

// SessionList is a page of sessions ordered by id.
type SessionList struct {
	Sessions []Session `json:"sessions"`
}

// URI is a parsed gd2fs:// URI. Two forms name a file:
//
//	gd2fs://<cluster>/<path>                                  (Cluster set)
//	gd2fs://<host:port>[,<host:port>...]/<path>?cluster=<name> (Masters set; Cluster from the query, may be empty)
//
// The second is what engine-format plans hand out: everything a process
// needs to connect. An authority with a ':' or ',' is a master list.
type URI struct {
	Masters []string // host:port of masters, in order
	Cluster string
	Path    string // absolute, as written (not cleaned)
}

// ParseURI parses a gd2fs:// URI of either form.
func ParseURI(s string) (URI, error) {
	rest, ok := strings.CutPrefix(s, "gd2fs://")
	if !ok {
		return URI{}, errs.New(errs.ErrBadRequest, "%q is not a gd2fs:// URI: write gd2fs://<cluster>/<path> or gd2fs://<host:port>[,<host:port>]/<path>?cluster=<name>", s)
	}
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		return URI{}, errs.New(errs.ErrBadRequest, "%q: a gd2fs URI has no #fragment", s)
	}
	rest, query, hasQuery := strings.Cut(rest, "?")
	auth, path, ok := strings.Cut(rest, "/")
	if !ok || auth == "" {
		return URI{}, errs.New(errs.ErrBadRequest, "%q needs a cluster or master address and a path: gd2fs://<cluster>/<path>", s)
	}
	u := URI{Path: "/" + path}
	if strings.ContainsAny(auth, ":,") {
		for _, a := range strings.Split(auth, ",") {
			host, port, err := net.SplitHostPort(a)
			if err != nil || host == "" {
				return URI{}, errs.New(errs.ErrBadRequest, "%q: master address %q is not host:port", s, a)
			}
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return URI{}, errs.New(errs.ErrBadRequest, "%q: master address %q has no valid port", s, a)
			}
			u.Masters = append(u.Masters, a)
		}
	} else {
		u.Cluster = auth
	}
	if hasQuery {
		q, err := url.ParseQuery(query)
		if err != nil {
			return URI{}, errs.New(errs.ErrBadRequest, "%q: bad query: %w", s, err)
		}
		for k, v := range q {
			switch {
			case k != "cluster" || len(v) != 1:
				return URI{}, errs.New(errs.ErrBadRequest, "%q: the only query parameter is one cluster=<name>, not %q", s, k)
			case u.Cluster != "" && u.Cluster != v[0]:
				return URI{}, errs.New(errs.ErrBadRequest, "%q names cluster %q twice differently", s, u.Cluster)
			}
			u.Cluster = v[0]
		}
	}
	return u, nil
}
