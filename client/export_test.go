package client

import (
	"context"
)

// Hooks for the tests of coalescing (coalesce_test.go), which run against a
// real master and servers from package client_test.

// HoldLoneCalls makes every lone call of c (one sent by the single route:
// a plan, an engine plan, a commit or an engine commit) wait until release
// is called before it is sent, with one batch of each kind in flight at
// most, so a test can queue calls behind it and have them sent as one
// batch. c must coalesce and not be in use.
func HoldLoneCalls(c *Client) (release func()) {
	gate := make(chan struct{})
	c.co.plans.inFlight, c.co.engines.inFlight, c.co.commits.inFlight, c.co.saved.inFlight = 1, 1, 1, 1
	hold(gate, c.co.plans)
	hold(gate, c.co.engines)
	hold(gate, c.co.commits)
	hold(gate, c.co.saved)
	return func() { close(gate) }
}

func hold[In, Out any](gate chan struct{}, b *batcher[In, Out]) {
	one := b.one
	b.one = func(ctx context.Context, in In) (Out, error) {
		<-gate
		return one(ctx, in)
	}
}

// Coalescing says how many plans (of both formats) and commits (plain and
// engine) of c are on the wire (lone or in batches: sending counts
// batches) and how many wait in the queues.
func Coalescing(c *Client) (plansSending, plansQueued, commitsSending, commitsQueued int) {
	plansSending, plansQueued = state(c.co.plans)
	s, q := state(c.co.engines)
	plansSending, plansQueued = plansSending+s, plansQueued+q
	commitsSending, commitsQueued = state(c.co.commits)
	s, q = state(c.co.saved)
	commitsSending, commitsQueued = commitsSending+s, commitsQueued+q
	return
}

func state[In, Out any](b *batcher[In, Out]) (sending, queued int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sending, len(b.queue)
}
