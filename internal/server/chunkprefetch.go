package server

import (
	"sync"
	"sync/atomic"
)

// maxChunkPrefetches bounds the chunks being copied from disk to DRAM at
// the master's request (an explicit-mode plan warming its stored ranges);
// past it a request starts none and the load reads from disk, as without it.
// Chunks are large (up to limits.MaxChunk), so few are copied at once.
const maxChunkPrefetches = 4

// chunkWarm counts chunk prefetches in flight. A mutex and a condition, not
// a WaitGroup: WaitChunkPrefetches may run while requests start new ones.
type chunkWarm struct {
	mu       sync.Mutex
	idle     *sync.Cond // signalled when inFlight drops to 0
	inFlight int
	started  atomic.Uint64
	dropped  atomic.Uint64 // past maxChunkPrefetches
}

// chunkPrefetch starts copying chunk id from the disk tier into DRAM
// (store.Prefetch: not pinned, no read counted) and returns at once.
func (s *Server) chunkPrefetch(id uint64) {
	w := &s.warm
	w.mu.Lock()
	if w.inFlight >= maxChunkPrefetches {
		w.mu.Unlock()
		w.dropped.Add(1)
		return
	}
	if !s.addWorker() { // Close waits for it before closing the store
		w.mu.Unlock()
		return
	}
	w.inFlight++
	w.mu.Unlock()
	w.started.Add(1)
	go func() {
		defer s.wg.Done()
		// A failure leaves the chunk where it was: the load reads it from
		// disk, and a damaged block is reported by that read.
		s.store.Prefetch(id)
		w.mu.Lock()
		if w.inFlight--; w.inFlight == 0 && w.idle != nil {
			w.idle.Broadcast()
		}
		w.mu.Unlock()
	}()
}

// WaitChunkPrefetches waits until no chunk prefetch is in flight and reports
// how many were started and how many dropped (past the bound) since the
// server started. For tests and benchmarks.
func (s *Server) WaitChunkPrefetches() (started, dropped uint64) {
	w := &s.warm
	w.mu.Lock()
	if w.idle == nil {
		w.idle = sync.NewCond(&w.mu)
	}
	for w.inFlight > 0 {
		w.idle.Wait()
	}
	w.mu.Unlock()
	return w.started.Load(), w.dropped.Load()
}
