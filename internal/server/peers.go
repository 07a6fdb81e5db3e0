package server

import (
	"context"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// peers is the server's side of its client.PeerTransport (Config.Peers):
// the calls the server makes to other servers, in the wire types it
// handles, put on the transport's public types (the same fields, so the
// conversions copy nothing). Chunk reads, stats, extents and KV scans are
// the transport's own methods; the rest are below.
type peers struct{ client.PeerTransport }

// ForwardChunkV sends a replica its copy of a write (data, as DRAM pages or
// one buffer) with the CRC the primary verified; flags are the forward's
// (wire.FlagSync asks the replica to sync before it answers).
func (p peers) ForwardChunkV(ctx context.Context, addr string, id uint64, off int64, data [][]byte, crc uint32, flags uint16) error {
	return p.ForwardChunk(ctx, addr, id, off, data, crc, flags&wire.FlagSync != 0)
}

// KVPut forwards a put to a replica, with the value's verified CRC.
func (p peers) KVPut(ctx context.Context, addr string, ref wire.KVRef, epoch int64, value []byte, overwrite bool, crc uint32) (bool, error) {
	return p.KVPutChecked(ctx, addr, client.KVRef(ref), epoch, value, overwrite, crc)
}

func (p peers) KVGetHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) ([]byte, error) {
	return p.PeerTransport.KVGetHeld(ctx, addr, client.KVRef(ref), epoch)
}

func (p peers) KVExistsHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (int64, int, error) {
	return p.PeerTransport.KVExistsHeld(ctx, addr, client.KVRef(ref), epoch)
}

func (p peers) KVDeleteHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (bool, error) {
	return p.PeerTransport.KVDeleteHeld(ctx, addr, client.KVRef(ref), epoch)
}

func (p peers) KVDeletePrefixHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (int64, error) {
	return p.PeerTransport.KVDeletePrefixHeld(ctx, addr, client.KVRef(ref), epoch)
}

// KVRetentionHeld reads the pin, priority and TTL of the block ref that
// addr holds, as the wire carries them (TTL in milliseconds, -1 none, -2
// just expired).
func (p peers) KVRetentionHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (wire.Retain, error) {
	r, gone, err := p.PeerTransport.KVRetentionHeld(ctx, addr, client.KVRef(ref), epoch)
	if err != nil {
		return wire.Retain{}, err
	}
	w := wire.Retain{Set: wire.RetainPin | wire.RetainPriority | wire.RetainTTL, Priority: int8(r.Priority), TTL: -1} // as RetainOf answers
	switch r.Pin {
	case "dram":
		w.Pin = 1
	case "disk":
		w.Pin = 2
	}
	switch {
	case gone:
		w = wire.Retain{TTL: -2}
	case r.TTL > 0:
		w.TTL = r.TTL.Milliseconds()
	}
	return w, nil
}
