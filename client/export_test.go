package client

import (
	"context"

	"github.com/gd2fs/gd2fs/internal/api"
)

// Hooks for the tests of coalescing (coalesce_test.go), which run against a
// real master and servers from package client_test.

// HoldLoneCalls makes every lone plan and commit of c (one sent by the
// single route) wait until release is called before it is sent, with one
// batch of each kind in flight at most, so a test can queue calls behind
// it and have them sent as one batch. c must coalesce and not be in use.
func HoldLoneCalls(c *Client) (release func()) {
	gate := make(chan struct{})
	c.co.plans.inFlight, c.co.commits.inFlight = 1, 1
	one := c.co.plans.one
	c.co.plans.one = func(ctx context.Context, p planCall) (Plan, error) {
		<-gate
		return one(ctx, p)
	}
	oneC := c.co.commits.one
	c.co.commits.one = func(ctx context.Context, it api.CommitBatchItem) (Session, error) {
		<-gate
		return oneC(ctx, it)
	}
	return func() { close(gate) }
}

// Coalescing says how many plans and commits of c are on the wire (lone or
// in batches: sending counts batches) and how many wait in the queues.
func Coalescing(c *Client) (plansSending, plansQueued, commitsSending, commitsQueued int) {
	b, k := c.co.plans, c.co.commits
	b.mu.Lock()
	plansSending, plansQueued = b.sending, len(b.queue)
	b.mu.Unlock()
	k.mu.Lock()
	commitsSending, commitsQueued = k.sending, len(k.queue)
	k.mu.Unlock()
	return
}
