// Package wire is the gd2fs data-plane frame codec.
//
// Every message is one frame: a fixed 48-byte little-endian header, then
// KeyLen bytes of key, then PayloadLen bytes of payload. The header carries a
// CRC32C over itself and the key; the payload carries its own CRC32C, checked
// by the receiver before the bytes are used. All lengths are known before any
// payload moves, and the decoder checks them against Limits before it reads a
// byte of key or payload (DESIGN.md §5, R10). docs/protocol.md is the
// reference; this file is the implementation.
package wire

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/limits"
)

// Magic opens every frame: "GD2F" read as a little-endian uint32.
const Magic uint32 = 0x46324447

// Version is the protocol version this build speaks.
const Version uint8 = 1

// HeaderSize is the fixed size of a frame header in bytes.
const HeaderSize = 48

// Op is a frame's opcode.
type Op uint8

// Opcodes. Responses echo the request's opcode.
const (
	OpHello    Op = 1 // key: client name; payload: cluster token
	OpPing     Op = 2
	OpWrite    Op = 3  // key: chunk ref; Offset; payload: bytes
	OpRead     Op = 4  // key: chunk ref; Offset; Count: bytes wanted
	OpStat     Op = 5  // key: chunk ref; response Offset = length, Flags&FlagSealed
	OpSeal     Op = 6  // key: chunk ref
	OpDelete   Op = 7  // key: chunk ref
	OpCopy     Op = 8  // key: chunk ref; payload: source server address
	OpKVPut    Op = 9  // key: KV ref; Offset: client epoch; payload: value
	OpKVGet    Op = 10 // key: KV ref; Offset: client epoch
	OpKVExists Op = 11 // response Offset = size, Count = tier (1 DRAM, 2 disk)
	OpKVDelete Op = 12 // response Offset = keys deleted
	OpReadCold Op = 13 // key: cold ref; Offset, Count as OpRead; fills the chunk from its cold source first if absent
	OpKVScan   Op = 14 // key: KV ref (pool; key unused); Offset: cursor; Count: keys wanted; response Offset = next cursor, Count = keys in the pool, payload = keys
	OpExtents  Op = 15 // key: chunk ref; Offset, Count: the bytes asked about; response Offset = length, Flags&FlagSealed, payload = written extents within them (AppendExtents)
	OpKVRetain Op = 16 // key: KV ref; Offset: client epoch; payload: Retain (16 bytes); response payload: the block's Retain, Offset = blocks changed
	opMaxKnown    = OpKVRetain
)

func (o Op) String() string {
	names := [...]string{"?", "hello", "ping", "write", "read", "stat", "seal", "delete", "copy",
		"kv_put", "kv_get", "kv_exists", "kv_delete", "read_cold", "kv_scan", "extents", "kv_retain"}
	if int(o) < len(names) {
		return names[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Flags.
const (
	// FlagSealed in an OpStat response: the chunk is sealed.
	FlagSealed uint16 = 1 << 0
	// FlagOverwrite in an OpKVPut request: replace an existing block.
	FlagOverwrite uint16 = 1 << 1
	// FlagExisted in an OpKVPut response: the key existed and was kept.
	FlagExisted uint16 = 1 << 2
	// FlagPrefix in an OpKVDelete or OpKVRetain request: every key with
	// this prefix on the server.
	FlagPrefix uint16 = 1 << 3
	// FlagColdFilled in an OpReadCold response: the server fetched the chunk
	// from the cold tier for this request (or while it waited).
	FlagColdFilled uint16 = 1 << 4
	// FlagSync in an OpWrite request: answer only when the bytes are on
	// disk (fdatasync), not only in the page cache. A primary sets it on
	// the writes it forwards to the other replicas of a chunk.
	FlagSync uint16 = 1 << 5
	// FlagHeld in an OpKVGet, OpKVExists or OpKVDelete request: answer from
	// what this server holds, whoever owns the key now. Servers send it to
	// a key's owner under an earlier membership map, to find and move a
	// block whose owner changed (docs/kv-cache.md, "Membership changes").
	FlagHeld uint16 = 1 << 6
	// FlagPrefetch in an OpKVExists request: a block found on the disk
	// tier is copied to DRAM at once (not pinned, not counted as a read),
	// so the read that follows finds it there. In an OpStat request: the
	// same for the whole chunk (the master warming an explicit-mode plan's
	// stored ranges); the answer does not wait for the copy.
	FlagPrefetch uint16 = 1 << 7
	// FlagResponse marks a frame sent by a server.
	FlagResponse uint16 = 1 << 15
)

// Status is a response's outcome. Zero is success.
type Status uint16

// Statuses; ErrorOf and StatusOf translate them to and from errs sentinels.
const (
	StatusOK Status = iota
	StatusBadRequest
	StatusNotFound
	StatusChecksum
	StatusNoSpace
	StatusSealed
	StatusOutOfRange
	StatusUnauthorized
	StatusVersion
	StatusUnavailable
	StatusMoved
	StatusInternal
	StatusTooLarge
	StatusUnknownOp
	StatusExists
)

// statusErrs pairs each status with its sentinel, in status order.
var statusErrs = []struct {
	s   Status
	err error
}{
	{StatusBadRequest, errs.ErrBadRequest},
	{StatusNotFound, errs.ErrNotFound},
	{StatusChecksum, errs.ErrChecksum},
	{StatusNoSpace, errs.ErrNoSpace},
	{StatusSealed, errs.ErrSealed},
	{StatusOutOfRange, errs.ErrOutOfRange},
	{StatusUnauthorized, errs.ErrUnauthorized},
	{StatusVersion, errs.ErrVersion},
	{StatusUnavailable, errs.ErrUnavailable},
	{StatusMoved, errs.ErrMoved},
	{StatusInternal, errs.ErrInternal},
	{StatusTooLarge, errs.ErrTooLarge},
	{StatusUnknownOp, errs.ErrUnknownOp},
	{StatusExists, errs.ErrExists},
}

// statusErr is the sentinel s carries.
func statusErr(s Status) (error, bool) {
	for _, e := range statusErrs {
		if e.s == s {
			return e.err, true
		}
	}
	return nil, false
}

func (s Status) String() string {
	if s == StatusOK {
		return "ok"
	}
	if e, ok := statusErr(s); ok {
		return e.Error()
	}
	return fmt.Sprintf("status(%d)", uint16(s))
}

// StatusOf maps an error to the status that carries it on the wire: its kind
// (errs.KindOf), or StatusInternal when the wire has no status for it.
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	// The kind decides, not a cause of another kind it wraps (errs.KindOf),
	// and the table is walked in a fixed order, so the answer is the same
	// every time.
	kind := errs.KindOf(err)
	for _, e := range statusErrs {
		if kind == e.err {
			return e.s
		}
	}
	return StatusInternal
}

// ErrorOf rebuilds the error a peer sent as (status, message).
func ErrorOf(s Status, msg string) error {
	if s == StatusOK {
		return nil
	}
	kind, ok := statusErr(s)
	if !ok {
		kind = errs.ErrInternal
	}
	if msg == "" {
		msg = kind.Error()
	}
	return &errs.Error{Kind: kind, Msg: msg}
}

// Header is a decoded frame header.
//
//	off size field
//	  0   4  magic        "GD2F"
//	  4   1  version
//	  5   1  opcode
//	  6   2  flags
//	  8   2  status
//	 10   2  key length
//	 12   4  payload length
//	 16   8  request id
//	 24   8  offset
//	 32   8  count
//	 40   4  payload CRC32C
//	 44   4  header CRC32C over bytes 0..43 and the key
type Header struct {
	Version    uint8
	Op         Op
	Flags      uint16
	Status     Status
	KeyLen     uint16
	PayloadLen uint32
	ReqID      uint64
	Offset     uint64
	Count      uint64
	PayloadCRC uint32
}

// Limits bound what a decoder accepts before reading a key or payload.
type Limits struct {
	MaxKey     int // bytes
	MaxPayload int // bytes
}

// DefaultLimits are the protocol's own (limits.MaxFrameKey,
// limits.MaxPayload): 64 MiB writes and 1 KiB keys with room for forward
// lists. A function, not a variable, so no one can change them for all.
func DefaultLimits() Limits {
	return Limits{MaxKey: limits.MaxFrameKey, MaxPayload: limits.MaxPayload}
}

// Decode errors. All wrap errs.ErrBadRequest except ErrVersion and ErrTooLarge.
var (
	ErrBadMagic     = errs.New(errs.ErrBadRequest, "wire: bad magic: not a gd2fs frame")
	ErrHeaderCRC    = errs.New(errs.ErrBadRequest, "wire: header checksum mismatch")
	ErrPayloadCRC   = errs.New(errs.ErrChecksum, "wire: payload checksum mismatch")
	ErrShortPayload = errs.New(errs.ErrBadRequest, "wire: destination shorter than payload")
)

// Encode writes the fixed header for h into b[:HeaderSize] (len(b) >=
// HeaderSize) and returns that slice. It does not copy key: the caller sends
// the key right after the header. The header records len(key), and its CRC
// covers the key too.
func Encode(b []byte, h *Header, key []byte) []byte {
	b = b[:HeaderSize]
	le := binary.LittleEndian
	le.PutUint32(b[0:], Magic)
	v := h.Version
	if v == 0 {
		v = Version
	}
	b[4] = v
	b[5] = byte(h.Op)
	le.PutUint16(b[6:], h.Flags)
	le.PutUint16(b[8:], uint16(h.Status))
	le.PutUint16(b[10:], uint16(len(key)))
	le.PutUint32(b[12:], h.PayloadLen)
	le.PutUint64(b[16:], h.ReqID)
	le.PutUint64(b[24:], h.Offset)
	le.PutUint64(b[32:], h.Count)
	le.PutUint32(b[40:], h.PayloadCRC)
	c := crc32c.Update(crc32c.Checksum(b[:44]), key)
	le.PutUint32(b[44:], c)
	return b
}

// DecodeHeader parses the fixed header in b. It checks the magic, the
// version and the lengths against lim; it cannot check the header CRC until the
// key is read (see VerifyHeader). A version mismatch returns the header (so
// the caller can answer with the request id) and an error wrapping
// errs.ErrVersion.
func DecodeHeader(b []byte, lim Limits) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, errs.New(errs.ErrBadRequest, "wire: short header: %d of %d bytes", len(b), HeaderSize)
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != Magic {
		return h, ErrBadMagic
	}
	h.Version = b[4]
	h.Op = Op(b[5])
	h.Flags = le.Uint16(b[6:])
	h.Status = Status(le.Uint16(b[8:]))
	h.KeyLen = le.Uint16(b[10:])
	h.PayloadLen = le.Uint32(b[12:])
	h.ReqID = le.Uint64(b[16:])
	h.Offset = le.Uint64(b[24:])
	h.Count = le.Uint64(b[32:])
	h.PayloadCRC = le.Uint32(b[40:])
	if h.Version != Version {
		return h, errs.New(errs.ErrVersion, "wire: peer speaks protocol version %d, this build speaks %d: upgrade the older side", h.Version, Version)
	}
	if int(h.KeyLen) > lim.MaxKey {
		return h, errs.New(errs.ErrTooLarge, "wire: key length %d beyond limit %d", h.KeyLen, lim.MaxKey)
	}
	if int64(h.PayloadLen) > int64(lim.MaxPayload) {
		return h, errs.New(errs.ErrTooLarge, "wire: payload length %d beyond limit %d", h.PayloadLen, lim.MaxPayload)
	}
	return h, nil
}

// VerifyHeader checks the header CRC of raw header bytes b over b and key.
func VerifyHeader(b []byte, key []byte) error {
	want := binary.LittleEndian.Uint32(b[44:])
	got := crc32c.Update(crc32c.Checksum(b[:44]), key)
	if got != want {
		return ErrHeaderCRC
	}
	return nil
}

// Reader decodes frames from a stream. Key views stay valid until the next
// call to Next. After Next, the caller must consume the payload with
// ReadPayload or Discard before calling Next again.
type Reader struct {
	r    *bufio.Reader
	src  io.Reader // what r reads from, when known: large payloads are read from it directly
	lim  Limits
	hdr  [HeaderSize]byte
	key  []byte
	left int // payload bytes not yet consumed

	rc     syscall.RawConn // src's socket, if it is one (readv_linux.go)
	rcDone bool            // rc was looked for
	rv     readvState
	iovs   [][]byte // ReadPayloadInto's iovecs, reused
	sums   []uint32 // ReadPayloadViews's per-view CRCs, reused
}

// NewReader returns a frame reader over r. Payloads are read from r
// straight into the caller's buffers; headers and keys through a buffer.
func NewReader(r io.Reader, lim Limits) *Reader {
	if br, ok := r.(*bufio.Reader); ok {
		return NewBufferedReader(br, nil, lim)
	}
	return NewBufferedReader(bufio.NewReaderSize(r, 64<<10), r, lim)
}

// NewBufferedReader returns a frame reader over br, which reads from src (a
// server that sniffed the connection's first bytes through br passes both).
// A payload's bytes past what br holds are read from src straight into the
// destination: one copy, the kernel's, instead of a second one out of br's
// buffer. A nil src reads everything through br.
func NewBufferedReader(br *bufio.Reader, src io.Reader, lim Limits) *Reader {
	return &Reader{r: br, src: src, lim: lim, key: make([]byte, 0, 256)}
}

// directMin is the least a payload read goes to the connection for directly;
// below it, reading through the buffer also picks up the next header in the
// same system call.
const directMin = 16 << 10

// sumRead is the most one read of a large payload asks of the connection.
// A reader that checksums the payload (ReadPayload, ReadPayloadInto with
// sums) does so right after each read, while the bytes the kernel just
// copied are still in the CPU cache: a second pass over a 4 MiB payload
// reads it back from memory, and cost this VM about 1.7x as much as the
// checksum of the same bytes still in the cache (issue 26,
// docs/benchmarks.md).
const sumRead = 256 << 10

// fill reads exactly len(d) payload bytes into d: what the buffer holds
// first, then the rest straight from the source when the payload has at
// least directMin bytes left from d on (rest counts them: d and the views
// after it). Reading a short tail of one view through the buffer would
// refill the buffer with the next view's bytes, to be copied again. got,
// if not nil, is called on every piece of d as it arrives, in order.
func (r *Reader) fill(d []byte, rest int, got func([]byte)) error {
	n := 0
	if r.src != nil && rest >= directMin {
		if b := r.r.Buffered(); b > 0 {
			n, _ = r.r.Read(d[:min(b, len(d))]) // buffered bytes: no read, no error
		}
		if rest-n >= directMin {
			if got != nil && n > 0 {
				got(d[:n])
			}
			for n < len(d) {
				m, err := r.src.Read(d[n:min(len(d), n+sumRead)])
				if got != nil && m > 0 {
					got(d[n : n+m])
				}
				n += m
				if err != nil && n < len(d) {
					if err == io.EOF {
						err = io.ErrUnexpectedEOF
					}
					return err
				}
			}
			return nil
		}
	}
	_, err := io.ReadFull(r.r, d[n:])
	if err == nil && got != nil {
		got(d)
	}
	return err
}

// Next reads the next header and key. On error the stream cannot be trusted
// any more, except that a version mismatch still returns a usable header.
func (r *Reader) Next() (Header, []byte, error) {
	if r.left > 0 {
		if err := r.Discard(); err != nil {
			return Header{}, nil, err
		}
	}
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			err = errs.New(errs.ErrBadRequest, "wire: truncated header")
		}
		return Header{}, nil, err
	}
	h, err := DecodeHeader(r.hdr[:], r.lim)
	if err != nil {
		return h, nil, err
	}
	if cap(r.key) < int(h.KeyLen) {
		r.key = make([]byte, h.KeyLen)
	}
	key := r.key[:h.KeyLen]
	if _, err := io.ReadFull(r.r, key); err != nil {
		return h, nil, truncated(err, "key")
	}
	if err := VerifyHeader(r.hdr[:], key); err != nil {
		return h, nil, err
	}
	r.left = int(h.PayloadLen)
	return h, key, nil
}

// ReadPayload reads the whole pending payload into dst[:n] and checks its
// CRC32C against want. dst must be at least the payload length. A CRC mismatch
// returns ErrPayloadCRC but leaves the stream in sync.
func (r *Reader) ReadPayload(dst []byte, want uint32) (int, error) {
	n := r.left
	if len(dst) < n {
		if err := r.Discard(); err != nil {
			return 0, err
		}
		return 0, ErrShortPayload
	}
	r.left = 0
	var crc uint32
	if err := r.fill(dst[:n], n, func(p []byte) { crc = crc32c.Update(crc, p) }); err != nil {
		return 0, truncated(err, "payload")
	}
	if crc != want {
		return n, ErrPayloadCRC
	}
	return n, nil
}

// ReadPayloadUnchecked reads the pending payload into dst like ReadPayload
// but leaves the CRC check to the caller, who may fold it into a pass it
// makes anyway (the chunk store computes per-block CRCs and combines them).
func (r *Reader) ReadPayloadUnchecked(dst []byte) (int, error) {
	n := r.left
	if len(dst) < n {
		if err := r.Discard(); err != nil {
			return 0, err
		}
		return 0, ErrShortPayload
	}
	r.left = 0
	if err := r.fill(dst[:n], n, nil); err != nil {
		return 0, truncated(err, "payload")
	}
	return n, nil
}

// ReadPayloadInto reads the pending payload, unchecked, into the views dst
// (whose total length must equal the payload length): the zero-copy receive
// of a write straight into DRAM pages. With sums (one per view) it puts the
// CRC32C of each view there, computed as the bytes arrive: the caller
// checks the payload's CRC from them without reading the bytes again.
func (r *Reader) ReadPayloadInto(dst [][]byte, sums []uint32) error {
	if sums != nil && len(sums) != len(dst) {
		return fmt.Errorf("wire: %d sums for %d views", len(sums), len(dst))
	}
	var n int
	for _, d := range dst {
		n += len(d)
	}
	if n != r.left {
		if err := r.Discard(); err != nil {
			return err
		}
		return ErrShortPayload
	}
	r.left = 0
	if !r.rcDone && r.src != nil {
		r.rc, r.rcDone = rawConn(r.src), true
	}
	if r.rc != nil {
		return truncated(r.readViews(dst, sums, n), "payload")
	}
	var crc uint32
	var got func([]byte)
	if sums != nil {
		got = func(p []byte) { crc = crc32c.Update(crc, p) }
	}
	for i, d := range dst {
		crc = 0
		if err := r.fill(d, n, got); err != nil {
			return truncated(err, "payload")
		}
		if sums != nil {
			sums[i] = crc
		}
		n -= len(d)
	}
	return nil
}

// ReadPayloadViews reads the pending payload into the views dst (their
// lengths adding up to the payload's) and returns its CRC32C, computed
// view by view as the bytes arrive and combined: a value received straight
// into a store's DRAM pages, checked without a second pass.
func (r *Reader) ReadPayloadViews(dst [][]byte) (uint32, error) {
	r.sums = slices.Grow(r.sums[:0], len(dst))[:len(dst)]
	if err := r.ReadPayloadInto(dst, r.sums); err != nil {
		return 0, err
	}
	var crc uint32
	for i, d := range dst {
		crc = crc32c.Combine(crc, r.sums[i], int64(len(d)))
	}
	return crc, nil
}

// ReadRawViews is ReadPayloadViews for bytes that are not a frame's payload
// (another protocol sharing this reader's buffer: a RESP bulk string), as
// many as the views' lengths add up to. A frame's payload still pending is
// an error.
func (r *Reader) ReadRawViews(dst [][]byte) (uint32, error) {
	if r.left != 0 {
		return 0, fmt.Errorf("wire: %d payload bytes pending", r.left)
	}
	for _, d := range dst {
		r.left += len(d)
	}
	return r.ReadPayloadViews(dst)
}

// readvMax is the most one readv of a payload into views asks for: as
// with sumRead, the bytes are checksummed right after they arrive.
const readvMax = sumRead

// readViews is ReadPayloadInto on a socket: what the buffer holds first,
// then readv(2) straight into up to readvMax bytes of views at a time
// (reading each 64 KiB view on its own was a system call per view at
// least), and a tail shorter than directMin through the buffer, as fill
// does. left is the payload's length; sums, if not nil, get each view's
// CRC32C.
func (r *Reader) readViews(dst [][]byte, sums []uint32, left int) error {
	i, off := 0, 0 // the next byte goes to dst[i][off]
	var crc uint32
	// settle closes every view that is full (empty ones too).
	settle := func() {
		for i < len(dst) && off == len(dst[i]) {
			if sums != nil {
				sums[i] = crc
			}
			crc, i, off = 0, i+1, 0
		}
	}
	// take accounts for m bytes just read from dst[i][off:] on.
	take := func(m int) {
		left -= m
		for m > 0 {
			d := dst[i]
			k := min(m, len(d)-off)
			if sums != nil {
				crc = crc32c.Update(crc, d[off:off+k])
			}
			off, m = off+k, m-k
			settle()
		}
	}
	settle()
	for left > 0 {
		if b := r.r.Buffered(); b > 0 {
			m, _ := r.r.Read(dst[i][off:min(len(dst[i]), off+b)]) // buffered bytes: no read, no error
			take(m)
			continue
		}
		if left < directMin {
			m, err := io.ReadFull(r.r, dst[i][off:])
			take(m)
			if err != nil {
				return err
			}
			continue
		}
		iovs, want := r.iovs[:0], 0
		for j, o := i, off; j < len(dst) && want < readvMax; j, o = j+1, 0 {
			v := dst[j][o:]
			v = v[:min(len(v), readvMax-want)]
			iovs, want = append(iovs, v), want+len(v)
		}
		r.iovs = iovs
		m, err := r.readv(r.rc, iovs)
		take(m)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// Discard skips the pending payload.
func (r *Reader) Discard() error {
	n := r.left
	r.left = 0
	if _, err := r.r.Discard(n); err != nil {
		return truncated(err, "payload")
	}
	return nil
}

// Pending is the number of payload bytes not yet consumed.
func (r *Reader) Pending() int { return r.left }

func truncated(err error, what string) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errs.New(errs.ErrBadRequest, "wire: truncated %s", what)
	}
	return err
}

// ChunkRef is the key of a chunk operation: an 8-byte little-endian chunk id,
// optionally followed by a comma-separated list of server addresses the
// receiving server must forward a write to (primary-driven replication).
type ChunkRef struct {
	ID      uint64
	Forward []string
}

// AppendChunkRef encodes ref into b.
func AppendChunkRef(b []byte, ref ChunkRef) []byte {
	return appendForward(binary.LittleEndian.AppendUint64(b, ref.ID), ref.Forward)
}

// appendForward appends the comma-separated forward list of a write key.
func appendForward(b []byte, fwd []string) []byte {
	for i, a := range fwd {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, a...)
	}
	return b
}

// parseForward decodes a comma-separated forward list (empty: none).
func parseForward(rest []byte, what string) ([]string, error) {
	if len(rest) == 0 {
		return nil, nil
	}
	fwd := strings.Split(string(rest), ",")
	for _, a := range fwd {
		if a == "" {
			return nil, errs.New(errs.ErrBadRequest, "wire: empty forward address in %s key", what)
		}
	}
	return fwd, nil
}

// ParseChunkRef decodes a chunk key.
func ParseChunkRef(key []byte) (ChunkRef, error) {
	if len(key) < 8 {
		return ChunkRef{}, errs.New(errs.ErrBadRequest, "wire: chunk key of %d bytes, want at least 8", len(key))
	}
	ref := ChunkRef{ID: binary.LittleEndian.Uint64(key)}
	var err error
	if ref.Forward, err = parseForward(key[8:], "chunk"); err != nil {
		return ChunkRef{}, err
	}
	return ref, nil
}

// KVRef is the key of a KV operation: a pool name, the block's key, and for a
// put the addresses of the other replicas the receiving server forwards to.
//
//	u8 pool length, pool, u16 key length, key, forward addresses comma-separated
type KVRef struct {
	Pool    string
	Key     []byte
	Forward []string
}

// AppendKVRef encodes ref into b.
func AppendKVRef(b []byte, ref KVRef) []byte {
	b = append(b, byte(len(ref.Pool)))
	b = append(b, ref.Pool...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(ref.Key)))
	b = append(b, ref.Key...)
	return appendForward(b, ref.Forward)
}

// ParseKVRef decodes a KV key. Key aliases b.
func ParseKVRef(b []byte) (KVRef, error) {
	bad := func(what string) (KVRef, error) {
		return KVRef{}, errs.New(errs.ErrBadRequest, "wire: KV key: %s", what)
	}
	if len(b) < 1 || len(b) < 1+int(b[0])+2 {
		return bad("truncated pool")
	}
	ref := KVRef{Pool: string(b[1 : 1+b[0]])}
	b = b[1+b[0]:]
	kl := int(binary.LittleEndian.Uint16(b))
	b = b[2:]
	if len(b) < kl {
		return bad("truncated key")
	}
	ref.Key, b = b[:kl], b[kl:]
	var err error
	if ref.Forward, err = parseForward(b, "KV"); err != nil {
		return KVRef{}, err
	}
	return ref, nil
}

// ColdRef is the key of an OpReadCold: the chunk, and where its bytes are in
// the cold tier (object URI, ETag to insist on, offset and length).
//
//	u64 chunk id, u64 source offset, u64 chunk length, u16 URI length, URI, ETag
type ColdRef struct {
	ID     uint64
	Offset int64
	Length int64
	URI    string
	ETag   string
}

// AppendColdRef encodes ref into b.
func AppendColdRef(b []byte, ref ColdRef) []byte {
	le := binary.LittleEndian
	b = le.AppendUint64(b, ref.ID)
	b = le.AppendUint64(b, uint64(ref.Offset))
	b = le.AppendUint64(b, uint64(ref.Length))
	b = le.AppendUint16(b, uint16(len(ref.URI)))
	b = append(b, ref.URI...)
	return append(b, ref.ETag...)
}

// ParseColdRef decodes a cold key.
func ParseColdRef(b []byte) (ColdRef, error) {
	le := binary.LittleEndian
	if len(b) < 26 {
		return ColdRef{}, errs.New(errs.ErrBadRequest, "wire: cold key of %d bytes, want at least 26", len(b))
	}
	ref := ColdRef{ID: le.Uint64(b), Offset: int64(le.Uint64(b[8:])), Length: int64(le.Uint64(b[16:]))}
	n := int(le.Uint16(b[24:]))
	if len(b) < 26+n || ref.Offset < 0 || ref.Length < 0 {
		return ColdRef{}, errs.New(errs.ErrBadRequest, "wire: malformed cold key")
	}
	ref.URI = string(b[26 : 26+n])
	ref.ETag = string(b[26+n:])
	return ref, nil
}
