package kvstore

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

// TestFlushKeepsDRAMBlocks: blocks only in DRAM are on disk after Flush,
// still in DRAM, and a store reopened on the directory has every one with
// its bytes. Without Flush a restart has none of them (write-behind).
func TestFlushKeepsDRAMBlocks(t *testing.T) {
	for _, flush := range []bool{false, true} {
		t.Run(fmt.Sprint("flush=", flush), func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{MemBytes: 8 << 20, Dir: dir, DiskBytes: 64 << 20, SegmentSize: 1 << 20, MaxValue: 256 << 10}
			s, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 200; i++ {
				k := fmt.Sprint("k", i)
				if _, err := s.Put([]byte(k), val(k, 10000+i), false); err != nil {
					t.Fatal(err)
				}
			}
			if st := s.Stats(); st.MemKeys != 200 || st.DiskUsed != 0 {
				t.Fatalf("before: %+v", st)
			}
			if flush {
				fs, err := s.Flush()
				if err != nil || fs.Written != 200 || fs.Left != 0 {
					t.Fatalf("flush: %+v %v", fs, err)
				}
				if err := s.checkInvariants(); err != nil {
					t.Fatal(err)
				}
				if _, tier, err := get(s, "k7"); err != nil || tier != TierDRAM {
					t.Fatalf("after flush k7 is read from %v (%v); want DRAM", tier, err)
				}
				again, err := s.Flush()
				if err != nil || again.Written != 0 {
					t.Fatalf("a second flush wrote %+v %v", again, err)
				}
			}
			s.Close()
			s2 := open(t, cfg)
			hits := 0
			for i := 0; i < 200; i++ {
				k := fmt.Sprint("k", i)
				got, _, err := get(s2, k)
				switch {
				case errors.Is(err, errs.ErrNotFound):
				case err != nil:
					t.Fatal(err)
				case !bytes.Equal(got, val(k, 10000+i)):
					t.Fatalf("%s: wrong bytes after restart", k)
				default:
					hits++
				}
			}
			if want := map[bool]int{false: 0, true: 200}[flush]; hits != want {
				t.Fatalf("%d of 200 blocks after restart; want %d", hits, want)
			}
		})
	}
}

// TestFlushBoundedByRoom: a flush writes what fits in the disk tier's free
// room, evicts nothing already there, and says how much was left.
func TestFlushBoundedByRoom(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{MemBytes: 8 << 20, Dir: dir, DiskBytes: 1 << 20, SegmentSize: 256 << 10, MaxValue: 64 << 10}
	s := open(t, cfg)
	for i := 0; i < 100; i++ {
		k := fmt.Sprint("k", i)
		if _, err := s.Put([]byte(k), val(k, 20000), false); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := s.Flush()
	if err != nil {
		t.Fatal(err)
	}
	if fs.Written+fs.Left != 100 || fs.Left == 0 || fs.Written < 40 {
		t.Fatalf("flush into 1 MiB of 2 MB of blocks: %+v", fs)
	}
	if st := s.Stats(); st.DiskUsed > cfg.DiskBytes || st.Evictions != 0 || st.Keys != 100 {
		t.Fatalf("after flush: %+v", st)
	}
}

// TestSmallDiskTier: a disk tier smaller than the default segment works
// (segments adapt; puts past its size evict old segments instead of failing
// with "nothing can be evicted"), and one too small for the values asked is
// refused at open with a reason naming --kv-disk.
func TestSmallDiskTier(t *testing.T) {
	s := open(t, Config{Dir: t.TempDir(), DiskBytes: 8 << 20})
	for i := 0; i < 400; i++ {
		k := fmt.Sprint("k", i)
		if _, err := s.Put([]byte(k), val(k, 100<<10), false); err != nil {
			t.Fatalf("put %d into an 8 MiB disk tier: %v", i, err)
		}
	}
	if got, _, err := get(s, "k399"); err != nil || !bytes.Equal(got, val("k399", 100<<10)) {
		t.Fatalf("newest block: %v", err)
	}
	if st := s.Stats(); st.DiskUsed > 8<<20 || st.Evictions == 0 {
		t.Fatalf("stats: %+v", st)
	}
	_, err := Open(Config{Dir: t.TempDir(), DiskBytes: 8 << 20, MaxValue: 64 << 20})
	if !errors.Is(err, errs.ErrBadRequest) || !strings.Contains(err.Error(), "--kv-disk") {
		t.Fatalf("8 MiB disk for 64 MiB values: %v", err)
	}
}
