package tcp

import (
	"context"

	"github.com/gd2fs/gd2fs/internal/wire"
)

// PrefetchChunk asks addr to copy chunk id from its disk tier into DRAM
// (OpStat with wire.FlagPrefetch) and answers once the server has started the
// copy, not when it is done. A server older than the flag answers the stat
// and copies nothing.
func (p *Pool) PrefetchChunk(ctx context.Context, addr string, id uint64) error {
	_, err := p.Do(ctx, addr, &Request{Op: wire.OpStat, Flags: wire.FlagPrefetch, Key: chunkKey(id)})
	return err
}
