package master

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/internal/meta"
)

// Warming a plan's stored ranges (issue 23 item 3). An engine loads a plan's
// stored KV a little after the plan is answered (it schedules the request
// first); session files live in the chunk store, whose DRAM tier caches whole
// chunks and whose disk tier keeps them all, so the chunks of a stored range
// may be on disk only. After a plan is decided the master asks each up
// replica of those chunks to copy them into DRAM (OpStat with
// wire.FlagPrefetch), so the load finds them there.
//
// Why the master and not the client that receives the plan: the master has
// just read the session and knows where the chunks are (one metadata lookup,
// no extra round trip), and every front end gets it unchanged: the Go and
// Python clients, the router, an engine's connector, curl. A client would
// first have to ask the master for the chunks of each range.
//
// Only servers with a disk tier are asked: on one without, a chunk is in
// DRAM or nowhere.
//
// It never delays the answer (a goroutine after the plan is decided), never
// queues without bound (at most planWarmJobs plans warm at once; a plan
// arriving past that is not warmed), never pins (the server's copy is an
// ordinary, evictable cached chunk: store.Prefetch), and a failure costs only
// the warming: the load then reads from disk, as without it.

const (
	planWarmJobs      = 4               // plans being warmed at once
	planWarmMaxChunks = 64              // chunks asked for per plan
	planWarmTimeout   = 5 * time.Second // for one plan's lookups and requests
)

// planWarmer is the master's state for warming plans. A mutex and a
// condition count the plans being warmed, not a WaitGroup: WaitPlanWarm may
// run while new plans start warming.
type planWarmer struct {
	off      atomic.Bool
	once     sync.Once
	ctx      context.Context
	cancel   context.CancelFunc
	mu       sync.Mutex
	idle     *sync.Cond // signalled when inFlight drops to 0
	inFlight int
	closed   bool
	asked    atomic.Uint64 // chunk replicas asked to copy into DRAM
	skipped  atomic.Uint64 // plans not warmed: planWarmJobs were busy
	// files whose chunks were found in the metadata store's memory
	// (meta.ChunkHinter), not read from SQL
	fromMemory atomic.Uint64
}

func (w *planWarmer) init() {
	w.once.Do(func() {
		w.ctx, w.cancel = context.WithCancel(context.Background())
		w.idle = sync.NewCond(&w.mu)
	})
}

// wait waits until no plan is being warmed.
func (w *planWarmer) wait() {
	w.init()
	w.mu.Lock()
	for w.inFlight > 0 {
		w.idle.Wait()
	}
	w.mu.Unlock()
}

// SetPlanWarm turns warming of plans' stored ranges on (the default) or off.
func (m *Master) SetPlanWarm(on bool) { m.warm.off.Store(!on) }

// WaitPlanWarm waits for the plans being warmed and reports how many chunk
// replicas were asked to copy into DRAM and how many plans were not warmed
// because planWarmJobs were busy, since the master started. For tests and
// benchmarks.
func (m *Master) WaitPlanWarm() (asked, skipped uint64) {
	m.warm.wait()
	return m.warm.asked.Load(), m.warm.skipped.Load()
}

// PlanWarmFromMemory is how many files warming found in the metadata
// store's memory instead of reading SQL. For tests.
func (m *Master) PlanWarmFromMemory() uint64 { return m.warm.fromMemory.Load() }

// closeWarm stops warming: requests in flight are cancelled and waited for.
func (m *Master) closeWarm() {
	m.warm.init()
	m.warm.mu.Lock()
	m.warm.closed = true
	m.warm.mu.Unlock()
	m.warm.cancel()
	m.warm.wait()
}

// warmPlan starts warming the chunks of stored and returns at once.
func (m *Master) warmPlan(stored []meta.Range) {
	w := &m.warm
	if len(stored) == 0 || w.off.Load() {
		return
	}
	w.init()
	w.mu.Lock()
	if w.closed || w.inFlight >= planWarmJobs {
		if !w.closed {
			w.skipped.Add(1)
		}
		w.mu.Unlock()
		return
	}
	w.inFlight++
	w.mu.Unlock()
	rs := append([]meta.Range(nil), stored...)
	go func() {
		defer func() {
			w.mu.Lock()
			if w.inFlight--; w.inFlight == 0 {
				w.idle.Broadcast()
			}
			w.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(w.ctx, planWarmTimeout)
		defer cancel()
		m.warmRanges(ctx, rs)
	}()
}

// warmRanges asks the up replicas of the chunks under rs to copy them into
// DRAM. Errors are dropped: warming is a hint.
func (m *Master) warmRanges(ctx context.Context, rs []meta.Range) {
	byPath := map[string][][2]int64{}
	var order []string
	for _, r := range rs {
		if r.KVLength <= 0 {
			continue
		}
		if _, ok := byPath[r.Path]; !ok {
			order = append(order, r.Path)
		}
		byPath[r.Path] = append(byPath[r.Path], [2]int64{r.KVStart, r.KVStart + r.KVLength})
	}
	budget := planWarmMaxChunks
	hinter, _ := m.meta.(meta.ChunkHinter)
	for _, p := range order {
		// The leader's memory first: three SQL reads a plan (and, in
		// window mode, a wait for the log) were ~3% of the master's CPU in
		// gd2fs-bench turns, for a hint.
		var f meta.File
		var cs []meta.Chunk
		ok := false
		if hinter != nil {
			if f, cs, ok = hinter.HintChunks(p); ok {
				m.warm.fromMemory.Add(1)
			}
		}
		if !ok {
			var err error
			if f, cs, err = m.fileAndChunks(ctx, p); err != nil {
				continue
			}
		}
		if f.ChunkSize <= 0 {
			continue
		}
		var want []meta.Chunk
		for _, c := range cs {
			from, to := c.Index*f.ChunkSize, c.Index*f.ChunkSize+c.Length
			for _, span := range byPath[p] {
				if from < span[1] && span[0] < to {
					want = append(want, c)
					break
				}
			}
		}
		for _, c := range m.chunksOut(want) {
			if budget == 0 {
				return
			}
			budget--
			for _, r := range c.Replicas {
				if !r.Up || r.Addr == "" || !m.hasDiskTier(r.Server) {
					continue
				}
				if m.peers.PrefetchChunk(ctx, r.Addr, c.ID) == nil {
					m.warm.asked.Add(1)
				}
			}
		}
	}
}

// hasDiskTier says server id reported a disk tier for its chunks. A server
// without one holds a chunk in DRAM or not at all: there is nothing to
// copy into DRAM, and asking cost the master and the server a request a
// plan (7 % of turns/s in gd2fs-bench turns, whose servers are DRAM only).
func (m *Master) hasDiskTier(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.servers[id]
	return s != nil && s.info.DiskCap > 0
}
