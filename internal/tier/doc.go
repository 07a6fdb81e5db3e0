// Package tier is what the chunk store (internal/store) and the KV store
// (internal/kvstore) share of their tiers, as parts each store is composed
// of: a DRAM tier (DRAM: off-heap pages and their accounting) and a disk
// tier (Disk: a directory on a file system, its capacity and use, the
// file-system seam FS that the power-loss tests replace, and verified reads
// into pooled buffers).
//
// A store holds a *DRAM and a *Disk; a nil one is "no such tier" and its
// methods answer as an empty tier does (no capacity, nothing allocated,
// everything fits), so the stores do not branch on which tiers they have
// where the answer is the same.
//
// What is not here, because the two stores do not share it: the caching
// policy (the chunk store's write-through LRU of whole chunks against the
// KV store's write-behind S3-FIFO or LRU of blocks with ghosts and
// retention), the on-disk formats (one chunk file with a per-64 KiB-block
// CRC table against append-only log segments of CRC-checked records), and
// durability (chunk files are group-committed with fdatasync and written
// with O_DIRECT; KV segments are never synced: KV cache is recomputable).
// docs/architecture.md, "Tiers on a server", says the same in full.
package tier
