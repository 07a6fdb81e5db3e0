package server

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/placement"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// Membership changes keep the KV cache (docs/kv-cache.md, "Membership
// changes"). Owners are rendezvous hashes over the member list, so when a
// server joins or is drained some keys get a new owner that never saw them.
// The master's map carries the last member lists (api.Membership.Previous);
// a server that owns a key now and misses it asks the key's owners under
// those lists (wire.FlagHeld: "from what you hold") and:
//
//   - on a get, copies the block to itself and serves it (read-through);
//   - on an exists, answers the old owner's hit and queues the copy;
//   - on a write-once put, copies the old bytes first (the put then keeps
//     them, as it would have on the old owner);
//   - on an overwrite or a delete, removes the old copies, so that an old
//     owner never brings stale bytes back.
//
// A background mover also scans every live earlier owner after each change
// and copies the blocks this server now owns, at most Config.KVMoveRate
// bytes per second, deleting each from the server that no longer owns it.
// Every copy of a key runs under that key's stripe lock here, the owner, and
// so do overwrites and deletes: a copy and a delete of one key never
// interleave, which is what keeps a deleted block from coming back.
// A past list stops being asked once the mover has copied everything from
// it for the current map ("settled").
type kvMoves struct {
	stripes [256]sync.Mutex
	seed    maphash.Seed

	moved, fallbackHits, lost atomic.Int64
	prefetching               atomic.Int32 // disk-to-DRAM copies in flight (kvprefetch.go)

	once    sync.Once
	started atomic.Bool     // set after once's initialisation: readers check it first
	kick    chan struct{}   // a new map (capacity 1)
	queue   chan wire.KVRef // keys an exists found on an old owner, to copy

	mu      sync.Mutex
	settled map[int64]int64 // past list's epoch → the current epoch it was fully moved for
}

// DefaultKVMoveRate bounds the background move (bytes per second).
const DefaultKVMoveRate = 64 << 20

func (m *kvMoves) stripe(key []byte) *sync.Mutex {
	return &m.stripes[maphash.Bytes(m.seed, key)%uint64(len(m.stripes))]
}

// kvMoverInit starts the mover once. The heartbeat calls it before it
// stores the first map: with a map and no mover state, kvSources would
// answer "no earlier owners" and a miss here would not be asked there.
func (s *Server) kvMoverInit() {
	if s.kv == nil {
		return
	}
	s.kvm.once.Do(func() {
		s.kvm.seed = maphash.MakeSeed()
		s.kvm.kick = make(chan struct{}, 1)
		s.kvm.queue = make(chan wire.KVRef, 4096)
		s.kvm.settled = map[int64]int64{}
		if s.addWorker() {
			go s.kvMover()
		}
		s.kvm.started.Store(true)
	})
}

// kvMapChanged is called after each heartbeat stored a map: wake the mover.
func (s *Server) kvMapChanged() {
	if s.kv == nil {
		return
	}
	s.kvMoverInit()
	if ms := s.membership(); ms != nil && len(ms.Previous) > 0 {
		select {
		case s.kvm.kick <- struct{}{}:
		default:
		}
	}
}

// kvSource is a server that may hold a block: an owner under an earlier
// member list, and maybe an owner now too (current: a copy of a pool with
// several copies, which stays where it is).
type kvSource struct {
	placement.Member
	current bool
}

// kvSources are the servers that may hold ref's block because they owned it
// under an unsettled earlier member list: live (members now, or draining),
// not this server, newest list first, each once. lost reports that some
// earlier owner is gone (down): a miss is then the block lost with it.
func (s *Server) kvSources(ms *api.Membership, ref wire.KVRef) (srcs []kvSource, lost bool) {
	if ms == nil || len(ms.Previous) == 0 || !s.kvm.started.Load() {
		return nil, false
	}
	n := ms.Replicas(ref.Pool)
	if n == 0 {
		return nil, false
	}
	live := map[string]bool{}
	for _, m := range ms.Members {
		live[m.ID] = true
	}
	for _, m := range ms.Draining {
		live[m.ID] = true
	}
	current := map[string]bool{}
	for _, m := range placement.Owners(ref.Key, ms.Members, n) {
		current[m.ID] = true
	}
	seen := map[string]bool{s.cfg.ID: true}
	s.kvm.mu.Lock()
	settled := s.kvm.settled
	for _, past := range ms.Previous {
		done := settled[past.Epoch] == ms.Epoch // everything is moved: only count what is lost
		for _, o := range placement.Owners(ref.Key, past.Members, n) {
			if seen[o.ID] {
				continue
			}
			seen[o.ID] = true
			if done && live[o.ID] {
				continue
			}
			if live[o.ID] {
				srcs = append(srcs, kvSource{o, current[o.ID]})
			} else {
				lost = true
			}
		}
	}
	s.kvm.mu.Unlock()
	return srcs, lost
}

// kvPull copies ref's block from an earlier owner to this server unless it
// is here already, and removes it there; it reports whether the block is
// here now. size is the block's size when known, for the mover's pacing.
func (s *Server) kvPull(ms *api.Membership, ref wire.KVRef) (found bool, size int) {
	found, size, _ = s.kvPullFrom(ms, ref, false)
	return found, size
}

// kvPullFrom is kvPull; with tidy, a block already here is also removed from
// the earlier owners that are not owners now. The mover tidies: in a pool of
// several copies a new owner often has the block already (a forwarded
// write), and a copy left on a server that is no longer an owner would be
// stale by the time that server owns the key again.
//
// unanswered is the error of an earlier owner that did not say whether it
// holds the block (unreachable, timed out, behind on the map), when the
// block is not here: it may still be there. The mover then does not count
// the list as moved (kvMoveFrom); a get or a put just goes on without it.
func (s *Server) kvPullFrom(ms *api.Membership, ref wire.KVRef, tidy bool) (found bool, size int, unanswered error) {
	srcs, lost := s.kvSources(ms, ref)
	if len(srcs) == 0 {
		if lost {
			s.kvm.lost.Add(1)
		}
		return false, 0, nil
	}
	key := kvKey(ref)
	mu := s.kvm.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	if t, _ := s.kv.Exists(key); t != 0 {
		if tidy {
			s.kvDropOld(ms, ref, srcs)
		}
		return true, 0, nil
	}
	for i, src := range srcs {
		// Its pin, priority and TTL first, then its bytes: a block that
		// expires between the two is not found, and one found carries a TTL
		// no longer than it had.
		ret, err := s.kvRetentionAt(src.Addr, ms.Epoch, ref)
		if errors.Is(err, errs.ErrUnknownOp) {
			// A server older than retention (a rolling upgrade) holds
			// blocks without pins or TTLs: move the bytes all the same.
			ret, err = wire.Retain{TTL: -1}, nil
		}
		if err == nil {
			ctx, cancel := context.WithTimeout(s.life, s.cfg.ForwardTimeout)
			var v []byte
			v, err = s.peers.KVGetHeld(ctx, src.Addr, wire.KVRef{Pool: ref.Pool, Key: ref.Key}, ms.Epoch)
			cancel()
			if err == nil {
				if _, err := s.kv.Put(key, v, false); err != nil {
					s.log.Warn("kv move: cannot store a moved block", "err", err)
					return false, 0, nil
				}
				s.kvApplyRetention(key, ret)
				s.kvm.moved.Add(1)
				// Every earlier owner that is not an owner now drops its
				// copy: the block has one home again, and no stale copy is
				// left to be found.
				s.kvDropOld(ms, ref, srcs[i:])
				return true, len(v), nil
			}
		}
		if !errors.Is(err, errs.ErrNotFound) {
			unanswered = err
		}
		// Not there, or no answer: the next earlier owner.
	}
	if lost {
		s.kvm.lost.Add(1)
	}
	return false, 0, unanswered
}

// kvDropOld deletes ref at those of srcs that are not owners now. The
// caller holds ref's stripe lock.
func (s *Server) kvDropOld(ms *api.Membership, ref wire.KVRef, srcs []kvSource) {
	s.kvDrop(ms, ref, srcs, false)
}

// kvDrop deletes ref at srcs: all of them, or (!all) those that are not
// owners now.
func (s *Server) kvDrop(ms *api.Membership, ref wire.KVRef, srcs []kvSource, all bool) {
	for _, src := range srcs {
		if src.current && !all {
			continue
		}
		ctx, cancel := context.WithTimeout(s.life, s.cfg.ForwardTimeout)
		if _, err := s.peers.KVDeleteHeld(ctx, src.Addr, wire.KVRef{Pool: ref.Pool, Key: ref.Key}, ms.Epoch); err != nil && ctx.Err() == nil {
			s.log.Debug("kv move: old copy not deleted", "server", src.ID, "err", err)
		}
		cancel()
	}
}

// kvFallbackExists answers an exists that missed here from an earlier
// owner, and queues the block's move.
func (s *Server) kvFallbackExists(ref wire.KVRef) (size int64, tier int, ok bool) {
	ms := s.membership()
	srcs, lost := s.kvSources(ms, ref)
	for _, src := range srcs {
		ctx, cancel := context.WithTimeout(s.life, s.cfg.ForwardTimeout)
		size, tier, err := s.peers.KVExistsHeld(ctx, src.Addr, wire.KVRef{Pool: ref.Pool, Key: ref.Key}, ms.Epoch)
		cancel()
		if err == nil {
			s.kvm.fallbackHits.Add(1)
			select {
			case s.kvm.queue <- wire.KVRef{Pool: ref.Pool, Key: append([]byte(nil), ref.Key...)}:
				s.kvKick()
			default: // the mover's scan finds it anyway
			}
			return size, tier, true
		}
	}
	if lost {
		s.kvm.lost.Add(1)
	}
	return 0, 0, false
}

// kvFallbackGet copies a block that missed here from an earlier owner;
// true when it is here now.
func (s *Server) kvFallbackGet(ref wire.KVRef) bool {
	found, _ := s.kvPull(s.membership(), ref)
	if found {
		s.kvm.fallbackHits.Add(1)
	}
	return found
}

// kvBeforeWrite runs before a put of ref on its owner. A write-once put
// first copies the old block (so the put keeps it, as it would have on the
// old owner). An overwrite takes the stripe lock and returns its release,
// which first removes the copies of earlier owners that are not owners now
// (the owners now get the new bytes from the put itself).
func (s *Server) kvBeforeWrite(ref wire.KVRef, replace bool) (unlock func()) {
	return s.kvBeforeChange(ref, replace, false)
}

// kvBeforeDelete is kvBeforeWrite for a delete: the release removes the
// copies of every earlier owner, owners now included. Otherwise another new
// owner could copy the block from one of them after deleting its own copy
// and before the client's delete reached that one, and keep it.
func (s *Server) kvBeforeDelete(ref wire.KVRef) (unlock func()) {
	return s.kvBeforeChange(ref, true, true)
}

func (s *Server) kvBeforeChange(ref wire.KVRef, replace, del bool) (unlock func()) {
	ms := s.membership()
	if !replace {
		if srcs, _ := s.kvSources(ms, ref); len(srcs) > 0 {
			s.kvPull(ms, ref)
		}
		return func() {}
	}
	srcs, _ := s.kvSources(ms, ref)
	if len(srcs) == 0 {
		return func() {}
	}
	mu := s.kvm.stripe(kvKey(ref))
	mu.Lock()
	return func() {
		s.kvDrop(ms, ref, srcs, del)
		mu.Unlock()
	}
}

// kvPrefixDeleteOld repeats a prefix delete on every live earlier member
// (FlagHeld: they delete locally and pass it on to no one), holding every
// stripe: no copy of a key under the prefix is in flight meanwhile, so none
// lands after the delete.
func (s *Server) kvPrefixDeleteOld(ref wire.KVRef) (unlock func()) {
	ms := s.membership()
	if ms == nil || len(ms.Previous) == 0 || !s.kvm.started.Load() {
		return func() {}
	}
	for i := range s.kvm.stripes {
		s.kvm.stripes[i].Lock()
	}
	return func() {
		seen := map[string]bool{s.cfg.ID: true}
		for _, m := range ms.Members {
			seen[m.ID] = true // the client deletes there itself
		}
		for _, past := range ms.Previous {
			for _, m := range past.Members {
				if seen[m.ID] {
					continue
				}
				seen[m.ID] = true
				ctx, cancel := context.WithTimeout(s.life, s.cfg.ForwardTimeout)
				if _, err := s.peers.KVDeletePrefixHeld(ctx, m.Addr, ref, ms.Epoch); err != nil && ctx.Err() == nil {
					s.log.Debug("kv prefix delete on an earlier member failed", "server", m.ID, "err", err)
				}
				cancel()
			}
		}
		for i := range s.kvm.stripes {
			s.kvm.stripes[i].Unlock()
		}
	}
}

func (s *Server) kvKick() {
	select {
	case s.kvm.kick <- struct{}{}:
	default:
	}
}

// kvMoveRetryMax bounds the wait between tries of a move whose earlier
// owner did not answer (kvMover).
const kvMoveRetryMax = time.Minute

// kvMover moves blocks after membership changes until the server closes.
func (s *Server) kvMover() {
	defer s.wg.Done()
	var retry <-chan time.Time
	// A move whose earlier owner did not answer is tried again after wait:
	// 1 s, doubling up to kvMoveRetryMax while the map stays the same (a
	// heartbeat wakes the mover every time, so without notBefore a source
	// that keeps failing would be rescanned at every one), back to 1 s when
	// the map changes.
	wait := time.Second
	var notBefore time.Time
	var epoch int64
	for {
		select {
		case <-s.life.Done():
			return
		case <-s.kvm.kick:
		case <-retry:
		}
		retry = nil
		ms := s.membership()
		if ms == nil {
			continue
		}
		s.kvDrainQueue(ms)
		if ms.Epoch != epoch {
			epoch, wait, notBefore = ms.Epoch, time.Second, time.Time{}
		}
		if d := time.Until(notBefore); d > 0 {
			retry = time.After(d)
			continue
		}
		done := true
		for _, past := range ms.Previous {
			s.kvm.mu.Lock()
			ok := s.kvm.settled[past.Epoch] == ms.Epoch
			s.kvm.mu.Unlock()
			if ok {
				continue
			}
			if !s.kvMoveFrom(ms, past) {
				done = false
				continue
			}
			s.kvm.mu.Lock()
			s.kvm.settled[past.Epoch] = ms.Epoch
			s.kvm.mu.Unlock()
		}
		if !done && s.life.Err() == nil {
			// An earlier owner did not answer, or the map moved on. A
			// source that keeps failing (down for long, a block it cannot
			// read) is asked again less and less often: each try rescans
			// the earlier owners of the list. Until then its blocks are
			// still found there by the misses' fallback (kvSources).
			notBefore = time.Now().Add(wait)
			retry = time.After(wait)
			wait = min(2*wait, kvMoveRetryMax)
		} else {
			wait, notBefore = time.Second, time.Time{}
		}
	}
}

func (s *Server) kvDrainQueue(ms *api.Membership) {
	for {
		select {
		case ref := <-s.kvm.queue:
			if err := s.checkOwner(ref, 0); err == nil {
				s.kvPull(ms, ref)
			}
		default:
			return
		}
	}
}

// kvMoveFrom copies, from every live member of past, the blocks this
// server owns under ms that that member owned under past, paced at
// KVMoveRate. It reports whether every member was scanned to the end under
// an unchanged map.
func (s *Server) kvMoveFrom(ms *api.Membership, past api.PastMembers) bool {
	live := map[string]bool{}
	for _, m := range ms.Members {
		live[m.ID] = true
	}
	for _, m := range ms.Draining {
		live[m.ID] = true
	}
	rate := s.cfg.KVMoveRate
	if rate <= 0 {
		rate = DefaultKVMoveRate
	}
	start, bytes := time.Now(), int64(0)
	ok := true
	for _, src := range past.Members {
		if src.ID == s.cfg.ID || !live[src.ID] {
			continue
		}
		// A held probe carries our epoch: src fetches the new map before we
		// scan it, so from here on a client with the old map is told
		// "moved" there instead of writing a block behind our scan.
		ctx, cancel := context.WithTimeout(s.life, s.cfg.ForwardTimeout)
		_, _, err := s.peers.KVExistsHeld(ctx, src.Addr, wire.KVRef{Pool: "perf", Key: []byte("\x00epoch")}, ms.Epoch)
		cancel()
		if err != nil && !errors.Is(err, errs.ErrNotFound) {
			ok = false
			continue
		}
		for _, pool := range ms.Pools {
			n := pool.Replicas
			cursor := uint64(0)
			for {
				ctx, cancel := context.WithTimeout(s.life, s.cfg.ForwardTimeout)
				keys, next, _, err := s.peers.KVScan(ctx, src.Addr, pool.Name, cursor, maxScanKeys)
				cancel()
				if err != nil {
					s.log.Debug("kv move: scan failed", "server", src.ID, "err", err)
					ok = false
					break
				}
				for _, k := range keys {
					kb := []byte(k)
					if !placement.Owns(kb, ms.Members, n, s.cfg.ID) || !placement.Owns(kb, past.Members, n, src.ID) {
						continue
					}
					if cur := s.membership(); cur == nil || cur.Epoch != ms.Epoch {
						return false // a newer map: start over with it
					}
					_, size, err := s.kvPullFrom(ms, wire.KVRef{Pool: pool.Name, Key: kb}, true)
					if err != nil {
						// The block may still be at src: settling this list
						// now would stop every later miss from asking there
						// and hide it for good. The mover tries again.
						s.log.Debug("kv move: an earlier owner did not answer", "server", src.ID, "err", err)
						ok = false
					}
					bytes += int64(size)
					// Pace: never ahead of rate bytes per second since start.
					if ahead := time.Duration(float64(bytes)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
						select {
						case <-s.life.Done():
							return false
						case <-time.After(ahead):
						}
					}
				}
				s.kvDrainQueue(ms)
				if next == 0 {
					break
				}
				cursor = next
			}
		}
	}
	return ok
}

// KVMoveStats are the counters of blocks moved by membership changes.
type KVMoveStats struct {
	Moved        int64 // blocks copied here from an earlier owner
	FallbackHits int64 // reads and probes answered through an earlier owner
	Lost         int64 // misses of keys whose earlier owner is down
}

// KVMoves returns the membership-change counters.
func (s *Server) KVMoves() KVMoveStats {
	return KVMoveStats{Moved: s.kvm.moved.Load(), FallbackHits: s.kvm.fallbackHits.Load(), Lost: s.kvm.lost.Load()}
}

// isHeld: a request that asks for what this server holds (FlagHeld).
func isHeld(h wire.Header) bool { return h.Flags&wire.FlagHeld != 0 }

// kvCatchUp fetches the map when a peer's held request shows a newer epoch:
// once this server has it, a client with the old map is told "moved"
// instead of writing here a block the peer is moving away.
// The refresh is rate-limited (minRefresh, against clients that lie about
// epochs), so this waits for it, at most a few intervals, and answers
// unavailable if the map is still behind: the peer then tries again
// rather than moving a block from a server that would still take writes of
// it from clients with the old map.
func (s *Server) kvCatchUp(epoch int64) error {
	if s.master == nil {
		return nil
	}
	deadline := time.Now().Add(4 * minRefresh)
	for {
		ms := s.membership()
		if ms == nil || epoch <= ms.Epoch {
			return nil
		}
		s.refreshMembership(epoch)
		if ms := s.membership(); ms != nil && epoch <= ms.Epoch {
			return nil
		}
		if time.Now().After(deadline) {
			return errs.New(errs.ErrUnavailable, "server %s has not reached membership epoch %d yet (at %d): retry", s.cfg.ID, epoch, ms.Epoch)
		}
		select {
		case <-s.life.Done():
			return errs.New(errs.ErrUnavailable, "server %s is closing", s.cfg.ID)
		case <-time.After(minRefresh / 4):
		}
	}
}

// kvOwnerAfterWrite closes the race of a write that passed the owner check
// just before this server learned a new map (from a peer's held request
// moving the key away, kvCatchUp): if the key is no longer ours, the write
// is undone here and answered "moved", and the client repeats it on the
// new owner. Without this the new owner could keep the bytes from before
// the write.
func (s *Server) kvOwnerAfterWrite(ref wire.KVRef) error {
	if err := s.checkOwner(ref, 0); err != nil {
		if _, derr := s.kv.Delete(kvKey(ref)); derr != nil {
			return derr
		}
		return err
	}
	return nil
}

// Membership is the last map this server heard (nil before the first).
func (s *Server) Membership() *api.Membership { return s.membership() }

// kvFlush writes the DRAM-only KV blocks to the disk tier when the server
// stops gracefully (Config.KVFlushOnClose), and says in the log what did
// and did not fit.
func (s *Server) kvFlush() {
	if !s.cfg.KVFlushOnClose || s.cfg.KV.Dir == "" {
		return
	}
	start := time.Now()
	st, err := s.kv.Flush()
	if err != nil {
		s.log.Warn("kv: writing DRAM blocks to disk before stopping failed; the rest are lost", "written", st.Written, "err", err)
		return
	}
	if st.Written+st.Left == 0 {
		return
	}
	s.log.Info("kv: DRAM-only blocks written to the disk tier before stopping", "blocks", st.Written, "bytes", st.WrittenBytes,
		"not_fitting", st.Left, "not_fitting_bytes", st.LeftBytes, "took", time.Since(start).Round(time.Millisecond))
}
