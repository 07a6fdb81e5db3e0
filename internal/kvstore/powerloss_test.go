package kvstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/tier/memfs"
)

// kvModel is what one key may read as.
type kvModel struct {
	// all is every value ever stored under the key (a Put that stored it,
	// not one that found the key there). The store never syncs, so a
	// power loss may bring back any record of the key that ever reached
	// the page cache: a value overwritten or deleted since (its tombstone
	// or the newer record lost, or an evicted segment's unlink lost), not
	// only the last one.
	all [][]byte
	// known: since the last power loss the store has said what the key
	// holds, and it must go on saying so: cur (absent when nil and !has)
	// or, a cache's right, a miss.
	known bool
	has   bool
	cur   []byte
}

func (m *kvModel) allows(v []byte) bool {
	if m.known {
		return m.has && bytes.Equal(v, m.cur)
	}
	for _, a := range m.all {
		if bytes.Equal(v, a) {
			return true
		}
	}
	return false
}

func (m *kvModel) allowsSize(n int64) bool {
	if m.known {
		return m.has && int64(len(m.cur)) == n
	}
	for _, a := range m.all {
		if int64(len(a)) == n {
			return true
		}
	}
	return false
}

// set records what the store said: v, or absent when !has.
func (m *kvModel) set(v []byte, has bool) {
	m.known, m.has, m.cur = true, has, v
}

// TestKVPowerLossModel runs random puts (overwriting or not), gets,
// deletes, pins, flushes, Exists and restarts over a store on memfs with
// segments and tiers small enough that demotions, segment rotation, eviction and moves
// out of evicted segments happen all the time, and at random steps loses
// power: memfs drops, keeps or tears (4 KiB pages, any subset) every write
// and every name change since the last sync, and the store never syncs, so
// a segment may come back without its newest records, with holes anywhere,
// with pages of zeros, or not at all, and an evicted one may come back.
// Some power losses strike in the middle of an operation (its later record
// writes never happen). After each the store must open; then every key is
// read and must be a miss (a clean ErrNotFound) or byte-identical to a
// value once stored under that key (kvModel.all: after a power loss an
// older value or a deleted one may come back; a cache may lose anything,
// but a hit with bytes that were never that key's value is the failure
// this test exists for). Between power losses a key must read as the store
// last said or as a miss, also across a restart without a power loss. The
// invariants are checked after every step.
func TestKVPowerLossModel(t *testing.T) {
	// Seeds 1 to 6, and 86: without the fix of TestNoAppendAfterSkippedBytes
	// a deleted key comes back after a clean restart in it.
	seeds := []uint64{1, 2, 3, 4, 5, 6, 86}
	if n, err := strconv.ParseUint(os.Getenv("GD2FS_POWERLOSS_SEEDS"), 10, 64); err == nil {
		seeds = nil // a longer run: GD2FS_POWERLOSS_SEEDS=400
		for seed := uint64(1); seed <= n; seed++ {
			seeds = append(seeds, seed)
		}
	}
	if n, err := strconv.ParseUint(os.Getenv("GD2FS_POWERLOSS_SEED"), 10, 64); err == nil {
		seeds = []uint64{n} // one seed, to replay a failure
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			// Odd seeds without DRAM (every put goes straight to disk),
			// even ones with a DRAM tier of 6 pages, 1 or 2 a block
			// (write-behind: demotions, promotions of ghosts, Flush).
			cfg := Config{Dir: "/srv/kv", DiskBytes: 160 << 10, SegmentSize: 32 << 10, MaxValue: 20 << 10}
			if seed%2 == 0 {
				cfg.MemBytes = 96 << 10
			}
			if err := runKVPowerLoss(t, seed, cfg, 600); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func runKVPowerLoss(t *testing.T, seed uint64, cfg Config, steps int) error {
	r := rand.New(rand.NewPCG(seed, 91))
	fs := memfs.New()
	cfg.fs = fs
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	defer func() { s.Close() }()
	// A few long keys, so that records of the same size differ in more
	// than their values, and headers straddle pages.
	keys := make([]string, 14)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
		if i%5 == 4 {
			keys[i] += strings.Repeat("-", 200+i*40)
		}
	}
	models := map[string]*kvModel{}
	for _, k := range keys {
		models[k] = &kvModel{known: true}
	}
	value := func() []byte {
		switch r.IntN(20) {
		case 0:
			return []byte{} // an empty value is a value
		case 1, 2:
			return fastVal(r, int(cfg.MaxValue)) // the largest
		default:
			return fastVal(r, 1+r.IntN(int(cfg.MaxValue)))
		}
	}
	// check reads key and holds it to its model.
	check := func(k string) error {
		m := models[k]
		// Not get(): the model, not the CRC handed out, judges the bytes
		// first (a store could hand out a CRC that matches wrong bytes).
		var got []byte
		var gotCRC uint32
		_, err := s.Get([]byte(k), func(bs [][]byte, crc uint32) error {
			for _, b := range bs {
				got = append(got, b...)
			}
			gotCRC = crc
			return nil
		})
		if err != nil {
			if !errors.Is(err, errs.ErrNotFound) {
				return fmt.Errorf("get %.12s: not a clean miss: %v", k, err)
			}
			m.set(nil, false) // absent until put again (or a power loss)
			return nil
		}
		if !m.allows(got) {
			return fmt.Errorf("get %.12s: %d bytes that are not a value it may have (known %v, has %v: %d bytes; %d values ever stored)",
				k, len(got), m.known, m.has, len(m.cur), len(m.all))
		}
		if crc32c.Checksum(got) != gotCRC {
			return fmt.Errorf("get %.12s: the CRC handed out does not match the bytes", k)
		}
		m.set(got, true)
		return nil
	}
	crashes, midOp := 0, 0
	var seen Stats // counters summed over the store's lives
	count := func() {
		st := s.Stats()
		seen.Evictions += st.Evictions
		seen.Demotions += st.Demotions
		seen.Corrupt += st.Corrupt
	}
	for step := 0; step < steps; step++ {
		k := keys[r.IntN(len(keys))]
		m := models[k]
		// powerLoss ends the step with a power loss: the process stops
		// (Close only unmaps DRAM and closes descriptors: it writes
		// nothing), memfs loses what was not synced, and the store opens
		// on what is left.
		powerLoss := false
		switch op := r.IntN(100); {
		case op < 40:
			v := value()
			over := r.IntN(3) > 0
			existed, err := s.Put([]byte(k), v, over)
			if err != nil {
				return fmt.Errorf("step %d: put %.12s (%d bytes): %v", step, k, len(v), err)
			}
			if !existed || over {
				m.all = append(m.all, v)
				m.set(v, true)
			}
		case op < 70:
			if err := check(k); err != nil {
				return fmt.Errorf("step %d: %v", step, err)
			}
		case op < 78:
			if _, err := s.Delete([]byte(k)); err != nil {
				return fmt.Errorf("step %d: delete %.12s: %v", step, k, err)
			}
			m.set(nil, false)
		case op < 82:
			if _, err := s.Flush(); err != nil {
				return fmt.Errorf("step %d: flush: %v", step, err)
			}
		case op < 86:
			// Pins and priorities change what eviction keeps and go into
			// retain.snap at Flush, a file a power loss may tear too.
			c := Change{SetPriority: true, Priority: int8(r.IntN(2*MaxPriority+1) - MaxPriority)}
			if r.IntN(2) == 0 {
				c.SetPin, c.Pin = true, Tier(r.IntN(3))
				if cfg.MemBytes == 0 && c.Pin == TierDRAM {
					c.Pin = TierDisk
				}
			}
			if _, err := s.Retain([]byte(k), c); err != nil && !errors.Is(err, errs.ErrNotFound) && !errors.Is(err, errs.ErrNoSpace) {
				return fmt.Errorf("step %d: retain %.12s: %v", step, k, err)
			}
		case op < 93:
			// A restart without a power loss (the page cache survives):
			// what the store said a key holds stays true or becomes a
			// miss (blocks only in DRAM are lost), never an older value
			// or a deleted one back.
			count()
			s.Close()
			if s, err = Open(cfg); err != nil {
				return fmt.Errorf("step %d: reopen: %v", step, err)
			}
			for _, k := range keys {
				if err := check(k); err != nil {
					return fmt.Errorf("step %d: after a restart: %v", step, err)
				}
			}
		case op < 96:
			if tier, n := s.Exists([]byte(k)); tier != TierNone && !m.allowsSize(n) {
				return fmt.Errorf("step %d: exists %.12s: %v, %d bytes, not the size of a value it may have", step, k, tier, n)
			}
		case op < 98:
			powerLoss = true
		default:
			// Power fails in the middle of a put: its record writes from
			// the n-th on never happen (a demotion it causes, a move out
			// of an evicted segment, its own record).
			midOp++
			n := r.IntN(3)
			testWriteHook = func(*write) bool { n--; return n >= 0 }
			t.Cleanup(func() { testWriteHook = nil }) // also when Put panics
			v := value()
			_, err := s.Put([]byte(k), v, true)
			testWriteHook = nil
			if err != nil {
				return fmt.Errorf("step %d: put %.12s before the power loss: %v", step, k, err)
			}
			m.all = append(m.all, v)
			powerLoss = true
		}
		if err := s.checkInvariants(); err != nil {
			return fmt.Errorf("step %d: %v", step, err)
		}
		if !powerLoss {
			continue
		}
		crashes++
		count()
		s.Close()
		fs.Crash(r)
		if s, err = Open(cfg); err != nil {
			return fmt.Errorf("step %d: open after power loss %d: %v", step, crashes, err)
		}
		if err := s.checkInvariants(); err != nil {
			return fmt.Errorf("step %d: after power loss %d: %v", step, crashes, err)
		}
		for _, k := range keys {
			models[k].known = false
		}
		for _, k := range keys {
			if err := check(k); err != nil {
				return fmt.Errorf("step %d: after power loss %d: %v", step, crashes, err)
			}
		}
	}
	if crashes == 0 {
		return fmt.Errorf("no power loss in %d steps", steps)
	}
	count()
	t.Logf("seed %d: %d steps, %d power losses (%d mid-put); %d evictions, %d demotions, %d damaged records seen; %d segments now, %d made",
		seed, steps, crashes, midOp, seen.Evictions, seen.Demotions, seen.Corrupt, len(s.segs), s.nextSeg)
	return nil
}

// segmentBytes is the segment file the store on fs wrote first.
func segmentBytes(t testing.TB, fs *memfs.FS, dir string) []byte {
	f, err := fs.OpenFile(dir+"/seg-0000000000000000.kv", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzSegmentLoad: any bytes as a segment file (a power loss can leave any
// mix of pages) open as a store, which then holds its invariants; every key
// it loaded reads as a miss or as bytes matching the CRC32C its record
// claims; and a put after the load reads back exactly (the scan cut what it
// could not parse, so new records do not land inside garbage it kept).
func FuzzSegmentLoad(f *testing.F) {
	const dir = "/srv/kv"
	cfg := Config{Dir: dir, DiskBytes: 1 << 20, SegmentSize: 256 << 10, MaxValue: 64 << 10}
	{
		// Seeds: a real segment of a few records, a tombstone among them,
		// and the same torn.
		fs := memfs.New()
		c := cfg
		c.fs = fs
		s, err := Open(c)
		if err != nil {
			f.Fatal(err)
		}
		for i, n := range []int{0, 1, 5000, 9000} {
			k := fmt.Sprint("key", i)
			if _, err := s.Put([]byte(k), val(k, n), true); err != nil {
				f.Fatal(err)
			}
		}
		if _, err := s.Delete([]byte("key1")); err != nil {
			f.Fatal(err)
		}
		s.Close()
		b := segmentBytes(f, fs, dir)
		f.Add(b)
		f.Add(b[:len(b)-100])
		torn := bytes.Clone(b)
		clear(torn[4096:8192])
		f.Add(torn)
		f.Add(b[30:])
	}
	f.Add([]byte{})
	f.Add([]byte("GDKV"))
	f.Fuzz(func(t *testing.T, b []byte) { loadSegment(t, cfg, b) })
}

// loadSegment is FuzzSegmentLoad's check of b as the only segment of a
// store of cfg.
func loadSegment(t *testing.T, cfg Config, b []byte) {
	dir := cfg.Dir
	fs := memfs.New()
	c := cfg
	c.fs = fs
	if err := fs.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := fs.OpenFile(dir+"/seg-0000000000000000.kv", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	w.Close()
	s, err := Open(c)
	if err != nil {
		t.Fatalf("open on %d bytes of segment: %v", len(b), err)
	}
	defer s.Close()
	if err := s.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	var keys []string
	for k := range s.index {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	for _, k := range keys {
		var got []byte
		var crc uint32
		_, err := s.Get([]byte(k), func(bs [][]byte, c uint32) error {
			for _, b := range bs {
				got = append(got, b...)
			}
			crc = c
			return nil
		})
		if err != nil {
			if !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("get %q: not a clean miss: %v", k, err)
			}
			continue
		}
		if crc32c.Checksum(got) != crc {
			t.Fatalf("get %q: %d bytes that do not match their CRC", k, len(got))
		}
	}
	want := val("after", 3000)
	if _, err := s.Put([]byte("after"), want, true); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(c); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	got, _, err := get(s, "after")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a put after loading %d bytes of segment reads back wrong after a restart (err %v, %d bytes)", len(b), err, len(got))
	}
	if err := s.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestRetentionSnapshotGoneAfterPowerLoss: the snapshot a start applied
// stays removed through a power loss after that start. Its removal is
// synced (loadRetention): otherwise the power loss can undo it, and the
// next start reapplies the pins, TTLs and priorities of a stop long past.
func TestRetentionSnapshotGoneAfterPowerLoss(t *testing.T) {
	const dir = "/srv/kv"
	tried := 0
	for seed := uint64(1); seed <= 40; seed++ {
		r := rand.New(rand.NewPCG(seed, 5))
		fs := memfs.New()
		cfg := Config{Dir: dir, DiskBytes: 1 << 20, SegmentSize: 256 << 10, MaxValue: 64 << 10, fs: fs}
		s, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		mustPut(t, s, "k", val("k", 5000))
		mustRetain(t, s, "k", Change{SetPriority: true, Priority: 3})
		if _, err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		s.Close()
		fs.Crash(r) // whatever survives of the stop is now on disk
		if !exists(fs, dir+"/"+snapName) {
			continue // the snapshot itself was lost: nothing to test
		}
		tried++
		if s, err = Open(cfg); err != nil {
			t.Fatal(err)
		}
		if exists(fs, dir+"/"+snapName) {
			t.Fatal("the snapshot is still there after it was applied")
		}
		s.Close()
		fs.Crash(r)
		if exists(fs, dir+"/"+snapName) {
			t.Fatalf("seed %d: a power loss after the start brought back the snapshot it applied", seed)
		}
	}
	if tried < 5 {
		t.Fatalf("only %d of 40 seeds kept the snapshot through the first power loss: the test tests too little", tried)
	}
}

func exists(fs *memfs.FS, name string) bool {
	f, err := fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// record is a segment record of key and value (nil: a tombstone), as
// writeOut writes it.
func record(key string, v []byte) []byte {
	h := make([]byte, recHeader)
	encodeHeader(h, key, int64(len(v)), crc32c.Checksum(v), v == nil)
	return append(append(h, key...), v...)
}

// TestNoAppendAfterSkippedBytes: a header the start-up scan skipped because
// its record ran past the end of the file (torn) must stay skipped. Were the
// store to append to that segment, the file would grow under the claimed
// record, the next scan would take it and jump over the records after it:
// a restart with no power loss would bring back an older value of a key
// (found by TestKVPowerLossModel: 2 of 300 seeds failed, a key reading an
// older value after a clean restart; seed 86 fails so now).
func TestNoAppendAfterSkippedBytes(t *testing.T) {
	dir := t.TempDir()
	old, newer := val("old", 3000), val("new", 3000)
	var seg []byte
	seg = append(seg, record("a", old)...)
	torn := record("z", val("z", 20000))[:recHeader+1+100] // a header, its key, a little of its value
	seg = append(seg, torn...)
	seg = append(seg, record("b", val("b", 500))...)
	seg = append(seg, record("a", newer)...)
	if err := os.WriteFile(dir+"/seg-0000000000000000.kv", seg, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Dir: dir, DiskBytes: 4 << 20, SegmentSize: 1 << 20, MaxValue: 64 << 10}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := get(s, "a"); err != nil || !bytes.Equal(got, newer) {
		t.Fatalf("a: err %v, newer value %v", err, bytes.Equal(got, newer))
	}
	// Enough bytes that the segment, appended to, would reach past z's
	// claimed end.
	mustPut(t, s, "c", val("c", 30000))
	if err := s.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, cfg)
	got, _, err := get(s, "a")
	if err != nil {
		t.Fatalf("a after a restart: %v (it was on disk and nothing deleted it)", err)
	}
	if !bytes.Equal(got, newer) {
		t.Fatalf("a after a restart reads its older value (%v): the scan took the torn record it had skipped", bytes.Equal(got, old))
	}
	if got, _, err := get(s, "c"); err != nil || !bytes.Equal(got, val("c", 30000)) {
		t.Fatalf("c after a restart: err %v", err)
	}
}
