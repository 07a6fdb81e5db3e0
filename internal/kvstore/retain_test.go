package kvstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
)

// clock is a time source a test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Unix(1_800_000_000, 0)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func mustPut(t *testing.T, s *Store, k string, v []byte) {
	t.Helper()
	if _, err := s.Put([]byte(k), v, false); err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
}

func mustRetain(t *testing.T, s *Store, k string, c Change) Retention {
	t.Helper()
	r, err := s.Retain([]byte(k), c)
	if err != nil {
		t.Fatalf("retain %s: %v", k, err)
	}
	return r
}

func invariants(t *testing.T, s *Store, step string) {
	t.Helper()
	if err := s.checkInvariants(); err != nil {
		t.Fatalf("after %s: %v", step, err)
	}
}

// TestTTLExpiry: a block with a TTL is a hit until its time and a miss from
// then on (get, exists, scan, a put without overwrite stores anew), on the
// test's clock; the sweep drops blocks nobody reads; PERSIST removes a TTL;
// an expiry in the past deletes at once; a restart does not bring an expired
// block back.
func TestTTLExpiry(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	cfg := Config{MemBytes: 1 << 20, Dir: dir, DiskBytes: 64 << 20, SegmentSize: 1 << 20, MaxValue: 200 << 10, Now: clk.now}
	s := open(t, cfg)
	v := val("a", 1000)
	for _, k := range []string{"a", "b", "c", "d"} {
		mustPut(t, s, k, v)
	}
	at := clk.now().Add(10 * time.Second)
	for _, k := range []string{"a", "b", "c"} {
		if r := mustRetain(t, s, k, Change{SetExpire: true, Expire: at}); !r.Expires.Equal(at) {
			t.Fatalf("%s expires %v, want %v", k, r.Expires, at)
		}
	}
	mustRetain(t, s, "c", Change{SetExpire: true}) // PERSIST
	invariants(t, s, "expire")
	clk.add(10*time.Second - time.Nanosecond)
	if got, _, err := get(s, "a"); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("a before its TTL: %v", err)
	}
	clk.add(time.Nanosecond)
	if _, _, err := get(s, "a"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("a at its TTL: %v, want a miss", err)
	}
	if tier, _ := s.Exists([]byte("a")); tier != TierNone {
		t.Fatalf("a exists in %v after its TTL", tier)
	}
	if keys, _, total := s.Scan(nil, 0, 100); total != 2 || len(keys) != 2 {
		t.Fatalf("scan lists %v (%d): b is expired and unread, but must not be listed", keys, total)
	}
	if n := s.ExpireDue(10); n != 1 {
		t.Fatalf("sweep dropped %d, want 1 (b)", n)
	}
	if st := s.Stats(); st.Expired != 2 || st.Keys != 2 || st.ExpiringKeys != 0 {
		t.Fatalf("stats: %+v", st)
	}
	if got, _, err := get(s, "c"); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("c had its TTL removed: %v", err)
	}
	if existed, err := s.Put([]byte("a"), val("a2", 10), false); err != nil || existed {
		t.Fatalf("put of an expired key: existed=%v err=%v, want stored anew", existed, err)
	}
	r := mustRetain(t, s, "d", Change{SetExpire: true, Expire: clk.now().Add(-time.Second)})
	if r.Expires.IsZero() {
		t.Fatal("an expiry in the past did not say so")
	}
	if tier, _ := s.Exists([]byte("d")); tier != TierNone {
		t.Fatal("an expiry in the past kept the block")
	}
	invariants(t, s, "expiry")
	// Blocks b and d reached the disk tier? Push everything there and
	// restart: the expired ones stay gone (tombstones), without a snapshot.
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := open(t, cfg)
	for k, want := range map[string]bool{"a": true, "b": false, "c": true, "d": false} {
		if tier, _ := s2.Exists([]byte(k)); (tier != TierNone) != want {
			t.Errorf("after restart %s in %v, want present=%v", k, tier, want)
		}
	}
}

// TestPinQuota: pins are bounded per tier (a quarter of it by default,
// at most half); a pin beyond is refused with ErrNoSpace and changes
// nothing; unpinning makes room; a pin needs the block and the tier.
func TestPinQuota(t *testing.T) {
	s := open(t, Config{MemBytes: 1 << 20, Dir: t.TempDir(), DiskBytes: 8 << 20, SegmentSize: 1 << 20, MaxValue: 200 << 10})
	st := s.Stats()
	if st.PinQuotaMem != 256<<10 || st.PinQuotaDisk != 2<<20 {
		t.Fatalf("default quotas %d, %d", st.PinQuotaMem, st.PinQuotaDisk)
	}
	for i := 0; i < 5; i++ {
		mustPut(t, s, fmt.Sprint("m", i), val("m", 64<<10))
	}
	for i := 0; i < 4; i++ {
		mustRetain(t, s, fmt.Sprint("m", i), Change{SetPin: true, Pin: TierDRAM})
	}
	_, err := s.Retain([]byte("m4"), Change{SetPin: true, Pin: TierDRAM, SetPriority: true, Priority: 3})
	if !errors.Is(err, errs.ErrNoSpace) {
		t.Fatalf("a fifth pin of 64 KiB in a 256 KiB quota: %v", err)
	}
	if r, _ := s.Retention([]byte("m4")); r != (Retention{}) {
		t.Fatalf("a refused pin changed the block: %+v", r)
	}
	invariants(t, s, "refused pin")
	mustRetain(t, s, "m0", Change{SetPin: true, Pin: TierNone})
	mustRetain(t, s, "m4", Change{SetPin: true, Pin: TierDRAM})
	if st := s.Stats(); st.PinnedKeys != 4 || st.PinnedMem != 256<<10 {
		t.Fatalf("pins: %d keys, %d bytes", st.PinnedKeys, st.PinnedMem)
	}
	// Moving a pin to disk frees the DRAM quota.
	mustRetain(t, s, "m1", Change{SetPin: true, Pin: TierDisk})
	mustRetain(t, s, "m0", Change{SetPin: true, Pin: TierDRAM})
	invariants(t, s, "pins moved")
	if _, err := s.Retain([]byte("nope"), Change{SetPin: true, Pin: TierDRAM}); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("pin of a missing key: %v", err)
	}
	if _, err := s.Retain([]byte("m0"), Change{SetPriority: true, Priority: MaxPriority + 1}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("priority out of range: %v", err)
	}
	// A quota above half a tier is cut to half; a negative one refuses pins.
	s2 := open(t, Config{MemBytes: 1 << 20, MaxValue: 200 << 10, PinQuota: 1 << 30})
	if st := s2.Stats(); st.PinQuotaMem != 512<<10 || st.PinQuotaDisk != 0 {
		t.Fatalf("quota cut to %d, %d", st.PinQuotaMem, st.PinQuotaDisk)
	}
	mustPut(t, s2, "x", val("x", 10))
	if _, err := s2.Retain([]byte("x"), Change{SetPin: true, Pin: TierDisk}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("disk pin without a disk tier: %v", err)
	}
	s3 := open(t, Config{MemBytes: 1 << 20, MaxValue: 200 << 10, PinQuota: -1})
	mustPut(t, s3, "x", val("x", 10))
	if _, err := s3.Retain([]byte("x"), Change{SetPin: true, Pin: TierDRAM}); !errors.Is(err, errs.ErrNoSpace) {
		t.Fatalf("pin with pins off: %v", err)
	}
}

// TestPinsSurviveEvictionStorm: with the DRAM pin quota full of pinned
// blocks and disk pins up to theirs, 30 DRAM tiers' worth of puts through a
// disk tier that holds 4: every put succeeds, every DRAM-pinned block is
// still in DRAM and every disk-pinned block still stored, with its bytes;
// the invariants hold after every step. A block pinned while only on disk
// is read back into DRAM.
func TestPinsSurviveEvictionStorm(t *testing.T) {
	s := open(t, Config{MemBytes: 1 << 20, Dir: t.TempDir(), DiskBytes: 4 << 20, SegmentSize: 512 << 10, MaxValue: 64 << 10,
		PinQuota: 512 << 10})
	const bs = 32 << 10
	want := map[string][]byte{}
	for i := 0; i < 16; i++ { // 512 KiB: the DRAM quota, half of DRAM
		k := fmt.Sprint("pin-dram-", i)
		want[k] = val(k, bs)
		mustPut(t, s, k, want[k])
	}
	for i := 0; i < 16; i++ { // 512 KiB pinned on disk
		k := fmt.Sprint("pin-disk-", i)
		want[k] = val(k, bs)
		mustPut(t, s, k, want[k])
	}
	// Push the DRAM-pin candidates to disk first: pinning reads them back.
	for i := 0; i < 64; i++ {
		mustPut(t, s, fmt.Sprint("fill-", i), val("f", bs))
	}
	if tier, _ := s.Exists([]byte("pin-dram-0")); tier != TierDisk {
		t.Fatalf("pin-dram-0 in %v before the pin, want disk", tier)
	}
	for i := 0; i < 16; i++ {
		mustRetain(t, s, fmt.Sprint("pin-dram-", i), Change{SetPin: true, Pin: TierDRAM})
		mustRetain(t, s, fmt.Sprint("pin-disk-", i), Change{SetPin: true, Pin: TierDisk})
	}
	invariants(t, s, "pins")
	for i := 0; i < 30*32; i++ {
		k := fmt.Sprint("storm-", i)
		if _, err := s.Put([]byte(k), val(k, bs), false); err != nil {
			t.Fatalf("put %d of the storm failed with pins at their quota: %v", i, err)
		}
		if i%64 == 0 {
			if _, _, err := get(s, fmt.Sprint("storm-", i/2)); err != nil && !errors.Is(err, errs.ErrNotFound) {
				t.Fatal(err)
			}
			invariants(t, s, fmt.Sprint("put ", i))
		}
	}
	for k, v := range want {
		got, tier, err := get(s, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("pinned %s after the storm: %v", k, err)
		}
		if k[:8] == "pin-dram" && tier != TierDRAM {
			t.Fatalf("%s pinned in DRAM was served from %v", k, tier)
		}
	}
	if st := s.Stats(); st.Evictions == 0 {
		t.Fatal("the storm evicted nothing: it tested nothing")
	}
}

// TestPriorityOrder: in a DRAM-only store the oldest blocks would go first;
// with priorities the low ones go first, then the default ones, and the
// high ones stay, oldest as they are.
func TestPriorityOrder(t *testing.T) {
	for _, policy := range []string{"s3fifo", "lru"} {
		t.Run(policy, func(t *testing.T) {
			s := open(t, Config{MemBytes: 64 * PageSize, MaxValue: PageSize, Policy: policy})
			put := func(prefix string, n int, prio int8) {
				for i := 0; i < n; i++ {
					k := fmt.Sprint(prefix, i)
					mustPut(t, s, k, val(k, PageSize))
					if prio != 0 {
						mustRetain(t, s, k, Change{SetPriority: true, Priority: prio})
					}
				}
			}
			have := func(prefix string, n int) int {
				c := 0
				for i := 0; i < n; i++ {
					if tier, _ := s.Exists([]byte(fmt.Sprint(prefix, i))); tier != TierNone {
						c++
					}
				}
				return c
			}
			put("hi", 16, 2)
			put("lo", 16, -2)
			put("mid", 48, 0) // 80 blocks in 64 pages: 16 go
			if h, l, m := have("hi", 16), have("lo", 16), have("mid", 48); h != 16 || l != 0 || m != 48 {
				t.Fatalf("after the first fill: hi %d/16, lo %d/16, mid %d/48; want the low ones gone", h, l, m)
			}
			invariants(t, s, "first fill")
			put("more", 64, 0)
			if h := have("hi", 16); h != 16 {
				t.Fatalf("hi %d/16 after 64 default puts: the default ones must go first", h)
			}
			invariants(t, s, "second fill")
		})
	}
}

// TestRetentionRestart: a graceful stop (Flush) keeps pins, TTLs and
// priorities; the snapshot is used once (a crash after the restart does not
// reapply it); without a graceful stop blocks come back without them.
func TestRetentionRestart(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	cfg := Config{MemBytes: 1 << 20, Dir: dir, DiskBytes: 64 << 20, SegmentSize: 1 << 20, MaxValue: 200 << 10, Now: clk.now}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"dram", "disk", "ttl", "prio", "plain"} {
		mustPut(t, s, k, val(k, 20<<10))
	}
	at := clk.now().Add(time.Hour)
	mustRetain(t, s, "dram", Change{SetPin: true, Pin: TierDRAM})
	mustRetain(t, s, "disk", Change{SetPin: true, Pin: TierDisk})
	mustRetain(t, s, "ttl", Change{SetExpire: true, Expire: at})
	mustRetain(t, s, "prio", Change{SetPriority: true, Priority: -3})
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]Retention{"dram": {Pin: TierDRAM}, "disk": {Pin: TierDisk}, "ttl": {Expires: at}, "prio": {Priority: -3}, "plain": {}} {
		r, ok := s2.Retention([]byte(k))
		if !ok || r.Pin != want.Pin || r.Priority != want.Priority || !r.Expires.Equal(want.Expires) {
			t.Errorf("%s after a graceful restart: %+v (found %v), want %+v", k, r, ok, want)
		}
	}
	if tier, _ := s2.Exists([]byte("dram")); tier != TierDRAM {
		t.Errorf("the DRAM-pinned block is in %v after restart", tier)
	}
	if err := s2.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, snapName)); !os.IsNotExist(err) {
		t.Fatalf("the snapshot is still there after it was applied: %v", err)
	}
	s2.Close() // a crash: no Flush
	s3 := open(t, cfg)
	if r, ok := s3.Retention([]byte("disk")); !ok || r != (Retention{}) {
		t.Fatalf("after a crash: %+v (found %v), want a plain block", r, ok)
	}
}

// TestProbesNeverRetain: Exists and Prefetch leave a block's retention as
// it is, and Put of an existing key (write-once) too; an overwrite starts
// anew, as Redis's SET clears a TTL.
func TestProbesNeverRetain(t *testing.T) {
	clk := newClock()
	s := open(t, Config{MemBytes: 1 << 20, Dir: t.TempDir(), DiskBytes: 64 << 20, SegmentSize: 1 << 20, MaxValue: 200 << 10, Now: clk.now})
	mustPut(t, s, "k", val("k", 100))
	want := mustRetain(t, s, "k", Change{SetPriority: true, Priority: 1, SetExpire: true, Expire: clk.now().Add(time.Minute)})
	s.Exists([]byte("k"))
	s.Prefetch([]byte("k"))
	mustPut(t, s, "k", val("k", 100))
	if r, _ := s.Retention([]byte("k")); r != want {
		t.Fatalf("probes changed the retention: %+v, want %+v", r, want)
	}
	if _, err := s.Put([]byte("k"), val("k2", 100), true); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Retention([]byte("k")); r != (Retention{}) {
		t.Fatalf("an overwrite kept %+v", r)
	}
}

// FuzzRetainSnapshot: the snapshot decoder never panics, and what it
// accepts encodes back to the same bytes.
func FuzzRetainSnapshot(f *testing.F) {
	f.Add(encodeSnap(nil))
	f.Add(encodeSnap([]snapRec{{key: "a\x00b", pin: TierDRAM, prio: -2, expire: 12345}, {key: "c", pin: TierDisk}}))
	f.Add([]byte("GDRT\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := parseSnap(b)
		if err != nil {
			return
		}
		if got := encodeSnap(recs); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, decoded from %x", got, b)
		}
	})
}
