package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/placement"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// RetainOptions change what keeps a block beside its use (docs/kv-cache.md,
// "Pins, TTLs and priorities"). Fields left at their zero value leave that
// part as it is.
type RetainOptions struct {
	// Pin: "dram" keeps the block in DRAM, "disk" keeps it stored (on disk
	// when it leaves DRAM), "none" unpins. Each server bounds its pins
	// (--kv-pin-quota); a pin beyond is refused with errs.ErrNoSpace.
	Pin string
	// SetPriority: give the block Priority (-7 to 7, 0 by default):
	// eviction takes lower priorities first.
	SetPriority bool
	Priority    int
	// SetTTL: the block expires TTL from now (as Redis's EXPIRE; 0 or less
	// deletes it at once).
	SetTTL bool
	TTL    time.Duration
	// Persist removes the block's TTL.
	Persist bool
}

// Retention is what keeps a block: its pin ("", "dram" or "disk"), its
// priority and the time left before it expires (0: it does not).
type Retention struct {
	Pin      string
	Priority int
	TTL      time.Duration
}

// KVRetainer is a KVTransport that can change a block's retention. The TCP
// transport is one.
type KVRetainer interface {
	// KVRetain applies o to ref on addr (with prefix, to every key of
	// ref.Pool there starting with ref.Key) and returns the block's
	// retention after it (gone: it expired at once) and how many blocks
	// changed.
	KVRetain(ctx context.Context, addr string, ref KVRef, epoch int64, o RetainOptions, prefix bool) (r Retention, gone bool, n int64, err error)
}

var pinTiers = map[string]uint8{"none": 0, "dram": 1, "disk": 2}

// wireRetain checks o and turns it into the wire change.
func wireRetain(o RetainOptions) (wire.Retain, error) {
	var r wire.Retain
	if o.Pin != "" {
		t, ok := pinTiers[o.Pin]
		if !ok {
			return r, errs.New(errs.ErrBadRequest, "pin %q: want dram, disk or none", o.Pin)
		}
		r.Set |= wire.RetainPin
		r.Pin = t
	}
	if o.SetPriority {
		if o.Priority < -7 || o.Priority > 7 {
			return r, errs.New(errs.ErrBadRequest, "priority %d: want -7 to 7", o.Priority)
		}
		r.Set |= wire.RetainPriority
		r.Priority = int8(o.Priority)
	}
	switch {
	case o.SetTTL && o.Persist:
		return r, errs.New(errs.ErrBadRequest, "a TTL and Persist together: choose one")
	case o.SetTTL:
		r.Set |= wire.RetainTTL
		r.TTL = max(0, (min(o.TTL, limits.MaxTTL) + time.Millisecond - 1).Milliseconds())
	case o.Persist:
		r.Set |= wire.RetainTTL
		r.TTL = -1
	}
	return r, nil
}

func (t tcpTransport) KVRetain(ctx context.Context, addr string, ref KVRef, epoch int64, o RetainOptions, prefix bool) (Retention, bool, int64, error) {
	wr, err := wireRetain(o)
	if err != nil {
		return Retention{}, false, 0, err
	}
	got, n, err := t.p.KVRetain(ctx, addr, wire.KVRef(ref), epoch, wr, prefix, false)
	if err != nil {
		return Retention{}, false, 0, err
	}
	return retentionOf(got), got.TTL == -2, n, nil
}

func (kv *KV) retainer() (KVRetainer, error) {
	rt, ok := kv.c.tr.(KVRetainer)
	if !ok {
		return nil, errs.New(errs.ErrUnavailable, "this client's transport cannot pin or expire KV blocks: use the TCP transport")
	}
	return rt, nil
}

// Retain changes key's pin, priority or TTL on every copy and returns its
// retention after the change. A missing key is errs.ErrNotFound; gone
// reports that the block expired at once (a TTL of 0 or less) and is
// deleted. Exists, Stat and prefetch probes never change retention.
func (kv *KV) Retain(ctx context.Context, key string, o RetainOptions) (r Retention, gone bool, err error) {
	if _, err := wireRetain(o); err != nil {
		return r, false, err
	}
	rt, err := kv.retainer()
	if err != nil {
		return r, false, err
	}
	err = kv.withOwners(ctx, key, func(owners []placement.Member, epoch int64) error {
		for i, m := range owners {
			rctx, cancel := kv.ctx(ctx, 0)
			got, g, _, rerr := rt.KVRetain(rctx, m.Addr, KVRef{Pool: kv.pool, Key: []byte(key)}, epoch, o, false)
			cancel()
			if rerr != nil {
				if errors.Is(rerr, errs.ErrNotFound) {
					return errs.New(errs.ErrNotFound, "kv: no block %q in pool %s", trim(key), kv.pool)
				}
				if errors.Is(rerr, errs.ErrMoved) {
					return rerr
				}
				return fmt.Errorf("kv retain %q on %s: %w", trim(key), m.ID, rerr)
			}
			if i == 0 {
				r, gone = got, g
			}
		}
		return nil
	})
	return r, gone, err
}

// Retention returns key's pin, priority and TTL left, or errs.ErrNotFound.
func (kv *KV) Retention(ctx context.Context, key string) (Retention, error) {
	rt, err := kv.retainer()
	if err != nil {
		return Retention{}, err
	}
	var r Retention
	err = kv.withOwners(ctx, key, func(owners []placement.Member, epoch int64) error {
		var last error
		for _, m := range owners {
			rctx, cancel := kv.ctx(ctx, 0)
			got, _, _, rerr := rt.KVRetain(rctx, m.Addr, KVRef{Pool: kv.pool, Key: []byte(key)}, epoch, RetainOptions{}, false)
			cancel()
			if rerr == nil || errors.Is(rerr, errs.ErrMoved) {
				r = got
				return rerr
			}
			last = rerr // a miss or a dead replica: ask the next copy
		}
		if errors.Is(last, errs.ErrNotFound) {
			return errs.New(errs.ErrNotFound, "kv: no block %q in pool %s", trim(key), kv.pool)
		}
		return last
	})
	return r, err
}

// RetainPrefix applies o to every block of this pool whose key starts with
// prefix (a model's blocks, a shared system prompt's chain when its keys
// share a prefix), on every server, and returns how many changed. A server
// whose pin quota fills stops there: the error says so, and the blocks
// before it keep their change.
func (kv *KV) RetainPrefix(ctx context.Context, prefix string, o RetainOptions) (int64, error) {
	if o.SetTTL && o.TTL <= 0 {
		return 0, errs.New(errs.ErrBadRequest, "a TTL of 0 or less by prefix would delete: use DeleteByPrefix")
	}
	if _, err := wireRetain(o); err != nil {
		return 0, err
	}
	rt, err := kv.retainer()
	if err != nil {
		return 0, err
	}
	return kv.onEveryServer(ctx, "retain prefix", func(rctx context.Context, addr string, epoch int64) (int64, error) {
		_, _, n, err := rt.KVRetain(rctx, addr, KVRef{Pool: kv.pool, Key: []byte(prefix)}, epoch, o, true)
		return n, err
	})
}
