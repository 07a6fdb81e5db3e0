package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// sweep is the final check of everything acknowledged, after every fault
// healed and the load stopped.
type sweep struct {
	haOK, haLost, perfOK, perfMissing, wrong, skipped int
	kvOK, kvMiss, kvUnavail, kvWrong                  int
	bytes                                             int64
}

// exercise runs the load and the schedule against the started cluster.
func (c *cluster) exercise(ctx context.Context) (*Result, error) {
	cfg := c.cfg
	t0 := time.Now()
	cl, err := c.newClient()
	if err != nil {
		return nil, err
	}
	if err := c.waitUp(ctx, cl, cfg.Servers, 90*time.Second); err != nil {
		cl.Close()
		return nil, fmt.Errorf("cluster did not come up: %w\n%s", err, c.tails())
	}
	c.logf("chaos: cluster up in %.1fs", time.Since(t0).Seconds())
	if err := cl.Sessions().SetLayout(ctx, client.Layout{Model: layoutName, Layers: 2, KVHeads: 2, HeadDim: 16, DType: "fp16", PageTokens: 16, Order: "layer_first"}); err != nil {
		cl.Close()
		return nil, fmt.Errorf("session layout: %w", err)
	}
	lpath, lsize, err := c.linkModel(ctx, cl)
	if err != nil {
		cl.Close()
		return nil, err
	}
	st, m := newStats(), newModel()
	l := &load{cfg: cfg, st: st, m: m, seed: cfg.Seed, linked: lpath, lsize: lsize}

	// Warm up, then measure every process at rest: the leak baseline.
	stop := c.startLoad(ctx, l, cl)
	sleepCtx(ctx, 5*time.Second)
	stop()
	cl.Close()
	sleepCtx(ctx, 2*time.Second)
	before := c.usage(ctx)

	// Faults this cluster cannot make are listed once, as skipped, and
	// take no time from the others.
	var steps []*step
	var runnable []string
	for _, f := range cfg.Faults {
		if why := c.unsupported(f); why != "" {
			steps = append(steps, &step{fault: f, victim: "-", skipped: why})
			c.logf("chaos: SKIPPED %s: %s", f, why)
			continue
		}
		runnable = append(runnable, f)
	}
	steps = append(steps, schedule(runnable, cfg.Servers, cfg.Seed, cfg.Duration, cfg.Hold, cfg.Gap)...)
	c.logf("chaos: schedule (seed %d; each fault held %s, then at least %s and until every kind of operation succeeds again, at most %s):",
		cfg.Seed, cfg.Hold, cfg.Gap, cfg.RecoveryBound)
	for i, s := range steps {
		if s.skipped == "" {
			c.logf("  %2d. %-16s %s", i+1, s.fault, s.victim)
		}
	}
	if cl, err = c.newClient(); err != nil {
		return nil, err
	}
	l.cl = cl
	stop = c.startLoad(ctx, l, cl)
	start := time.Now()
	st.restartClock(start)
	at := func() string { return fmt.Sprintf("[%6.1fs]", time.Since(start).Seconds()) }
	var findings []string
	sleepCtx(ctx, 2*time.Second)
	for i, s := range steps {
		if ctx.Err() != nil {
			break
		}
		if s.skipped != "" {
			continue
		}
		st.faultStart(fmt.Sprintf("fault %d (%s %s)", i+1, s.fault, s.victim))
		s.injected = time.Now()
		if err := c.inject(s); err != nil {
			s.note = "inject failed: " + err.Error()
			c.logf("%s %d. %s %s: inject failed: %v", at(), i+1, s.fault, s.victim, err)
			findings = append(findings, fmt.Sprintf("fault %d (%s): inject failed: %v", i+1, s.fault, err))
			continue
		}
		c.logf("%s %d. inject %s %s", at(), i+1, s.fault, s.victim)
		if strings.HasPrefix(s.fault, "leader-") {
			// How long until another master leads (if one does at all
			// while the fault holds): the failover the clients wait for.
			if d, ok := c.waitNewLeader(ctx, s.victim, s.hold); ok {
				s.note = fmt.Sprintf("another master led %.1fs after the fault", d.Seconds())
			} else {
				s.note = fmt.Sprintf("no other master led while the fault held (%s)", s.hold)
			}
			c.logf("%s %d. %s", at(), i+1, s.note)
		}
		sleepCtx(ctx, s.hold-time.Since(s.injected))
		if err := c.heal(s); err != nil {
			s.note = "heal failed: " + err.Error()
			findings = append(findings, fmt.Sprintf("fault %d (%s %s): heal failed: %v", i+1, s.fault, s.victim, err))
		}
		s.healedAt = st.healed()
		c.logf("%s %d. heal %s %s", at(), i+1, s.fault, s.victim)
		for ctx.Err() == nil {
			rec, bad := st.recovery()
			s.recovery, s.bad = rec, bad
			all := true
			for k := range nKinds {
				all = all && rec[k] >= 0
			}
			since := time.Since(s.healedAt)
			if (all && since >= cfg.Gap) || since >= cfg.RecoveryBound {
				break
			}
			sleepCtx(ctx, 100*time.Millisecond)
		}
		findings = append(findings, c.exits(at())...)
		var slow []string
		worst, wk := time.Duration(0), Kind(0)
		for k := range nKinds {
			if s.recovery[k] < 0 {
				slow = append(slow, k.String())
				findings = append(findings, fmt.Sprintf("fault %d (%s %s): no successful %s within %s of the heal", i+1, s.fault, s.victim, k, cfg.RecoveryBound))
			} else if s.recovery[k] > worst {
				worst, wk = s.recovery[k], k
			}
		}
		if len(slow) > 0 {
			c.logf("%s %d. NOT RECOVERED within %s: %s", at(), i+1, cfg.RecoveryBound, strings.Join(slow, ", "))
		} else {
			c.logf("%s %d. recovered: every kind succeeded again within %.1fs (slowest: %s)", at(), i+1, worst.Seconds(), wk)
		}
	}
	st.healed()
	// The load runs on to the end of the duration.
	sleepCtx(ctx, cfg.Duration-time.Since(start))
	stop()
	findings = append(findings, c.exits(at())...)
	loadTime := time.Since(start)
	c.logf("%s load stopped; final sweep of everything acknowledged", at())

	// Final sweep: every fault is healed; wait for every server.
	if err := c.waitUp(ctx, cl, cfg.Servers, 60*time.Second); err != nil {
		findings = append(findings, "after the run, not every server came back: "+err.Error())
	}
	sw := c.sweep(ctx, l)
	cl.Close()

	// Leak check: the processes that lived through the run, at rest again.
	after, leaks := c.leakCheck(ctx, before)
	findings = append(findings, leaks...)

	res := &Result{Violations: st.violations(), Findings: findings}
	res.Report = c.report(st, m, steps, sw, before, after, loadTime, res)
	return res, nil
}

// startLoad starts the workers; the returned func stops them and waits.
func (c *cluster) startLoad(ctx context.Context, l *load, cl *client.Client) func() {
	l.cl = cl
	l.phase++
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	goLoad := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	goLoad(func() { l.writer(lctx, "ha", 0) })
	goLoad(func() { l.writer(lctx, "ha", 1) })
	goLoad(func() { l.writer(lctx, "perf", 2) })
	goLoad(func() { l.reader(lctx, "ha", 3) })
	goLoad(func() { l.reader(lctx, "perf", 4) })
	goLoad(func() { l.kv(lctx, 5) })
	goLoad(func() { l.sessions(lctx, 6) })
	goLoad(func() { l.linkedReader(lctx, 7) })
	return func() { cancel(); wg.Wait() }
}

// sweep reads back every acknowledged file and KV key.
func (c *cluster) sweep(ctx context.Context, l *load) sweep {
	var sw sweep
	buf := make([]byte, 1536<<10)
	for _, f := range l.m.all() {
		var o Outcome
		var err error
		var detail string
		for attempt := 0; attempt < 5; attempt++ {
			octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
			o, err, detail = l.readCheck(octx, f, 0, buf[:f.size])
			cancel()
			if o == OK || o == WrongBytes || f.pool != "ha" && o == Miss {
				break
			}
			sleepCtx(ctx, time.Second)
		}
		sw.bytes += int64(f.size)
		switch {
		case f.removing.Load() && o != WrongBytes:
			sw.skipped++
		case o == WrongBytes:
			sw.wrong++
			l.st.record(map[bool]Kind{true: HARead, false: PerfRead}[f.pool == "ha"], WrongBytes, time.Now(), err, "final sweep: "+detail)
		case o == OK:
			if f.pool == "ha" {
				sw.haOK++
			} else {
				sw.perfOK++
			}
		case f.pool == "ha":
			sw.haLost++
			l.st.record(HARead, LostAck, time.Now(), err, "final sweep: "+f.path)
		default:
			sw.perfMissing++
		}
	}
	l.m.mu.Lock()
	keys := append([]string(nil), l.m.kvKeys...)
	l.m.mu.Unlock()
	got := make([]byte, kvMax)
	for _, k := range keys {
		pool := "perf"
		if strings.HasPrefix(k, "chaos/ha/") {
			pool = "ha"
		}
		octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
		n, err := l.cl.KV(pool).GetInto(octx, k, got)
		cancel()
		switch {
		case errors.Is(err, errs.ErrNotFound):
			sw.kvMiss++
		case err != nil:
			sw.kvUnavail++
		case int64(n) != sizeOf(l.seed, k, 256, kvMax) || firstDiff(l.seed, k, 0, got[:n]) >= 0:
			sw.kvWrong++
			l.st.record(KVGet, WrongBytes, time.Now(), nil, "final sweep: kv "+k)
		default:
			sw.kvOK++
		}
	}
	return sw
}

// leakCheck compares every process that lived through the run with the
// baseline, waiting a while for connections of the run to close.
func (c *cluster) leakCheck(ctx context.Context, before map[string]usage) (map[string]usage, []string) {
	var after map[string]usage
	var leaks []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, leaks = c.usage(ctx), nil
		for name, b := range before {
			a := after[name]
			if a.pid != b.pid || b.fds < 0 || a.fds < 0 {
				continue
			}
			if a.fds > b.fds+fdSlack(b.fds) {
				leaks = append(leaks, fmt.Sprintf("%s (pid %d): %d open fds after the run, %d before", name, a.pid, a.fds, b.fds))
			}
			if b.goroutines >= 0 && a.goroutines > b.goroutines+goSlack(b.goroutines) {
				leaks = append(leaks, fmt.Sprintf("%s (pid %d): %d goroutines after the run, %d before", name, a.pid, a.goroutines, b.goroutines))
			}
		}
		if len(leaks) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return after, leaks
		}
		sleepCtx(ctx, time.Second)
	}
}

// The slack allows for connections a process keeps open on purpose (pools
// to peers, the heartbeat) that the run may have grown within their bounds.
func fdSlack(n int) int { return max(16, n/4) }
func goSlack(n int) int { return max(32, n/4) }

func (c *cluster) tails() string {
	var b strings.Builder
	for _, p := range c.procs() {
		fmt.Fprintf(&b, "--- %s (%s):\n%s\n", p.name, p.logPath, p.logTail(15))
	}
	return b.String()
}

// waitNewLeader polls until a master other than old leads, for at most
// within; it returns how long that took.
func (c *cluster) waitNewLeader(ctx context.Context, old string, within time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < within && ctx.Err() == nil {
		for _, m := range c.masters {
			if m.name != old && c.leads(m) {
				return time.Since(start), true
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	return 0, false
}

// exits reports processes that ended without the harness ending them (a
// crash, or a restart that failed).
func (c *cluster) exits(at string) []string {
	var out []string
	for _, p := range c.procs() {
		for _, e := range p.takeExits() {
			c.logf("%s PROCESS EXIT: %s", at, e)
			out = append(out, e)
		}
	}
	return out
}
