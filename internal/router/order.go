package router

import (
	"context"
	"sync"
	"time"
)

// turnOrder keeps a session's turns in order at the store. The router
// commits a turn after the client has its answer (so the commit adds no
// latency), which leaves a window: a client that sends its next turn at once
// could be planned before the previous turn is committed, and that plan's
// commit would then be refused (the session changed since it was made), so
// the turn would cache nothing. A turn whose answer is about to reach the
// client holds its session until its commit is done, and a plan of that
// session waits for the hold (never longer than the store timeout).
//
// The holds also count the commits the router has still to finish (idle):
// a hold is taken before the client can see the end of its answer, so a
// caller that has a whole answer and then waits for idle waits for that
// answer's commit too.
type turnOrder struct {
	mu   sync.Mutex
	held map[string]chan struct{}
	// holds is the number of holds not yet ended; quiet is signalled when
	// it comes to 0 (its L is &mu, set on first use).
	holds int
	quiet sync.Cond
}

// hold marks session's commit as pending and returns the function that
// ends the hold; call it when the commit is done (or abandoned).
func (o *turnOrder) hold(session string) (release func()) {
	ch := make(chan struct{})
	o.mu.Lock()
	if o.held == nil {
		o.held = map[string]chan struct{}{}
	}
	o.held[session] = ch
	o.holds++
	o.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			o.mu.Lock()
			if o.held[session] == ch {
				delete(o.held, session)
			}
			if o.holds--; o.holds == 0 && o.quiet.L != nil {
				o.quiet.Broadcast()
			}
			o.mu.Unlock()
			close(ch)
		})
	}
}

// idle returns when no hold is left: every commit of an answer that was
// about to reach its client when idle was called is done (or abandoned).
func (o *turnOrder) idle() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.quiet.L == nil {
		o.quiet.L = &o.mu
	}
	for o.holds > 0 {
		o.quiet.Wait()
	}
}

// wait returns when session has no pending commit, when limit has passed
// or when ctx ends, whichever comes first.
func (o *turnOrder) wait(ctx context.Context, session string, limit time.Duration) {
	o.mu.Lock()
	ch := o.held[session]
	o.mu.Unlock()
	if ch == nil {
		return
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
}
