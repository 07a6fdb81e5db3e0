package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// Slow is not dead, but it must not stall readers either. Every data-plane
// request runs under a deadline that grows with its size (reqTimeout); a
// server that misses one is a suspect for suspectFor, and readers try the
// other replicas of a chunk first, so a stopped server (SIGSTOP, a cut
// link) costs a reader one timeout, not one per piece. A suspect that
// answers is cleared at once.

// DefaultTimeout and DefaultMinRate make the per-request deadline:
// Timeout + bytes/MinRate (docs/api.md, "Failover and timeouts").
const (
	DefaultTimeout = 10 * time.Second
	DefaultMinRate = 8 << 20 // bytes per second
)

// suspectFor is how long a server that missed a deadline is tried last.
const suspectFor = 10 * time.Second

// reqTimeout is the deadline of a data-plane request moving n bytes.
func (c *Client) reqTimeout(n int64) time.Duration {
	return c.cfg.Timeout + time.Duration(float64(n)/float64(c.cfg.MinRate)*float64(time.Second))
}

// health remembers servers that recently missed a deadline.
type health struct {
	mu      sync.Mutex
	suspect map[string]time.Time // addr -> until
}

func (h *health) isSuspect(addr string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.suspect[addr]
	if ok && time.Now().After(until) {
		delete(h.suspect, addr)
		return false
	}
	return ok
}

// note records the outcome of a request to addr whose own deadline was
// rctx's: a timeout makes it a suspect, an answer clears it.
func (h *health) note(addr string, rctx context.Context, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		delete(h.suspect, addr)
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		if h.suspect == nil {
			h.suspect = map[string]time.Time{}
		}
		h.suspect[addr] = time.Now().Add(suspectFor)
	}
}

// timeoutErr turns a request's own deadline into a clear, retryable error;
// other errors pass through.
func timeoutErr(rctx context.Context, err error, addr string, d time.Duration) error {
	if err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return errs.New(errs.ErrUnavailable, "server %s did not answer within %s (stopped, overloaded or cut off): %w", addr, d.Round(time.Millisecond), err)
	}
	return err
}
