package tcp

import (
	"context"

	"github.com/gd2fs/gd2fs/internal/wire"
)

// ChunkExtents asks addr which bytes of [off, off+n) of chunk id some write
// covered (flat pairs [start, end, ...], in order), and the chunk's length
// and seal. The master asks it before it records written bytes; a server
// asks it of the source of a copy, so the copy claims only what was written.
func (p *Pool) ChunkExtents(ctx context.Context, addr string, id uint64, off, n int64) (ext []int64, length int64, sealed bool, err error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpExtents, Key: chunkKey(id), Offset: uint64(off), Count: uint64(n), Alloc: true})
	if err != nil {
		return nil, 0, false, err
	}
	ext, err = wire.ParseExtents(r.Body)
	return ext, int64(r.Header.Offset), r.Header.Flags&wire.FlagSealed != 0, err
}
