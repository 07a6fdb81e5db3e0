package tcp

import (
	"context"

	"github.com/gd2fs/gd2fs/internal/wire"
)

// The calls below carry wire.FlagHeld: addr answers from what it holds,
// without checking that it owns the key now. Servers use them to find and
// move blocks whose owner changed with the membership map.

// KVGetHeld reads ref's value from what addr holds, into a new slice.
func (p *Pool) KVGetHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) ([]byte, error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVGet, Flags: wire.FlagHeld, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch), Alloc: true})
	if err != nil {
		return nil, err
	}
	return r.Body, nil
}

// KVExistsHeld is KVExists on what addr holds.
func (p *Pool) KVExistsHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (size int64, tier int, err error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVExists, Flags: wire.FlagHeld, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch)})
	return int64(r.Header.Offset), int(r.Header.Count), err
}

// KVDeleteHeld deletes ref from what addr holds and reports whether it was there.
func (p *Pool) KVDeleteHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (bool, error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVDelete, Flags: wire.FlagHeld, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch)})
	return r.Header.Offset > 0, err
}

// KVDeletePrefixHeld deletes every key of ref.Pool starting with ref.Key on
// addr only (a server passes a FlagHeld prefix delete on to no one).
func (p *Pool) KVDeletePrefixHeld(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (int64, error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVDelete, Flags: wire.FlagPrefix | wire.FlagHeld, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch)})
	return int64(r.Header.Offset), err
}

// KVExistsPrefetch is KVExists with wire.FlagPrefetch: a hit on addr's disk
// tier is copied to its DRAM at once.
func (p *Pool) KVExistsPrefetch(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (size int64, tier int, err error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVExists, Flags: wire.FlagPrefetch, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch)})
	return int64(r.Header.Offset), int(r.Header.Count), err
}

// KVRetain changes the pin, priority and TTL of ref on addr (with prefix,
// of every key of ref.Pool there starting with ref.Key; with held, of what
// addr holds whoever owns it) and returns the block's retention after it
// and how many blocks changed.
func (p *Pool) KVRetain(ctx context.Context, addr string, ref wire.KVRef, epoch int64, r wire.Retain, prefix, held bool) (wire.Retain, int64, error) {
	var flags uint16
	if prefix {
		flags |= wire.FlagPrefix
	}
	if held {
		flags |= wire.FlagHeld
	}
	resp, err := p.Do(ctx, addr, &Request{Op: wire.OpKVRetain, Flags: flags, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch),
		Payload: [][]byte{wire.AppendRetain(nil, r)}, Alloc: true})
	if err != nil {
		return wire.Retain{}, 0, err
	}
	got, err := wire.ParseRetain(resp.Body)
	return got, int64(resp.Header.Offset), err
}
