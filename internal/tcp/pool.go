package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// Pool keeps Options.Streams connections per server address and spreads
// requests over them round-robin, so one large transfer runs on several TCP
// streams at once.
type Pool struct {
	opts Options

	mu     sync.Mutex
	conns  map[string][]*Conn
	dialMu map[string]*sync.Mutex
	closed bool
	rr     atomic.Uint64
}

// NewPool returns an empty pool; connections are dialled on first use.
func NewPool(o Options) *Pool {
	o.fill()
	return &Pool{opts: o, conns: make(map[string][]*Conn), dialMu: make(map[string]*sync.Mutex)}
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	all := p.conns
	p.conns = map[string][]*Conn{}
	p.mu.Unlock()
	for _, cs := range all {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	}
}

// Get returns a live connection to addr, dialling if the chosen stream is
// missing or broken.
func (p *Pool) Get(ctx context.Context, addr string) (*Conn, error) {
	i := int(p.rr.Add(1) % uint64(p.opts.Streams))
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errs.New(errs.ErrUnavailable, "tcp: pool closed")
	}
	cs := p.conns[addr]
	if cs == nil {
		cs = make([]*Conn, p.opts.Streams)
		p.conns[addr] = cs
	}
	if c := cs[i]; c != nil && !c.Broken() {
		p.mu.Unlock()
		return c, nil
	}
	dm := p.dialMu[addr]
	if dm == nil {
		dm = new(sync.Mutex)
		p.dialMu[addr] = dm
	}
	p.mu.Unlock()

	dm.Lock() // one dial at a time per server: a dead server costs one timeout
	defer dm.Unlock()
	p.mu.Lock()
	if cs := p.conns[addr]; cs != nil && cs[i] != nil && !cs[i].Broken() { // cs is nil when forgotten meanwhile
		c := cs[i]
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	c, err := Dial(ctx, addr, p.opts, p.localFor(addr, i))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			// Nothing listens there: the other streams to addr are dead
			// too (the server stopped or restarted), even where their
			// read loops have not seen the close yet; a request sent on
			// one of them would fail. Forget them so the next call dials.
			p.forget(addr)
		}
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, errs.New(errs.ErrUnavailable, "tcp: pool closed")
	}
	cs = p.conns[addr]
	if cs == nil { // forgotten while this one dialled
		cs = make([]*Conn, p.opts.Streams)
		p.conns[addr] = cs
	}
	cs[i] = c
	return c, nil
}

// forget closes and drops every stream to addr.
func (p *Pool) forget(addr string) {
	p.mu.Lock()
	cs := p.conns[addr]
	delete(p.conns, addr)
	p.mu.Unlock()
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
}

// Do sends req to addr on one of its streams.
func (p *Pool) Do(ctx context.Context, addr string, req *Request) (Response, error) {
	c, err := p.Get(ctx, addr)
	if err != nil {
		return Response{}, err
	}
	return c.Do(ctx, req)
}

func chunkKey(id uint64) []byte { return binary.LittleEndian.AppendUint64(nil, id) }

// WriteChunk writes data at off of chunk id on addr; the server forwards it to
// the forward replicas and answers when all hold it.
func (p *Pool) WriteChunk(ctx context.Context, addr string, id uint64, off int64, data []byte, forward []string) error {
	return p.ForwardChunk(ctx, addr, id, off, data, forward, 0, 0)
}

// ForwardChunk is WriteChunk for bytes whose CRC32C the caller verified
// already (a primary forwarding a frame to the other replicas): crc is sent
// as it is instead of being computed again (0 means compute it). flags are
// the request's (wire.FlagSync).
func (p *Pool) ForwardChunk(ctx context.Context, addr string, id uint64, off int64, data []byte, forward []string, crc uint32, flags uint16) error {
	key := wire.AppendChunkRef(nil, wire.ChunkRef{ID: id, Forward: forward})
	_, err := p.Do(ctx, addr, &Request{Op: wire.OpWrite, Flags: flags, Key: key, Offset: uint64(off), Payload: [][]byte{data}, PayloadCRC: crc, HaveCRC: crc != 0})
	return err
}

// ForwardChunkV is ForwardChunk for bytes in several buffers (DRAM pages),
// sent with writev.
func (p *Pool) ForwardChunkV(ctx context.Context, addr string, id uint64, off int64, data [][]byte, crc uint32, flags uint16) error {
	key := wire.AppendChunkRef(nil, wire.ChunkRef{ID: id})
	_, err := p.Do(ctx, addr, &Request{Op: wire.OpWrite, Flags: flags, Key: key, Offset: uint64(off), Payload: data, PayloadCRC: crc, HaveCRC: crc != 0})
	return err
}

// ReadChunk reads len(dst) bytes at off of chunk id into dst.
func (p *Pool) ReadChunk(ctx context.Context, addr string, id uint64, off int64, dst []byte) error {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpRead, Key: chunkKey(id), Offset: uint64(off), Count: uint64(len(dst)), Dst: dst})
	if err == nil && r.N != len(dst) {
		err = errs.New(errs.ErrOutOfRange, "server %s returned %d of %d bytes of chunk %d", addr, r.N, len(dst), id)
	}
	return err
}

// StatChunk returns the length of chunk id on addr and whether it is sealed.
func (p *Pool) StatChunk(ctx context.Context, addr string, id uint64) (int64, bool, error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpStat, Key: chunkKey(id)})
	return int64(r.Header.Offset), r.Header.Flags&wire.FlagSealed != 0, err
}

// SealChunk makes chunk id on addr immutable.
func (p *Pool) SealChunk(ctx context.Context, addr string, id uint64) error {
	_, err := p.Do(ctx, addr, &Request{Op: wire.OpSeal, Key: chunkKey(id)})
	return err
}

// CopyChunk asks addr to fetch chunk id from server src (re-replication).
func (p *Pool) CopyChunk(ctx context.Context, addr string, id uint64, src string) error {
	_, err := p.Do(ctx, addr, &Request{Op: wire.OpCopy, Key: chunkKey(id), Payload: [][]byte{[]byte(src)}})
	return err
}

// KVPut stores value under ref on addr (which forwards to ref.Forward). It
// reports whether the key existed and was kept.
// crc is value's CRC32C when the caller knows it (a server forwarding a
// verified frame), or 0 to compute it here.
func (p *Pool) KVPut(ctx context.Context, addr string, ref wire.KVRef, epoch int64, value []byte, overwrite bool, crc uint32) (existed bool, err error) {
	var flags uint16
	if overwrite {
		flags = wire.FlagOverwrite
	}
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVPut, Flags: flags, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch),
		Payload: [][]byte{value}, PayloadCRC: crc, HaveCRC: crc != 0})
	return r.Header.Flags&wire.FlagExisted != 0, err
}

// KVGet reads the value of ref from addr, into dst when it is not nil (the
// value must fit) or into a new slice.
func (p *Pool) KVGet(ctx context.Context, addr string, ref wire.KVRef, epoch int64, dst []byte) ([]byte, error) {
	req := &Request{Op: wire.OpKVGet, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch), Dst: dst, Alloc: dst == nil}
	r, err := p.Do(ctx, addr, req)
	if err != nil {
		if err == wire.ErrShortPayload {
			err = errs.New(errs.ErrTooLarge, "value of %s is larger than the %d-byte buffer", ref.Key, len(dst))
		}
		return nil, err
	}
	if dst != nil {
		return dst[:r.N], nil
	}
	return r.Body, nil
}

// KVExists returns the size and tier (1 DRAM, 2 disk) of ref on addr;
// errs.ErrNotFound on a miss.
func (p *Pool) KVExists(ctx context.Context, addr string, ref wire.KVRef, epoch int64) (size int64, tier int, err error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVExists, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch)})
	return int64(r.Header.Offset), int(r.Header.Count), err
}

// KVDelete deletes ref (or, with prefix, every key starting with ref.Key) on
// addr and returns how many keys went.
func (p *Pool) KVDelete(ctx context.Context, addr string, ref wire.KVRef, epoch int64, prefix bool) (int64, error) {
	var flags uint16
	if prefix {
		flags = wire.FlagPrefix
	}
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpKVDelete, Flags: flags, Key: wire.AppendKVRef(nil, ref), Offset: uint64(epoch)})
	return int64(r.Header.Offset), err
}

// ReadChunkCold is ReadChunk for a chunk of a linked file: a server that does
// not hold the chunk fills it from the cold tier first (once, however many
// ask). filled reports that this read waited for such a fill.
func (p *Pool) ReadChunkCold(ctx context.Context, addr string, ref wire.ColdRef, off int64, dst []byte) (filled bool, err error) {
	r, err := p.Do(ctx, addr, &Request{Op: wire.OpReadCold, Key: wire.AppendColdRef(nil, ref), Offset: uint64(off), Count: uint64(len(dst)), Dst: dst})
	if err == nil && r.N != len(dst) {
		err = errs.New(errs.ErrOutOfRange, "server %s returned %d of %d bytes of chunk %d", addr, r.N, len(dst), ref.ID)
	}
	return r.Header.Flags&wire.FlagColdFilled != 0, err
}

// localFor is the local address stream i to addr binds (Options.LocalAddrs,
// one per NIC): streams to one server go out through every NIC in turn,
// starting at a NIC picked by the server's address so that with one stream
// per server the servers still spread over the NICs. A loopback local
// address only serves loopback servers and another only other servers (an
// engine's default data-plane address is tcp://127.0.0.1 whatever the
// cluster); "" when none fits: the kernel picks.
func (p *Pool) localFor(addr string, i int) string {
	if len(p.opts.LocalAddrs) == 0 {
		return ""
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	dst := net.ParseIP(host)
	loop := dst != nil && dst.IsLoopback() || host == "localhost"
	var fit []string
	for _, l := range p.opts.LocalAddrs {
		if ip := net.ParseIP(l); ip != nil && ip.IsLoopback() == loop {
			fit = append(fit, l)
		}
	}
	if len(fit) == 0 {
		return ""
	}
	h := fnv.New32a()
	h.Write([]byte(addr))
	return fit[(int(h.Sum32()%uint32(len(fit)))+i)%len(fit)]
}
