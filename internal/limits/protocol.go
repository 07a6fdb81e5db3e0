package limits

// Facts of the protocol and of the tiers that every layer must agree on.
// They live here, in a leaf, so the tiers (store, kvstore), the wire codec,
// the SDK, the master and the RESP door all import the same figures and none
// imports another for them.
const (
	// BlockSize is the unit of a chunk's block CRCs and of the chunk
	// store's DRAM pages (64 KiB); a chunk size is a multiple of it.
	BlockSize = 64 << 10
	// MaxChunk is the largest chunk (256 MiB): its block CRCs fill a chunk
	// file's fixed header region.
	MaxChunk = 256 << 20
	// MaxPayload bounds one frame's payload (64 MiB): a write piece, a read,
	// a KV value.
	MaxPayload = 64 << 20
	// MaxFrameKey bounds one frame's key (4 KiB): a KV key (MaxKVKey) with
	// its pool and forward list, a cold ref with its URI.
	MaxFrameKey = 4096
	// MaxKVValue is the largest KV value a data server stores by default.
	MaxKVValue = MaxPayload
	// ScanBits is the width of a KV scan cursor within one server's store:
	// key hashes are cut to 56 bits so a caller combining several stores
	// (the SDK, the RESP door: one store per server) has the top 8 bits of
	// a 64-bit cursor for the store's index.
	ScanBits = 56
)

// MaxChunkExtents bounds the separate written byte ranges a data server
// tracks per chunk (its persisted record fits the chunk file's header
// region): a write that would leave a chunk in more pieces is refused.
const MaxChunkExtents = 500
