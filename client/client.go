// Package client is the gd2fs Go SDK. It asks the master where chunks are,
// caches the answer per open file, and then moves bytes directly between the
// caller's buffers and the data servers, splitting large transfers into
// pieces that run in parallel over several TCP streams to several servers.
//
//	c, err := client.New(client.Config{Master: "http://127.0.0.1:7070"})
//	f, err := c.Create(ctx, "/models/m/w.bin", client.CreateOptions{Pool: "ha"})
//	f.Write(data)
//	f.Close()                       // commits the size and seals the file
//	g, err := c.Open(ctx, "/models/m/w.bin")
//	g.ReadAt(buf, 0)                // straight into buf
//
// Errors wrap the sentinels of package errs (errs.ErrNotFound,
// errs.ErrUnavailable, errs.ErrSealed, ...); test them with errors.Is.
package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/frames"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

// Config configures a client.
type Config struct {
	Master    string // master URL, or several comma-separated; default http://127.0.0.1:7070
	Token     string // cluster token
	Streams   int    // TCP connections per server (default 4)
	PieceSize int    // bytes per data-plane request (default 4 MiB)
	Parallel  int    // requests in flight per transfer (default 16)
	// Timeout and MinRate bound every data-plane request: it may take
	// Timeout + bytes/MinRate (defaults 10s and 8 MiB/s: 10.5s for a 4 MiB
	// piece) before the server counts as not answering; reads then go to
	// another replica, writes fail with errs.ErrUnavailable.
	Timeout time.Duration
	MinRate int64 // bytes per second
	// MasterRetry bounds how long a master call keeps retrying, with
	// backoff, while no master leads (a failover): default 30s; negative:
	// one try of each master.
	MasterRetry time.Duration
	LocalAddrs  []string // local IPs to bind, one per NIC
	// RefillWait bounds how long a read of a linked file keeps asking the
	// master to re-place a chunk whose servers failed, and retrying it,
	// before it gives up (default 30s; refill.go).
	RefillWait time.Duration
	// Transport is the data plane (transport.go); nil: the TCP transport
	// (NewTCPTransport with Token, Streams, LocalAddrs and TLS). The client
	// closes it on Close.
	Transport Transport
	// TLS runs the master API and the data plane over TLS with this
	// configuration (RootCAs: the cluster's CA; Certificates: a client
	// certificate where servers require one). With TLS nil, an https://
	// master turns TLS on with the system roots.
	TLS *tls.Config
	// NoCoalesce sends every Sessions().Plan, PlanEngine and commit
	// (Commit, WriteAndCommit, CommitSaved) as its own master request. By
	// default a client's concurrent plans, and its concurrent commits, go
	// to the master together in batches (coalesce.go; docs/kv-cache.md,
	// "What a turn costs").
	NoCoalesce bool
	// CoalesceInFlight is how many batches of each kind (plans, engine
	// plans, plain commits, engine commits) a client keeps in flight to
	// the master before further calls of that kind queue for the next
	// batch: default DefaultCoalesceInFlight; negative: no coalescing, as
	// NoCoalesce.
	CoalesceInFlight int
	// PlainHTTP sends every master call as an HTTP request. By default a
	// client sends its explicit-session calls (plans, commits, their
	// batches) over persistent framed connections to a master that takes
	// them (package internal/frames; docs/kv-cache.md, "What a turn
	// costs"), which cost fewer wake-ups a call than net/http's; its
	// other calls, and all calls to a master from before them, go as HTTP.
	PlainHTTP bool
}

// Client talks to one gd2fs cluster. It is safe for concurrent use.
type Client struct {
	cfg Config
	api *api.Client
	tr  Transport
	ms  membership  // cached KV membership map
	hl  health      // servers that recently missed a deadline
	co  *coalescers // nil: no coalescing (coalesce.go)

	fromServers, coldFilled, refills atomic.Int64
}

// ReadStats counts file bytes this client read.
type ReadStats struct {
	FromServers int64 // every byte read from data servers
	ColdFilled  int64 // of those, bytes of reads that waited for a fill from S3
	// Refills: chunks of linked files this client had the master move to
	// another server because their server failed (refill.go).
	Refills int64
}

// ReadStats returns the client's read counters.
func (c *Client) ReadStats() ReadStats {
	return ReadStats{FromServers: c.fromServers.Load(), ColdFilled: c.coldFilled.Load(), Refills: c.refills.Load()}
}

// DefaultMaster is where `gd2fs up` listens.
const DefaultMaster = "http://127.0.0.1:7070"

// New returns a client. It does not contact the cluster until used.
func New(cfg Config) (*Client, error) {
	if cfg.Master == "" {
		cfg.Master = DefaultMaster
	}
	// Several masters (sharing PostgreSQL) are given comma-separated.
	ms := strings.Split(cfg.Master, ",")
	for i, m := range ms {
		m = strings.TrimSpace(m)
		if !strings.HasPrefix(m, "http://") && !strings.HasPrefix(m, "https://") {
			m = "http://" + m
		}
		ms[i] = m
	}
	cfg.Master = strings.Join(ms, ",")
	if cfg.TLS == nil && strings.Contains(cfg.Master, "https://") {
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if cfg.PieceSize <= 0 {
		cfg.PieceSize = 4 << 20
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 16
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MinRate <= 0 {
		cfg.MinRate = DefaultMinRate
	}
	if cfg.RefillWait <= 0 {
		cfg.RefillWait = DefaultRefillWait
	}
	tr := cfg.Transport
	if tr == nil {
		tr = NewTCPTransport(TCPOptions{Token: cfg.Token, Name: "client", Streams: cfg.Streams, LocalAddrs: cfg.LocalAddrs, TLS: cfg.TLS})
	}
	mt := masterTransport(cfg.TLS)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: mt}
	c := &Client{cfg: cfg, tr: tr, api: &api.Client{Base: cfg.Master, Token: cfg.Token, HTTP: hc, RetryFor: cfg.MasterRetry}}
	if !cfg.PlainHTTP {
		// The upgrade passes the master's token check as any call does;
		// each call on the connection carries the token again.
		up := http.Header{}
		if cfg.Token != "" {
			up.Set("Authorization", "Bearer "+cfg.Token)
		}
		c.api.Frames = &frames.Client{Transport: mt, Header: up}
	}
	c.co = newCoalescers(c)
	return c, nil
}

// masterIdleConns is how many idle connections to each master a client
// keeps. net/http's default is 2 a host: a client with more calls in flight
// (a router planning 64 chats at once) dialed a new connection for most of
// them and closed it after, a TCP handshake on every plan's path.
const masterIdleConns = 256

// masterTransport is the client's HTTP transport to the masters (HTTP/1.1,
// as before: no HTTP/2 over TLS).
func masterTransport(tlsConf *tls.Config) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsConf
	tr.ForceAttemptHTTP2 = false
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = masterIdleConns, masterIdleConns
	return tr
}

// Close releases connections.
func (c *Client) Close() error {
	c.tr.Close()
	c.api.HTTP.CloseIdleConnections()
	if c.api.Frames != nil {
		c.api.Frames.Close()
	}
	return nil
}

// FileInfo describes a file or directory.
type FileInfo struct {
	// ID tells this file from any other that has, or will have, its name
	// (after a remove, rename or replace): the master never reuses one.
	ID        int64
	Attrs     map[string]string // "source", "etag", "sha256"
	Path      string
	IsDir     bool
	Pool      string
	ChunkSize int64
	Size      int64
	Sealed    bool
	// CommitRecordsSize: a session's file (one a plan made), whose bytes a
	// session commit records once the servers hold them, so a writer of a
	// plan's fresh range need not Sync before the commit (docs/kv-cache.md,
	// "An engine's turn without a Sync"). False from older masters.
	CommitRecordsSize bool
	Modified          time.Time
	Chunks            []ChunkInfo
}

// ChunkInfo says where a chunk lives.
type ChunkInfo struct {
	Index, Length int64
	ID            uint64
	Replicas      []ReplicaInfo
}

// ReplicaInfo is one copy of a chunk.
type ReplicaInfo struct {
	Server, Addr string
	Up           bool
}

func infoOf(f api.File) FileInfo {
	fi := FileInfo{ID: f.ID, Attrs: f.Attrs, Path: f.Path, IsDir: f.IsDir, Pool: f.Pool, ChunkSize: f.ChunkSize, Size: f.Size, Sealed: f.Sealed, CommitRecordsSize: f.CommitRecordsSize, Modified: f.Modified}
	for _, c := range f.Chunks {
		ci := ChunkInfo{Index: c.Index, Length: c.Length, ID: c.ID}
		for _, r := range c.Replicas {
			ci.Replicas = append(ci.Replicas, ReplicaInfo{Server: r.Server, Addr: r.Addr, Up: r.Up})
		}
		fi.Chunks = append(fi.Chunks, ci)
	}
	return fi
}

// urlPath validates a namespace path and escapes it for the master's URLs.
func urlPath(p string) (string, error) {
	clean, err := nspath.Clean(p)
	if err != nil {
		return "", err
	}
	return "/" + api.EscapePath(clean), nil
}

// call is api.Client.Do for a route that takes a namespace path.
func (c *Client) call(ctx context.Context, method, route, path string, in, out any) error {
	u, err := urlPath(path)
	if err != nil {
		return err
	}
	return c.api.Do(ctx, method, route+u, in, out)
}

// Stat describes path, with its chunks and their replicas.
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var f api.File
	if err := c.call(ctx, "GET", "/v1/files", path, nil, &f); err != nil {
		return FileInfo{}, err
	}
	return infoOf(f), nil
}

// List returns the entries of directory dir.
func (c *Client) List(ctx context.Context, dir string) ([]FileInfo, error) {
	var l api.Listing
	if err := c.call(ctx, "GET", "/v1/list", dir, nil, &l); err != nil {
		return nil, err
	}
	out := make([]FileInfo, len(l.Entries))
	for i, e := range l.Entries {
		out[i] = infoOf(e)
	}
	return out, nil
}

// SetAttrs sets attributes of a file ("sha256", ...); an empty value removes one.
func (c *Client) SetAttrs(ctx context.Context, path string, attrs map[string]string) error {
	return c.call(ctx, "PUT", "/v1/attrs", path, attrs, nil)
}

// LinkOptions choose a linked file's pool and chunk size.
type LinkOptions struct {
	Pool      string // default perf: the object store keeps the durable copy
	ChunkSize int64
}

// Link registers path as the object at source (s3://bucket/key) of size
// bytes and etag: no bytes move now; each chunk is fetched from S3 by the
// server that owns it on first read, once however many clients ask.
func (c *Client) Link(ctx context.Context, path, source string, size int64, etag string, o LinkOptions) (FileInfo, error) {
	var f api.File
	err := c.call(ctx, "POST", "/v1/link", path, api.LinkRequest{Source: source, Size: size, ETag: etag, Pool: o.Pool, ChunkSize: o.ChunkSize}, &f)
	return infoOf(f), err
}

// Walk lists every file under dir, recursively, in path order.
func (c *Client) Walk(ctx context.Context, dir string) ([]FileInfo, error) {
	es, err := c.List(ctx, dir)
	if err != nil {
		return nil, err
	}
	var out []FileInfo
	for _, e := range es {
		if !e.IsDir {
			out = append(out, e)
			continue
		}
		sub, err := c.Walk(ctx, e.Path)
		if err != nil {
			return nil, err
		}
		out = append(out, sub...)
	}
	return out, nil
}

// Mkdir creates dir and its parents.
func (c *Client) Mkdir(ctx context.Context, dir string) error {
	return c.call(ctx, "PUT", "/v1/dirs", dir, nil, nil)
}

// Remove deletes a file, or an empty directory. A file's chunks are freed by
// their servers shortly after.
func (c *Client) Remove(ctx context.Context, path string) error {
	return c.call(ctx, "DELETE", "/v1/files", path, nil, nil)
}

// RenameOptions tune Rename.
type RenameOptions struct {
	// NoReplace refuses to replace an existing file at the new name
	// (errs.ErrExists), as `mv -n` does.
	NoReplace bool
}

// Rename moves a sealed file, or a directory with everything under it, to
// to, in one step on the master: readers see the old name or the new one.
// An existing sealed file at to is replaced (POSIX rename), unless
// o.NoReplace; a file still being written, or held by a KV session, is
// errs.ErrBusy. The file keeps its bytes, chunks and attributes (a linked
// file its S3 source), so nothing is copied. It returns what is now at to.
func (c *Client) Rename(ctx context.Context, from, to string, o RenameOptions) (FileInfo, error) {
	dst, err := nspath.Clean(to)
	if err != nil {
		return FileInfo{}, err
	}
	var f api.File
	// The request id makes a retried rename (its first answer lost in a
	// master failover) succeed instead of failing "not found".
	req := api.RenameRequest{To: dst, NoReplace: o.NoReplace, RequestID: requestID()}
	err = c.call(ctx, "POST", "/v1/rename", from, req, &f)
	return infoOf(f), err
}

// Status is the cluster overview: servers, pools, totals.
type Status = api.Status

// Status asks the master for the cluster overview.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.api.Do(ctx, "GET", "/v1/status", nil, &st)
	return st, err
}

// CreateOptions choose a new file's pool and chunk size.
type CreateOptions struct {
	Pool      string // "ha" (default, 3 replicas) or "perf" (1 replica)
	ChunkSize int64  // default 16 MiB; a multiple of 64 KiB
	Overwrite bool   // remove an existing file of that name first
}

// Create makes a new file open for writing.
func (c *Client) Create(ctx context.Context, path string, o CreateOptions) (*File, error) {
	if o.Overwrite {
		if err := c.Remove(ctx, path); err != nil && !errors.Is(err, errs.ErrNotFound) {
			return nil, err
		}
	}
	var f api.File
	// The request id makes a retried create (its first answer lost in a
	// master failover) find the file it made instead of failing "exists".
	req := api.CreateRequest{Pool: o.Pool, ChunkSize: o.ChunkSize, RequestID: requestID()}
	if err := c.call(ctx, "PUT", "/v1/files", path, req, &f); err != nil {
		return nil, err
	}
	x := newFile(c, f)
	x.created = true
	return x, nil
}

// requestID is a random id for an idempotent request.
func requestID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Open opens an existing file. Reads use the chunk map fetched now (and
// refreshed when every replica of a chunk fails); writes are possible until
// the file is sealed.
func (c *Client) Open(ctx context.Context, path string) (*File, error) {
	var f api.File
	if err := c.call(ctx, "GET", "/v1/files", path, nil, &f); err != nil {
		return nil, err
	}
	if f.IsDir {
		return nil, errs.New(errs.ErrIsDir, "%s is a directory", path)
	}
	return newFile(c, f), nil
}
