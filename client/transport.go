package client

import (
	"context"
	"crypto/tls"

	"github.com/gd2fs/gd2fs/internal/tcp"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// Transport is the data plane under the SDK: how chunk bytes, cold fills and
// KV blocks move between this client and the data servers. The TCP
// transport (NewTCPTransport) is the default; another one (RDMA, GPU-direct)
// is set in Config.Transport and must pass the conformance suite in
// client/transporttest. Its methods are safe for concurrent use; addr is a
// data server's address as the master hands it out. Errors carry the kinds
// of package errs (errs.ErrNotFound, errs.ErrOutOfRange, errs.ErrSealed,
// errs.ErrChecksum, errs.ErrTooLarge, errs.ErrMoved, errs.ErrUnavailable,
// ...), which the SDK acts on: a checksum or an unreachable server makes it
// try another replica, moved refreshes the KV membership map.
type Transport interface {
	ChunkTransport
	KVTransport
	// Close releases the transport's connections; calls after it fail.
	Close()
}

// ChunkTransport moves the bytes of file chunks.
type ChunkTransport interface {
	// WriteChunk writes data at off of chunk id on addr, which forwards the
	// same bytes to the servers in forward and succeeds only when every
	// copy holds them.
	WriteChunk(ctx context.Context, addr string, id uint64, off int64, data []byte, forward []string) error
	// ReadChunk fills dst with the bytes at off of chunk id on addr, all of
	// them or an error (errs.ErrOutOfRange past what was written,
	// errs.ErrNotFound for a chunk addr does not hold). Bytes that fail
	// their CRC32C are an errs.ErrChecksum, never data.
	ReadChunk(ctx context.Context, addr string, id uint64, off int64, dst []byte) error
	// ReadChunkCold is ReadChunk for a chunk of a linked file: a server
	// that does not hold it fills it from the cold tier first (once,
	// however many ask); filled reports that this read waited for a fill.
	ReadChunkCold(ctx context.Context, addr string, ref ColdRef, off int64, dst []byte) (filled bool, err error)
	// SealChunk makes chunk id on addr immutable: writes to it then fail
	// with errs.ErrSealed.
	SealChunk(ctx context.Context, addr string, id uint64) error
}

// KVTransport moves hash-mode KV blocks. epoch is the client's membership
// epoch: a server that does not own the key at it answers errs.ErrMoved.
type KVTransport interface {
	// KVPut stores value under ref on addr, which forwards it to
	// ref.Forward. Without overwrite a key that exists is kept, and existed
	// reports it.
	KVPut(ctx context.Context, addr string, ref KVRef, epoch int64, value []byte, overwrite bool) (existed bool, err error)
	// KVGet returns ref's value: in dst when dst is not nil (the value must
	// fit, else errs.ErrTooLarge), else in a new slice; errs.ErrNotFound
	// on a miss.
	KVGet(ctx context.Context, addr string, ref KVRef, epoch int64, dst []byte) ([]byte, error)
	// KVExists returns the size of ref's value and the tier holding it (1
	// DRAM, 2 disk); errs.ErrNotFound on a miss.
	KVExists(ctx context.Context, addr string, ref KVRef, epoch int64) (size int64, tier int, err error)
	// KVDelete deletes ref (with prefix, every key of the pool starting
	// with ref.Key) on addr and returns how many keys went.
	KVDelete(ctx context.Context, addr string, ref KVRef, epoch int64, prefix bool) (int64, error)
	// KVScan lists up to count keys of pool on addr from cursor on (0 to
	// start; count 0: only the total). next is 0 when addr has no more;
	// total counts the pool's keys on addr. Cursors fit in
	// 56 bits, so callers can put a server's index above them.
	KVScan(ctx context.Context, addr, pool string, cursor uint64, count int) (keys []string, next uint64, total int64, err error)
}

// ColdRef names the chunk of a linked file and where its bytes are in the
// cold tier: bytes [Offset, Offset+Length) of the object URI
// (s3://bucket/key), which must still have ETag.
type ColdRef struct {
	ID     uint64
	Offset int64
	Length int64
	URI    string
	ETag   string
}

// KVRef names a KV block: Key in Pool, and on a put the other replicas the
// receiving server forwards the value to.
type KVRef struct {
	Pool    string
	Key     []byte
	Forward []string
}

// TCPOptions configure the TCP transport.
type TCPOptions struct {
	Token      string      // cluster token sent in each connection's hello
	Name       string      // client name, for the servers' logs
	Streams    int         // connections per server (default 4)
	LocalAddrs []string    // local IPs to bind, round-robin (several NICs)
	TLS        *tls.Config // nil: plain TCP
}

// NewTCPTransport returns the TCP transport: pipelined connections, several
// per server, payloads read straight into the caller's buffers and checked
// against the CRC32C each frame carries (internal/tcp, docs/protocol.md).
func NewTCPTransport(o TCPOptions) Transport {
	return tcpTransport{tcp.NewPool(tcp.Options{Token: o.Token, Name: o.Name, Streams: o.Streams, LocalAddrs: o.LocalAddrs, TLS: o.TLS})}
}

// tcpTransport puts the public types on the TCP pool's wire types (the same
// fields: the conversions cost nothing).
type tcpTransport struct{ p *tcp.Pool }

func (t tcpTransport) WriteChunk(ctx context.Context, addr string, id uint64, off int64, data []byte, forward []string) error {
	return t.p.WriteChunk(ctx, addr, id, off, data, forward)
}

func (t tcpTransport) ReadChunk(ctx context.Context, addr string, id uint64, off int64, dst []byte) error {
	return t.p.ReadChunk(ctx, addr, id, off, dst)
}

func (t tcpTransport) ReadChunkCold(ctx context.Context, addr string, ref ColdRef, off int64, dst []byte) (bool, error) {
	return t.p.ReadChunkCold(ctx, addr, wire.ColdRef(ref), off, dst)
}

func (t tcpTransport) SealChunk(ctx context.Context, addr string, id uint64) error {
	return t.p.SealChunk(ctx, addr, id)
}

func (t tcpTransport) KVPut(ctx context.Context, addr string, ref KVRef, epoch int64, value []byte, overwrite bool) (bool, error) {
	return t.p.KVPut(ctx, addr, wire.KVRef(ref), epoch, value, overwrite, 0)
}

func (t tcpTransport) KVGet(ctx context.Context, addr string, ref KVRef, epoch int64, dst []byte) ([]byte, error) {
	return t.p.KVGet(ctx, addr, wire.KVRef(ref), epoch, dst)
}

func (t tcpTransport) KVExists(ctx context.Context, addr string, ref KVRef, epoch int64) (int64, int, error) {
	return t.p.KVExists(ctx, addr, wire.KVRef(ref), epoch)
}

func (t tcpTransport) KVDelete(ctx context.Context, addr string, ref KVRef, epoch int64, prefix bool) (int64, error) {
	return t.p.KVDelete(ctx, addr, wire.KVRef(ref), epoch, prefix)
}

func (t tcpTransport) KVScan(ctx context.Context, addr, pool string, cursor uint64, count int) ([]string, uint64, int64, error) {
	return t.p.KVScan(ctx, addr, pool, cursor, count)
}

func (t tcpTransport) Close() { t.p.Close() }
