package kvstore

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRestartKeepsTTLWhenPinRefused: a block pinned in DRAM with a
// TTL, restarted with pins refused (a smaller --kv-pin-quota or no --kv-mem):
// loadRetention's Retain refuses the pin and applies nothing else, so the
// block comes back without its TTL and never expires.
func TestRestartKeepsTTLWhenPinRefused(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	cfg := Config{MemBytes: 1 << 20, Dir: dir, DiskBytes: 64 << 20, SegmentSize: 1 << 20, MaxValue: 200 << 10, Now: clk.now}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, s, "k", val("k", 20<<10))
	at := clk.now().Add(time.Hour)
	mustRetain(t, s, "k", Change{SetPin: true, Pin: TierDRAM, SetExpire: true, Expire: at})
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	cfg.PinQuota = -1 // pins refused after the restart
	s2 := open(t, cfg)
	r, ok := s2.Retention([]byte("k"))
	if !ok || !r.Expires.Equal(at) {
		t.Fatalf("after a restart that cannot pin: %+v (found %v), want its TTL %v kept", r, ok, at)
	}
}

// TestRetainFarExpiry: an expiry past 2262 (where UnixNano is undefined) is
// kept as the far future, limits.MaxTTL from now, not as a time in the past.
func TestRetainFarExpiry(t *testing.T) {
	clk := newClock()
	s := open(t, Config{MemBytes: 1 << 20, MaxValue: 64 << 10, Now: clk.now})
	mustPut(t, s, "k", val("k", 1<<10))
	r := mustRetain(t, s, "k", Change{SetExpire: true, Expire: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)})
	if !r.Expires.After(clk.now().Add(50 * 365 * 24 * time.Hour)) {
		t.Fatalf("expiry in year 3000 kept as %v (now %v)", r.Expires, clk.now())
	}
	if _, ok := s.Retention([]byte("k")); !ok {
		t.Fatal("the block is gone")
	}
}

// TestFailedFlushSavesRetention: a flush that a failing disk cuts short
// still saves the retention of the blocks already on disk, so a crash
// before the next flush does not lose their TTLs.
func TestFailedFlushSavesRetention(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	s := open(t, Config{MemBytes: 1 << 20, Dir: dir, DiskBytes: 64 << 20, SegmentSize: 1 << 20, MaxValue: 200 << 10, Now: clk.now})
	mustPut(t, s, "k1", val("k1", 20<<10))
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	at := clk.now().Add(time.Hour)
	mustRetain(t, s, "k1", Change{SetExpire: true, Expire: at})
	mustPut(t, s, "k2", val("k2", 20<<10))
	testWriteErr = errors.New("injected disk failure")
	t.Cleanup(func() { testWriteErr = nil })
	if _, err := s.Flush(); !errors.Is(err, testWriteErr) {
		t.Fatalf("flush on a failing disk: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, snapName))
	if err != nil {
		t.Fatalf("no retention saved after a failed flush: %v", err)
	}
	recs, err := parseSnap(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].key != "k1" || recs[0].expire != at.UnixNano() {
		t.Fatalf("saved retention %+v, want k1 expiring at %v", recs, at)
	}
}
