package client

import (
	"context"
	"time"

	"github.com/gd2fs/gd2fs/internal/wire"
)

// PeerTransport is the data plane between the cluster's own processes: a
// data server forwarding a client's write to the other replicas, copying
// chunks and KV blocks from its peers, and the master asking servers to
// copy chunks (repair) and probing what they hold. It is Transport plus the
// calls only members make (they present the cluster token). The composition
// root (internal/node) gives every server and master one; the TCP one
// (NewTCPPeerTransport) is the default, and a transport that implements
// PeerTransport as well as Transport (RDMA, GPU-direct) then carries every
// data hop, not only the client's. client/transporttest.RunPeer is its
// conformance suite. Errors carry the kinds of package errs, as Transport's.
type PeerTransport interface {
	Transport
	// ForwardChunk stores data (the bytes of data's buffers one after the
	// other) at off of chunk id on addr, as a replica's copy of a write:
	// addr forwards it no further. crc is the CRC32C of all of it, verified
	// by the sender already; addr checks it again and stores nothing on a
	// mismatch (errs.ErrChecksum). With sync, addr makes the bytes durable
	// (fdatasync) before it answers.
	ForwardChunk(ctx context.Context, addr string, id uint64, off int64, data [][]byte, crc uint32, sync bool) error
	// StatChunk returns the length of chunk id on addr and whether it is
	// sealed (errs.ErrNotFound when addr does not hold it).
	StatChunk(ctx context.Context, addr string, id uint64) (length int64, sealed bool, err error)
	// ChunkExtents returns which bytes of [off, off+n) of chunk id on addr
	// some write covered (flat pairs start, end, in order), and the
	// chunk's length and seal.
	ChunkExtents(ctx context.Context, addr string, id uint64, off, n int64) (ext []int64, length int64, sealed bool, err error)
	// CopyChunk asks addr to copy chunk id from the server src (repair);
	// it returns once addr holds it, synced.
	CopyChunk(ctx context.Context, addr string, id uint64, src string) error
	// PrefetchChunk asks addr to copy chunk id's blocks from its disk tier
	// into DRAM, a hint it may skip (busy, no room): nothing is pinned and
	// no read is counted. The master sends it for the stored ranges of a
	// session plan, so the engine's load that follows finds them in DRAM.
	PrefetchChunk(ctx context.Context, addr string, id uint64) error
	// KVPutChecked is KVPut for a value whose CRC32C crc the sender
	// verified already (a server forwarding a put to the other replicas).
	KVPutChecked(ctx context.Context, addr string, ref KVRef, epoch int64, value []byte, overwrite bool, crc uint32) (existed bool, err error)
	// The Held calls act on what addr holds, whoever owns the key at
	// epoch: servers use them to find and move blocks whose owner changed
	// with the membership map.
	KVGetHeld(ctx context.Context, addr string, ref KVRef, epoch int64) ([]byte, error)
	KVExistsHeld(ctx context.Context, addr string, ref KVRef, epoch int64) (size int64, tier int, err error)
	KVDeleteHeld(ctx context.Context, addr string, ref KVRef, epoch int64) (deleted bool, err error)
	// KVDeletePrefixHeld deletes every key of ref.Pool starting with
	// ref.Key on addr only, and returns how many went.
	KVDeletePrefixHeld(ctx context.Context, addr string, ref KVRef, epoch int64) (int64, error)
	// KVRetentionHeld returns the retention of the block ref that addr
	// holds (errs.ErrNotFound when none), changing nothing; gone: it has
	// just expired.
	KVRetentionHeld(ctx context.Context, addr string, ref KVRef, epoch int64) (r Retention, gone bool, err error)
}

// NewTCPPeerTransport is NewTCPTransport with the members' calls: the
// transport servers and the master use unless their composition gives them
// another.
func NewTCPPeerTransport(o TCPOptions) PeerTransport {
	return NewTCPTransport(o).(tcpTransport)
}

func (t tcpTransport) ForwardChunk(ctx context.Context, addr string, id uint64, off int64, data [][]byte, crc uint32, sync bool) error {
	var flags uint16
	if sync {
		flags = wire.FlagSync
	}
	return t.p.ForwardChunkV(ctx, addr, id, off, data, crc, flags)
}

func (t tcpTransport) StatChunk(ctx context.Context, addr string, id uint64) (int64, bool, error) {
	return t.p.StatChunk(ctx, addr, id)
}

func (t tcpTransport) ChunkExtents(ctx context.Context, addr string, id uint64, off, n int64) ([]int64, int64, bool, error) {
	return t.p.ChunkExtents(ctx, addr, id, off, n)
}

func (t tcpTransport) PrefetchChunk(ctx context.Context, addr string, id uint64) error {
	return t.p.PrefetchChunk(ctx, addr, id)
}

func (t tcpTransport) CopyChunk(ctx context.Context, addr string, id uint64, src string) error {
	return t.p.CopyChunk(ctx, addr, id, src)
}

func (t tcpTransport) KVPutChecked(ctx context.Context, addr string, ref KVRef, epoch int64, value []byte, overwrite bool, crc uint32) (bool, error) {
	return t.p.KVPut(ctx, addr, wire.KVRef(ref), epoch, value, overwrite, crc)
}

func (t tcpTransport) KVGetHeld(ctx context.Context, addr string, ref KVRef, epoch int64) ([]byte, error) {
	return t.p.KVGetHeld(ctx, addr, wire.KVRef(ref), epoch)
}

func (t tcpTransport) KVExistsHeld(ctx context.Context, addr string, ref KVRef, epoch int64) (int64, int, error) {
	return t.p.KVExistsHeld(ctx, addr, wire.KVRef(ref), epoch)
}

func (t tcpTransport) KVDeleteHeld(ctx context.Context, addr string, ref KVRef, epoch int64) (bool, error) {
	return t.p.KVDeleteHeld(ctx, addr, wire.KVRef(ref), epoch)
}

func (t tcpTransport) KVDeletePrefixHeld(ctx context.Context, addr string, ref KVRef, epoch int64) (int64, error) {
	return t.p.KVDeletePrefixHeld(ctx, addr, wire.KVRef(ref), epoch)
}

func (t tcpTransport) KVRetentionHeld(ctx context.Context, addr string, ref KVRef, epoch int64) (Retention, bool, error) {
	got, _, err := t.p.KVRetain(ctx, addr, wire.KVRef(ref), epoch, wire.Retain{}, false, true)
	if err != nil {
		return Retention{}, false, err
	}
	return retentionOf(got), got.TTL == -2, nil
}

// retentionOf reads a retention as the wire carries it (TTL in
// milliseconds; -1 none, -2 just expired).
func retentionOf(w wire.Retain) Retention {
	r := Retention{Pin: [...]string{"", "dram", "disk"}[min(w.Pin, 2)], Priority: int(w.Priority)}
	if w.TTL > 0 {
		r.TTL = time.Duration(w.TTL) * time.Millisecond
	}
	return r
}

var _ PeerTransport = tcpTransport{}
