package tcp

import (
	"context"

	"github.com/gd2fs/gd2fs/internal/wire"
)

// KVScan lists up to count keys of pool on addr from cursor on (count 0:
// none, only the total). It returns the keys, the next cursor (0 when the
// server has no more) and the number of keys of the pool on addr.
func (p *Pool) KVScan(ctx context.Context, addr, pool string, cursor uint64, count int) (keys []string, next uint64, total int64, err error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVScan, Key: wire.AppendKVRef(nil, wire.KVRef{Pool: pool}),
		Offset: cursor, Count: uint64(count), Alloc: true})
	if err != nil {
		return nil, 0, 0, err
	}
	keys, err = wire.ParseKeyList(r.Body)
	return keys, r.Header.Offset, int64(r.Header.Count), err
}
