package server

import (
	"context"
	"errors"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// kvRetain serves an OpKVRetain: pin, priority and TTL of one block (or,
// with wire.FlagPrefix, of every block of the pool on this server whose key
// starts with ref.Key), answering the block's retention after the change.
// A block not here but held by an earlier owner is moved here first, as a
// read would move it.
func (s *Server) kvRetain(dc *dataConn, h wire.Header, ref wire.KVRef, r wire.Retain, start time.Time) error {
	prefix := h.Flags&wire.FlagPrefix != 0
	key, err := s.kvLocalKey(h, ref, prefix)
	if err != nil {
		return err
	}
	c := RetainChange(r, s.kv.Now())
	out := h
	var ret wire.Retain
	if prefix {
		n, err := s.kv.RetainPrefix(key, c)
		if err != nil {
			return err
		}
		out.Offset = uint64(n)
	} else {
		got, err := s.kv.Retain(key, c)
		if errors.Is(err, errs.ErrNotFound) && !isHeld(h) && s.kvFallbackGet(ref) {
			got, err = s.kv.Retain(key, c) // moved here from its owner under an earlier map
		}
		if err != nil {
			return err
		}
		ret = RetainOf(got, s.kv.Now())
		if c.SetExpire && !c.Expire.IsZero() && !c.Expire.After(s.kv.Now()) {
			ret = wire.Retain{TTL: -2} // expired at once: deleted
		}
		out.Offset = 1
	}
	dc.send(out, wire.StatusOK, [][]byte{wire.AppendRetain(nil, ret)}, 0)
	s.metrics.observe(h.Op, start, nil)
	return errAnswered
}

// RetainChange turns a wire change into the store's, a TTL counted from now.
func RetainChange(r wire.Retain, now time.Time) kvstore.Change {
	c := kvstore.Change{
		SetPin: r.Set&wire.RetainPin != 0, Pin: kvstore.Tier(r.Pin),
		SetPriority: r.Set&wire.RetainPriority != 0, Priority: r.Priority,
		SetExpire: r.Set&wire.RetainTTL != 0,
	}
	if c.SetExpire && r.TTL >= 0 {
		c.Expire = now.Add(limits.TTLMillis(r.TTL))
	}
	return c
}

// RetainOf is the wire form of a block's retention: the TTL as the ms left
// from now (at least 1 while it lasts), -1 for none.
func RetainOf(r kvstore.Retention, now time.Time) wire.Retain {
	w := wire.Retain{Set: wire.RetainPin | wire.RetainPriority | wire.RetainTTL, Pin: uint8(r.Pin), Priority: r.Priority, TTL: -1}
	if !r.Expires.IsZero() {
		w.TTL = max(1, (r.Expires.Sub(now) + time.Millisecond - 1).Milliseconds())
	}
	return w
}

// kvRetentionAt reads ref's pin, priority and TTL from what src holds
// (errs.ErrNotFound when it holds no such block), before a move copies it.
func (s *Server) kvRetentionAt(src string, epoch int64, ref wire.KVRef) (wire.Retain, error) {
	ctx, cancel := context.WithTimeout(s.life, s.cfg.ForwardTimeout)
	defer cancel()
	return s.peers.KVRetentionHeld(ctx, src, wire.KVRef{Pool: ref.Pool, Key: ref.Key}, epoch)
}

// kvApplyRetention gives a block just moved here the pin, priority and TTL
// it had on its earlier owner (a moved block must not outlive its TTL). A
// pin this server cannot take (no such tier, or its quota full) is logged
// and left out; the TTL and priority are kept all the same.
func (s *Server) kvApplyRetention(key []byte, r wire.Retain) {
	if r.Pin == 0 && r.Priority == 0 && r.TTL == -1 {
		return
	}
	// Priority and TTL first, on their own: the store refuses a change
	// whole, and a refused pin must not take the TTL with it (the block
	// would then never expire).
	r.Set = wire.RetainPriority | wire.RetainTTL
	if _, err := s.kv.Retain(key, RetainChange(r, s.kv.Now())); err != nil {
		s.log.Warn("kv move: the block's priority and TTL not kept here", "err", err)
		return
	}
	if r.Pin == 0 {
		return
	}
	r.Set = wire.RetainPin
	if _, err := s.kv.Retain(key, RetainChange(r, s.kv.Now())); err != nil {
		s.log.Warn("kv move: the block's pin not kept here (its TTL and priority are)", "err", err)
	}
}

// kvExpiryLoop drops expired KV blocks nobody reads, a batch a second
// (reads drop the ones they meet themselves).
func (s *Server) kvExpiryLoop() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.life.Done():
			return
		case <-t.C:
			for s.kv.ExpireDue(256) == 256 {
				if s.life.Err() != nil {
					return
				}
			}
		}
	}
}
