package client

import (
	"context"
	"errors"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/placement"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// KVPrefetcher is a KVTransport that can also ask a server to bring a hit
// from its disk tier to DRAM (ExistsOptions.Prefetch). The TCP transport
// is one; with another, a prefetch probe is a plain KVExists.
type KVPrefetcher interface {
	// KVExistsPrefetch is KVExists, and addr starts copying the block to
	// its DRAM at once if it found it on disk.
	KVExistsPrefetch(ctx context.Context, addr string, ref KVRef, epoch int64) (size int64, tier int, err error)
}

func (t tcpTransport) KVExistsPrefetch(ctx context.Context, addr string, ref KVRef, epoch int64) (int64, int, error) {
	return t.p.KVExistsPrefetch(ctx, addr, wire.KVRef(ref), epoch)
}

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
	pf, ok := kv.c.tr.(KVPrefetcher)
	exists := kv.c.tr.KVExists // a transport without prefetch: a plain probe
	if ok {
		exists = pf.KVExistsPrefetch
	}
	hits = make([]bool, len(keys))
	es := make([]error, len(keys))
	forEach(len(keys), func(i int) {
		err := kv.withOwners(ctx, keys[i], func(owners []placement.Member, epoch int64) error {
			var last error
			for _, m := range owners {
				rctx, cancel := kv.ctx(ctx, 0)
				_, _, serr := exists(rctx, m.Addr, KVRef{Pool: kv.pool, Key: []byte(keys[i])}, epoch)
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
