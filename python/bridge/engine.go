// Package bridge is the Go half of pygd2fs, the Python client. The cgo
// package python/capi exports it as C functions in a shared library that
// Python loads with ctypes; everything that is not pointer conversion lives
// here, in plain Go, so it is tested with the race detector like the rest.
//
// An Engine is one Python client: a client.Client plus
//   - a table of IOMEMs, the memory ranges the caller registered; every
//     scatter-gather element (SGE) of a transfer must lie inside a live one,
//     which is what keeps a wrong address from reaching the socket reader;
//   - non-blocking transfers (Submit) that complete into one of two queues,
//     the Wait queue and the asyncio queue, each with an eventfd that is
//     readable while completions are waiting (Python's event loops watch it);
//   - a cache of open files per path, so a 4 KiB read costs one data-plane
//     round trip, not a master lookup as well.
//
// Bytes move between the sockets and the caller's memory directly: an SGE is
// turned into a []byte over the caller's memory (unsafe.Slice) and handed to
// the client's ReadAt/WriteAt, which read the socket straight into it.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
)

// Config is what pygd2fs.Client (or pygd2fs.connect) was given.
type Config struct {
	// CPAddr: control-plane addresses, comma-separated: gd2fs://host:port
	// (the masters), or http(s)://host:port, or a bare host:port.
	CPAddr string
	// DPAddr: data-plane kind and local address, comma-separated for several
	// NICs: tcp://10.0.0.5. A loopback or unspecified address lets the kernel
	// choose. rdma:// is refused (no RDMA in this build).
	DPAddr string
	// Cluster must equal the master's cluster name; "" skips the check.
	Cluster string
	Token   string
	// IOThreads bounds the transfers that run at once (others queue).
	IOThreads int
	// MemThreads is accepted for compatibility; the TCP data plane reads the
	// sockets straight into the caller's memory and copies nothing.
	MemThreads int
	// Streams is the number of TCP connections per data server.
	Streams int
}

// ParseMasters turns a control-plane address list into master URLs.
func ParseMasters(s string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		scheme := "http"
		if i := strings.Index(a, "://"); i >= 0 {
			switch sch := strings.ToLower(a[:i]); sch {
			case "gd2fs", "http":
			case "https":
				scheme = "https"
			default:
				return nil, errs.New(errs.ErrBadRequest, "control-plane address %q: unknown scheme %q (write gd2fs://host:port)", a, sch)
			}
			a = a[i+3:]
		}
		if strings.ContainsAny(a, "/?#") {
			return nil, errs.New(errs.ErrBadRequest, "control-plane address %q: only host:port is allowed here, no path or query", a)
		}
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, errs.New(errs.ErrBadRequest, "control-plane address %q: want host:port (e.g. gd2fs://10.0.0.1:7070)", a)
		}
		out = append(out, scheme+"://"+a)
	}
	if len(out) == 0 {
		return nil, errs.New(errs.ErrBadRequest, "no control-plane address: give gd2fs://host:port[,host:port]")
	}
	return out, nil
}

// ParseDataPlane checks a data-plane address list and returns the local IPs
// to bind (none for loopback or unspecified addresses).
func ParseDataPlane(s string) ([]string, error) {
	var local []string
	n := 0
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		n++
		u, err := url.Parse(a)
		if err != nil || !strings.Contains(a, "://") {
			return nil, errs.New(errs.ErrBadRequest, "data-plane address %q: want tcp://<local address>", a)
		}
		switch strings.ToLower(u.Scheme) {
		case "tcp":
		case "rdma":
			return nil, errs.New(errs.ErrBadRequest, "data-plane address %q: RDMA data plane not available in this build; use tcp://<local address>", a)
		default:
			return nil, errs.New(errs.ErrBadRequest, "data-plane address %q: unknown kind %q (tcp is the one this build has)", a, u.Scheme)
		}
		host := u.Hostname()
		if host == "" {
			continue
		}
		ip := net.ParseIP(host)
		if ip == nil {
			return nil, errs.New(errs.ErrBadRequest, "data-plane address %q: %q is not an IP address", a, host)
		}
		if ip.IsUnspecified() {
			continue // the kernel picks the source address
		}
		// A loopback address is bound for loopback servers only (rpc's
		// Pool.localFor), so the default tcp://127.0.0.1 works whatever the
		// cluster; any other must be this machine's.
		if !ip.IsLoopback() && !isLocal(ip) {
			return nil, errs.New(errs.ErrBadRequest, "data-plane address %q: %s is not an address of this machine", a, ip)
		}
		local = append(local, ip.String())
	}
	if n == 0 {
		return nil, errs.New(errs.ErrBadRequest, "no data-plane address: give tcp://<local address>, e.g. tcp://127.0.0.1")
	}
	return local, nil
}

func isLocal(ip net.IP) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// Engine is one Python client. It is safe for concurrent use.
type Engine struct {
	c       *client.Client
	cfg     Config
	cluster string // the master's cluster name

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	sem    chan struct{} // IOThreads transfers at once
	wg     sync.WaitGroup
	closed atomic.Bool

	mem    iomems
	files  fileCache
	queues [numQueues]*queue

	// deadline bounds a whole transfer (transferDeadline); queued counts
	// the bytes of transfers submitted and not yet completed.
	deadline struct {
		timeout, masterRetry time.Duration
		minRate              int64
	}
	queued atomic.Int64

	mu      sync.Mutex
	nextID  uint64
	cancels map[uint64]context.CancelFunc // transfers in flight
	handles map[uint64]*client.File       // files of the Pythonic layer
}

// New connects to the cluster: it asks the master for its status, so a wrong
// address or cluster name fails here, not on the first transfer.
func New(cfg Config) (*Engine, error) {
	masters, err := ParseMasters(cfg.CPAddr)
	if err != nil {
		return nil, err
	}
	local, err := ParseDataPlane(cfg.DPAddr)
	if err != nil {
		return nil, err
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"iothreads", cfg.IOThreads}, {"memthreads", cfg.MemThreads}, {"streams", cfg.Streams}} {
		if v.n < 1 || v.n > 1024 {
			return nil, errs.New(errs.ErrBadRequest, "%s = %d: want 1..1024", v.name, v.n)
		}
	}
	cc := client.Config{Master: strings.Join(masters, ","), Token: cfg.Token, Streams: cfg.Streams, LocalAddrs: local}
	// Engines construct Client with their own arguments: the data-plane
	// timeout and the failover wait come from GD2FS_IO_TIMEOUT and
	// GD2FS_MASTER_RETRY.
	if err := cc.ApplyEnv(); err != nil {
		return nil, err
	}
	c, err := client.New(cc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	st, err := c.Status(ctx)
	cancel()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("cannot reach the gd2fs master at %s: %w", strings.Join(masters, ","), err)
	}
	if cfg.Cluster != "" && cfg.Cluster != st.Cluster {
		c.Close()
		return nil, errs.New(errs.ErrBadRequest, "cluster %q was asked for, but the master at %s serves cluster %q: fix the cluster name or the address", cfg.Cluster, strings.Join(masters, ","), st.Cluster)
	}
	e := &Engine{c: c, cfg: cfg, cluster: st.Cluster, sem: make(chan struct{}, cfg.IOThreads),
		cancels: map[uint64]context.CancelFunc{}, handles: map[uint64]*client.File{}}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.deadline.timeout, e.deadline.minRate, e.deadline.masterRetry = cc.Timeout, cc.MinRate, cc.MasterRetry
	if e.deadline.timeout <= 0 {
		e.deadline.timeout = client.DefaultTimeout
	}
	if e.deadline.minRate <= 0 {
		e.deadline.minRate = client.DefaultMinRate
	}
	switch {
	case e.deadline.masterRetry == 0:
		e.deadline.masterRetry = api.DefaultRetryFor
	case e.deadline.masterRetry < 0:
		e.deadline.masterRetry = 0
	}
	e.mem.init()
	e.files.init(c)
	for i := range e.queues {
		q, err := newQueue()
		if err != nil {
			e.closeQueues()
			c.Close()
			return nil, err
		}
		e.queues[i] = q
	}
	return e, nil
}

// transferDeadline bounds a whole Read or Write, so that an engine waiting
// on a load always gets an answer: a stopped server (SIGSTOP, a link cut
// without a reset) ends it as a failed transfer, which the engine reports
// as invalid blocks and recomputes, instead of holding the request forever.
// It is the Go client's per-request deadline scaled to the transfer
// (GD2FS_IO_TIMEOUT, default 10s, plus 1s per 8 MiB), as KV calls have,
// where n counts the transfer's bytes and those submitted before it that
// are still queued or moving (engines submit a whole load at once and
// IOThreads run at a time: the last of them waits for the others). A write
// also makes its bytes visible at the master (Sync), which may wait out a
// master failover (GD2FS_MASTER_RETRY, default 30s); a load does not wait
// for one: recomputing is sooner.
func (e *Engine) transferDeadline(op Op, n int64) time.Duration {
	secs := min(float64(n)/float64(e.deadline.minRate), 24*3600) // a Duration holds 292 years; never overflow it
	d := e.deadline.timeout + time.Duration(secs*float64(time.Second))
	if op == OpWrite {
		d += e.deadline.masterRetry
	}
	return d
}

// admit counts a transfer of n bytes as queued (the caller subtracts n
// from e.queued when it completes) and returns its deadline.
func (e *Engine) admit(op Op, n int64) time.Duration {
	ahead := e.queued.Add(n) - n
	return e.transferDeadline(op, ahead+n)
}

// Client is the underlying Go client (benchmarks compare against it).
func (e *Engine) Client() *client.Client { return e.c }

// Cluster is the master's cluster name.
func (e *Engine) Cluster() string { return e.cluster }

func (e *Engine) id() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nextID++
	return e.nextID
}

func (e *Engine) closeQueues() {
	for _, q := range e.queues {
		if q != nil {
			q.close()
		}
	}
}

// Close cancels the transfers in flight, waits for them to end (so no
// goroutine touches the caller's memory afterwards) and releases the
// connections.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	e.cancel()
	e.wg.Wait()
	e.closeQueues()
	return e.c.Close()
}

func (e *Engine) alive() error {
	if e.closed.Load() {
		return errs.New(errs.ErrBadRequest, "client is closed")
	}
	return nil
}

// Status codes: Request.Status() and the negative numbers of the batch calls.
// pygd2fs/errors.py holds the same table.
const (
	OK            = 0
	CodeNotFound  = 1
	CodeExists    = 2
	CodeNotEmpty  = 3
	CodeIsDir     = 4
	CodeNotDir    = 5
	CodeSealed    = 6
	CodeNoSpace   = 7
	CodeUnavail   = 8
	CodeChecksum  = 9
	CodeRange     = 10
	CodeBadReq    = 11
	CodeTooLarge  = 12
	CodeUnauth    = 13
	CodeVersion   = 14
	CodeUnknownOp = 15
	CodeMoved     = 16
	CodeInternal  = 17
	CodeCancelled = 18
	CodeTimeout   = 19
)

var codeOf = []struct {
	err  error
	code int
}{
	{errs.ErrNotFound, CodeNotFound}, {errs.ErrExists, CodeExists}, {errs.ErrNotEmpty, CodeNotEmpty},
	{errs.ErrIsDir, CodeIsDir}, {errs.ErrNotDir, CodeNotDir}, {errs.ErrSealed, CodeSealed},
	{errs.ErrNoSpace, CodeNoSpace}, {errs.ErrUnavailable, CodeUnavail}, {errs.ErrChecksum, CodeChecksum},
	{errs.ErrOutOfRange, CodeRange}, {errs.ErrBadRequest, CodeBadReq}, {errs.ErrTooLarge, CodeTooLarge},
	{errs.ErrUnauthorized, CodeUnauth}, {errs.ErrVersion, CodeVersion}, {errs.ErrUnknownOp, CodeUnknownOp},
	{errs.ErrMoved, CodeMoved}, {errs.ErrInternal, CodeInternal},
	{context.Canceled, CodeCancelled}, {context.DeadlineExceeded, CodeTimeout},
}

// Code is the status code of err (0 for nil). A network error of no known
// kind (a refused connection, say) is Unavailable: the data is not
// reachable; anything else unknown is Internal.
func Code(err error) int {
	if err == nil {
		return OK
	}
	for _, c := range codeOf {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return CodeUnavail
	}
	return CodeInternal
}
