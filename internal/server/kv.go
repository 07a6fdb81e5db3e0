package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/placement"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// checkKVRef applies the client's key rules on the server too, so the raw
// protocol accepts exactly what the SDK and CLI do: keys of 1 to
// limits.MaxKVKey arbitrary bytes (NUL included, as Redis keys), an empty key
// only as the prefix of a prefix delete, and pool names without NUL (the
// separator of kvKey, which keeps pools apart).
func checkKVRef(ref wire.KVRef, prefixDelete bool) error {
	if bytes.IndexByte([]byte(ref.Pool), 0) >= 0 || ref.Pool == "" {
		return errs.New(errs.ErrBadRequest, "KV pool name %q: empty or holds NUL", ref.Pool)
	}
	if len(ref.Key) == 0 && !prefixDelete {
		return errs.New(errs.ErrBadRequest, "empty key")
	}
	if len(ref.Key) > limits.MaxKVKey {
		return errs.New(errs.ErrTooLarge, "key of %d bytes: the limit is %d", len(ref.Key), limits.MaxKVKey)
	}
	return nil
}

// kvKey is the store key: pools are separate key spaces.
func kvKey(ref wire.KVRef) []byte {
	b := make([]byte, 0, len(ref.Pool)+1+len(ref.Key))
	b = append(b, ref.Pool...)
	b = append(b, 0)
	return append(b, ref.Key...)
}

// membership returns the last map the master sent (nil before the first
// heartbeat, or without a master).
func (s *Server) membership() *api.Membership { return s.ms.Load() }

// checkOwner answers errs.ErrMoved when this server is not among the key's
// owners in its membership map. A client with a newer epoch than ours makes
// us fetch the map first, so a freshly added server is not refused.
//
// Only a server without a master owns every key. One with a master and no
// map yet (its first heartbeat reply has not come back, though the master
// lists it and clients already send it keys) fetches the map first too,
// and answers "moved" if it still has none: owning everything meanwhile, it
// would not ask the keys' earlier owners, so its gets would miss blocks
// waiting there and write-once puts would land as new
// (TestKVJoinBeforeFirstMap).
func (s *Server) checkOwner(ref wire.KVRef, clientEpoch int64) error {
	if s.master == nil {
		return nil // standalone: own everything
	}
	for attempt := 0; ; attempt++ {
		ms := s.membership()
		if ms == nil || len(ms.Members) == 0 {
			if attempt == 0 {
				s.refreshMembership(max(clientEpoch, 1))
				continue
			}
			return errs.New(errs.ErrMoved, "server %s has no membership map from the master yet: refresh the membership map and retry", s.cfg.ID)
		}
		n := ms.Replicas(ref.Pool)
		if n == 0 {
			return errs.New(errs.ErrNotFound, "no pool %q", ref.Pool)
		}
		if placement.Owns(ref.Key, ms.Members, n, s.cfg.ID) {
			return nil
		}
		if attempt == 0 && clientEpoch > ms.Epoch {
			s.refreshMembership(clientEpoch)
			continue
		}
		return errs.New(errs.ErrMoved, "server %s does not own this key at epoch %d: refresh the membership map", s.cfg.ID, ms.Epoch)
	}
}

// ownsNow reports whether this server owns ref's key under the membership
// map it has, without asking the master for a newer one (checkOwner does,
// on the request's own goroutine: not on a connection's reader).
func (s *Server) ownsNow(ref wire.KVRef) bool {
	if s.master == nil {
		return true
	}
	ms := s.membership()
	if ms == nil {
		return false
	}
	n := ms.Replicas(ref.Pool)
	return n > 0 && placement.Owns(ref.Key, ms.Members, n, s.cfg.ID)
}

// minRefresh is the least time between two membership refreshes a client's
// epoch asks for: the epoch in a frame is the client's number, and must not
// drive the master's load (issue 22 finding 6: 2,000 frames with a future
// epoch cost 4,006 heartbeats). A server that really is behind catches up
// with the first refresh; a lying epoch gets at most one per interval.
const minRefresh = 250 * time.Millisecond

// refreshMembership heartbeats now so the map reaches epoch want, unless
// another caller's refresh, made while this one waited for the lock, already
// brought it there, or the last refresh was under minRefresh ago.
func (s *Server) refreshMembership(want int64) {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	if ms := s.membership(); ms != nil && ms.Epoch >= want {
		return
	}
	if !s.lastRefresh.IsZero() && time.Since(s.lastRefresh) < minRefresh {
		return
	}
	s.lastRefresh = time.Now()
	ctx, cancel := context.WithTimeout(s.life, 5*time.Second)
	defer cancel()
	s.heartbeat(ctx)
}

// kvPut stores a KV put here (the key's owner at the client's epoch) and
// on the replicas its ref names. With res (a value received straight into
// reserved DRAM pages, no replicas to forward to) value is nil and res is committed or, on any
// error, released.
func (s *Server) kvPut(ref wire.KVRef, epoch int64, overwrite bool, value []byte, crc uint32, res *kvstore.Reservation) (bool, error) {
	if res != nil {
		defer res.Release() // nothing after its Commit
		if len(ref.Forward) > 0 {
			return false, errs.New(errs.ErrInternal, "a put received into DRAM pages has replicas to forward to")
		}
	}
	if s.kv == nil {
		return false, errNoKV(s.cfg.ID)
	}
	if err := checkKVRef(ref, false); err != nil {
		return false, err
	}
	if err := s.checkOwner(ref, epoch); err != nil {
		return false, err
	}
	// Held for the local write only, not while replicas take theirs: two
	// servers forwarding to each other never wait on each other's stripes.
	unlock := s.kvBeforeWrite(ref, overwrite)
	var wg sync.WaitGroup
	errc := make(chan error, len(ref.Forward))
	for _, addr := range ref.Forward {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(s.life, 60*time.Second)
			defer cancel()
			if _, err := s.peers.KVPut(ctx, addr, wire.KVRef{Pool: ref.Pool, Key: ref.Key}, epoch, value, overwrite, crc); err != nil {
				errc <- fmt.Errorf("replica %s: %w", addr, err)
			}
		}()
	}
	var existed bool
	var err error
	if res != nil {
		existed, err = res.Commit(crc, overwrite)
	} else {
		existed, err = s.kv.PutChecked(kvKey(ref), value, crc, overwrite)
	}
	if err == nil && (!existed || overwrite) {
		err = s.kvOwnerAfterWrite(ref)
	}
	unlock()
	wg.Wait()
	close(errc)
	if err == nil {
		err = <-errc
	}
	return existed, err
}

func errNoKV(id string) error {
	return errs.New(errs.ErrUnavailable, "server %s has no KV tier: start it with --kv-mem and/or --kv-disk", id)
}

// kvPutFrame serves an OpKVPut; a key that existed and was kept is
// answered with wire.FlagExisted.
func (s *Server) kvPutFrame(dc *dataConn, h wire.Header, ref wire.KVRef, value []byte, res *kvstore.Reservation, start time.Time) error {
	existed, err := s.kvPut(ref, int64(h.Offset), h.Flags&wire.FlagOverwrite != 0, value, h.PayloadCRC, res)
	if err == nil && existed {
		s.metrics.observe(h.Op, start, nil)
		dc.send(h, wire.StatusOK, nil, wire.FlagExisted)
		return errAnswered
	}
	return err
}

// kvLocalKey checks a KV frame other than put (the ref; that this server
// owns the key at the client's epoch, unless it deletes by prefix) and
// returns the key in the store.
func (s *Server) kvLocalKey(h wire.Header, ref wire.KVRef, prefixDelete bool) ([]byte, error) {
	if s.kv == nil {
		return nil, errNoKV(s.cfg.ID)
	}
	if err := checkKVRef(ref, prefixDelete); err != nil {
		return nil, err
	}
	if !prefixDelete && !isHeld(h) {
		if err := s.checkOwner(ref, int64(h.Offset)); err != nil {
			return nil, err
		}
	}
	if isHeld(h) {
		if err := s.kvCatchUp(int64(h.Offset)); err != nil {
			return nil, err
		}
	}
	return kvKey(ref), nil
}

func (s *Server) kvGet(dc *dataConn, h wire.Header, ref wire.KVRef, start time.Time) error {
	key, err := s.kvLocalKey(h, ref, false)
	if err != nil {
		return err
	}
	sent := false
	send := func(bufs [][]byte, crc uint32) error {
		sent = true
		var n int
		for _, b := range bufs {
			n += len(b)
		}
		s.metrics.bytesOut.Add(float64(n))
		return dc.sendCRC(h, wire.StatusOK, bufs, 0, crc)
	}
	_, err = s.kv.Get(key, send)
	if !sent && errors.Is(err, errs.ErrNotFound) && !isHeld(h) && s.kvFallbackGet(ref) {
		_, err = s.kv.Get(key, send) // moved here from its owner under an earlier map
	}
	if !sent {
		return err
	}
	s.metrics.observe(h.Op, start, err)
	return errAnswered
}

func (s *Server) kvExists(dc *dataConn, h wire.Header, ref wire.KVRef, start time.Time) error {
	key, err := s.kvLocalKey(h, ref, false)
	if err != nil {
		return err
	}
	tier, size := s.kv.Exists(key)
	if tier == kvstore.TierNone && !isHeld(h) {
		if sz, t, ok := s.kvFallbackExists(ref); ok {
			tier, size = kvstore.Tier(t), sz
		} else {
			// A move lands here before it leaves the old owner: a block
			// that moved while we asked is here now.
			tier, size = s.kv.Exists(key)
		}
	}
	if tier == kvstore.TierNone {
		return errs.New(errs.ErrNotFound, "")
	}
	if tier == kvstore.TierDisk && h.Flags&wire.FlagPrefetch != 0 {
		s.kvPrefetch(key)
	}
	out := h
	out.Offset, out.Count = uint64(size), uint64(tier)
	dc.send(out, wire.StatusOK, nil, 0)
	s.metrics.observe(h.Op, start, nil)
	return errAnswered
}

func (s *Server) kvDelete(dc *dataConn, h wire.Header, ref wire.KVRef, start time.Time) error {
	prefixDelete := h.Flags&wire.FlagPrefix != 0
	key, err := s.kvLocalKey(h, ref, prefixDelete)
	if err != nil {
		return err
	}
	var n int
	if prefixDelete {
		done := func() {}
		if !isHeld(h) {
			done = s.kvPrefixDeleteOld(ref) // holds every stripe until the earlier members deleted too
		}
		n, err = s.kv.DeleteByPrefix(key)
		done()
	} else {
		done := func() {}
		if !isHeld(h) {
			done = s.kvBeforeDelete(ref) // and delete the copies of earlier owners
		}
		var found bool
		found, err = s.kv.Delete(key)
		if err == nil && !isHeld(h) {
			err = s.kvOwnerAfterWrite(ref)
		}
		done()
		if found {
			n = 1
		}
	}
	if err != nil {
		return err
	}
	out := h
	out.Offset = uint64(n)
	dc.send(out, wire.StatusOK, nil, 0)
	s.metrics.observe(h.Op, start, nil)
	return errAnswered
}

// KV exposes the KV store (nil without KV tiers), for tests and status.
func (s *Server) KV() *kvstore.Store { return s.kv }

// Epoch is the membership epoch this server last heard from the master.
func (s *Server) Epoch() int64 {
	if ms := s.membership(); ms != nil {
		return ms.Epoch
	}
	return 0
}
