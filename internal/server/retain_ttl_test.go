package server

import (
	"log/slog"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// TestRetainChangeHugeTTL: ParseRetain accepts any TTL >= -2 ms; a
// TTL of 2^62 ms overflows time.Duration to 0 and the block is deleted at
// once instead of living (practically) forever.
func TestRetainChangeHugeTTL(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, ttl := range []int64{1 << 62, 9_300_000_000_000} {
		c := RetainChange(wire.Retain{Set: wire.RetainTTL, TTL: ttl}, now)
		if !c.Expire.After(now.Add(24 * time.Hour)) {
			t.Errorf("TTL %d ms: expires at %v, not in the far future (now %v)", ttl, c.Expire, now)
		}
	}
}

// TestMovedBlockKeepsTTLWhenPinRefused: a block moved from an
// earlier owner where it was pinned in DRAM with a TTL, to a server with no
// KV DRAM tier (or a full pin quota): the pin cannot be taken, and
// kvApplyRetention then drops the TTL too (kvstore.Retain applies nothing of
// a refused change), so the moved block never expires.
func TestMovedBlockKeepsTTLWhenPinRefused(t *testing.T) {
	kv, err := kvstore.Open(kvstore.Config{Dir: t.TempDir(), DiskBytes: 8 << 20, SegmentSize: 1 << 20, MaxValue: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	s := &Server{kv: kv, log: slog.Default()}
	key := []byte("k")
	if _, err := kv.Put(key, []byte("v"), false); err != nil {
		t.Fatal(err)
	}
	s.kvApplyRetention(key, wire.Retain{Pin: uint8(kvstore.TierDRAM), TTL: 60_000})
	r, ok := kv.Retention(key)
	if !ok || r.Expires.IsZero() {
		t.Fatalf("moved block's retention %+v (found %v): the TTL it had on its earlier owner was dropped", r, ok)
	}
}
