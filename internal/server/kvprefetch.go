package server

// maxPrefetches bounds the disk-to-DRAM copies that exists probes with
// wire.FlagPrefetch have in flight; past it a probe starts none (the read
// then comes from disk, as without the flag).
const maxPrefetches = 64

// kvPrefetch starts copying key's block from the disk tier to DRAM and
// returns at once: the probe's answer does not wait for the disk.
func (s *Server) kvPrefetch(key []byte) {
	if s.kvm.prefetching.Add(1) > maxPrefetches {
		s.kvm.prefetching.Add(-1)
		return
	}
	if !s.addWorker() { // Close waits for it before closing the store
		s.kvm.prefetching.Add(-1)
		return
	}
	go func() {
		defer s.wg.Done()
		defer s.kvm.prefetching.Add(-1)
		s.kv.Prefetch(key)
	}()
}
