package server

import (
	"errors"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// maxScanKeys bounds the keys one OpKVScan answers (1 KiB keys: ≤ 4 MiB).
const maxScanKeys = 4096

// kvScan lists this server's keys of a pool (OpKVScan): SCAN and DBSIZE of
// the RESP front end. Ownership is not checked: a server lists what it holds.
func (s *Server) kvScan(dc *dataConn, h wire.Header, ref wire.KVRef, start time.Time) error {
	if s.kv == nil {
		return errNoKV(s.cfg.ID)
	}
	keys, next, total := s.KVScanLocal(ref.Pool, h.Offset, int(min(h.Count, maxScanKeys)))
	out := h
	out.Offset, out.Count = next, uint64(total)
	if h.Count == 0 {
		keys = nil // a count only (DBSIZE)
	}
	dc.send(out, wire.StatusOK, [][]byte{wire.AppendKeyList(nil, keys)}, 0)
	s.metrics.observe(h.Op, start, nil)
	return errAnswered
}

// The methods below let a RESP front end in the same process serve the keys
// this server owns straight from its tiers, without a loopback round trip
// and without copying values (package resp).

// KVOwner reports whether this server may serve key of pool from its own
// tiers: it is the key's only owner (pool of one copy) in its membership
// map, or it runs without a master. Keys of pools with several copies go
// through the client path, which writes every copy.
func (s *Server) KVOwner(pool string, key []byte) bool {
	if s.kv == nil {
		return false
	}
	ms := s.membership()
	if ms == nil || len(ms.Members) == 0 {
		return s.master == nil
	}
	if ms.Replicas(pool) != 1 {
		return false
	}
	return s.checkOwner(wire.KVRef{Pool: pool, Key: key}, 0) == nil
}

// KVGetLocal calls fn with views of the value (valid only during fn); a
// miss is errs.ErrNotFound.
func (s *Server) KVGetLocal(pool string, key []byte, fn func(bufs [][]byte, size int) error) error {
	if s.kv == nil {
		return errNoKV(s.cfg.ID)
	}
	start := time.Now()
	sent := false
	send := func(bufs [][]byte, _ uint32) error {
		sent = true
		n := 0
		for _, b := range bufs {
			n += len(b)
		}
		s.metrics.bytesOut.Add(float64(n))
		return fn(bufs, n)
	}
	ref := wire.KVRef{Pool: pool, Key: key}
	_, err := s.kv.Get(kvKey(ref), send)
	if !sent && errors.Is(err, errs.ErrNotFound) && s.kvFallbackGet(ref) {
		_, err = s.kv.Get(kvKey(ref), send) // moved here from its owner under an earlier map, as kvGet does
	}
	if !sent && err == nil {
		err = errs.New(errs.ErrInternal, "kv get returned no value")
	}
	s.metrics.observe(wire.OpKVGet, start, err)
	return err
}

// KVPutLocal stores value (whose CRC32C is crc) under key; see kvstore.PutChecked.
func (s *Server) KVPutLocal(pool string, key, value []byte, crc uint32, overwrite bool) (existed bool, err error) {
	start := time.Now()
	s.metrics.bytesIn.Add(float64(len(value)))
	existed, err = s.kvPut(wire.KVRef{Pool: pool, Key: key}, 0, overwrite, value, crc, nil)
	s.metrics.observe(wire.OpKVPut, start, err)
	return existed, err
}

// KVReserveLocal returns DRAM pages for a value of size bytes that the
// caller fills itself (straight from its socket) and then hands to
// KVCommitReserved, or Releases; nil and no error where the value should
// go through KVPutLocal instead (see kvstore.Reserve).
func (s *Server) KVReserveLocal(pool string, key []byte, size int64, overwrite bool) (*kvstore.Reservation, error) {
	if s.kv == nil {
		return nil, errNoKV(s.cfg.ID)
	}
	return s.kv.Reserve(kvKey(wire.KVRef{Pool: pool, Key: key}), size, overwrite)
}

// KVCommitReserved is KVPutLocal for a filled reservation (crc: the CRC32C
// of its bytes), and ends it. When the membership map no longer makes this
// server the key's owner, nothing is stored and the value comes back (a
// copy) with errs.ErrMoved, for the caller to send to the owner. If the
// map moves the key while the value lands, the value is undone and the
// answer is errs.ErrUnavailable: the client retries (its bytes are gone
// with the reservation).
func (s *Server) KVCommitReserved(pool string, key []byte, r *kvstore.Reservation, crc uint32, overwrite bool) (existed bool, moved []byte, err error) {
	start := time.Now()
	defer func() { s.metrics.observe(wire.OpKVPut, start, err) }()
	ref := wire.KVRef{Pool: pool, Key: key}
	if err := s.checkOwner(ref, 0); err != nil {
		if !errors.Is(err, errs.ErrMoved) {
			r.Release()
			return false, nil, err
		}
		moved = make([]byte, 0, r.Size())
		for _, b := range r.Views() {
			moved = append(moved, b...)
		}
		r.Release()
		return false, moved, err
	}
	s.metrics.bytesIn.Add(float64(r.Size()))
	existed, err = s.kvPut(ref, 0, overwrite, nil, crc, r)
	if errors.Is(err, errs.ErrMoved) {
		err = errs.New(errs.ErrUnavailable, "the key %q moved to another server while its value landed here: retry", key)
	}
	return existed, nil, err
}

// KVStatLocal is KVExistsLocal for a key this server owns: a block held by
// the key's owner under an earlier map is found there, as kvExists does.
func (s *Server) KVStatLocal(pool string, key []byte) (size int64, found bool) {
	if n, ok := s.KVExistsLocal(pool, key); ok {
		return n, true
	}
	if s.kv == nil {
		return 0, false
	}
	if n, _, ok := s.kvFallbackExists(wire.KVRef{Pool: pool, Key: key}); ok {
		return n, true
	}
	return s.KVExistsLocal(pool, key) // a move lands here before it leaves the old owner
}

// KVExistsLocal returns the size of key's value held here, or found=false.
func (s *Server) KVExistsLocal(pool string, key []byte) (size int64, found bool) {
	if s.kv == nil {
		return 0, false
	}
	tier, n := s.kv.Exists(kvKey(wire.KVRef{Pool: pool, Key: key}))
	return n, tier != kvstore.TierNone
}

// KVDeleteLocal removes key and reports whether it was there.
func (s *Server) KVDeleteLocal(pool string, key []byte) (bool, error) {
	if s.kv == nil {
		return false, errNoKV(s.cfg.ID)
	}
	// As kvDelete: the copies of earlier owners go too, and a delete that
	// lands after the map moved the key is answered moved.
	ref := wire.KVRef{Pool: pool, Key: key}
	done := s.kvBeforeDelete(ref)
	found, err := s.kv.Delete(kvKey(ref))
	if err == nil {
		err = s.kvOwnerAfterWrite(ref)
	}
	done()
	return found, err
}

// KVScanLocal lists this server's keys of pool; see kvstore.Store.Scan.
func (s *Server) KVScanLocal(pool string, cursor uint64, count int) (keys []string, next uint64, total int) {
	if s.kv == nil {
		return nil, 0, 0
	}
	return s.kv.Scan(append([]byte(pool), 0), cursor, count)
}
