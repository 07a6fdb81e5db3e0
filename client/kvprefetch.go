package client

import (
	"context"
	"errors"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/placement"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// ExistsOptions change an exists probe.
type ExistsOptions struct {
	// Prefetch: each hit found on a server's disk tier is copied to its
	// DRAM at once (not pinned, not counted as a read), so a read of the
	// chain a little later finds it in DRAM. For an engine that asks
	// whether a request's chain is cached when it schedules the request
	// and loads the blocks when it runs it.
	Prefetch bool
}

// BatchExistsWith is BatchExists with options.
func (kv *KV) BatchExistsWith(ctx context.Context, keys []string, o ExistsOptions) (hits []bool, prefix int, err error) {
	if !o.Prefetch {
		return kv.BatchExists(ctx, keys)
	}
	tr, err := kv.c.kvTransport()
	if err != nil {
		return nil, 0, err
	}
	hits = make([]bool, len(keys))
	es := make([]error, len(keys))
	forEach(len(keys), func(i int) {
		err := kv.withOwners(ctx, keys[i], func(owners []placement.Member, epoch int64) error {
			var last error
			for _, m := range owners {
				rctx, cancel := kv.ctx(ctx, 0)
				_, _, serr := tr.KVExistsPrefetch(rctx, m.Addr, wire.KVRef{Pool: kv.pool, Key: []byte(keys[i])}, epoch)
				cancel()
				if serr == nil || errors.Is(serr, errs.ErrMoved) {
					return serr
				}
				last = serr
			}
			return last
		})
		hits[i] = err == nil
		if err != nil && !isMiss(err) {
			es[i] = err
		}
	})
	for prefix < len(hits) && hits[prefix] {
		prefix++
	}
	return hits, prefix, batchErr(es)
}
