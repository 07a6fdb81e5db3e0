package kvstore

import (
	"fmt"
	"testing"
)

// checkInvariants checks, with no operation in flight, that every DRAM page
// is free or held by exactly one indexed block, that the S3-FIFO queues hold
// exactly the blocks in DRAM, that the disk usage is the sum of the
// segments' sizes and each segment's live bytes the sum of its blocks, and
// that every indexed block has a copy somewhere. open runs it after every
// test that leaves its store open.
func (s *Store) checkInvariants() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	owner := map[int32]string{}
	inQueues, smallBytes := 0, int64(0)
	live := map[*segment]int64{}
	segs := map[*segment]bool{}
	var disk, pinMem, pinDisk int64
	var nPinned int
	var prio [prioLevels]int
	if len(s.queue) != 0 {
		return fmt.Errorf("%d disk writes reserved and never written", len(s.queue))
	}
	for _, g := range s.segs {
		if g.refs != 0 {
			return fmt.Errorf("segment %d still referenced %d times", g.id, g.refs)
		}
		segs[g] = true
		disk += g.size + g.charge
		if g.gone {
			return fmt.Errorf("segment %d is gone but still listed", g.id)
		}
	}
	for k, e := range s.index {
		switch {
		case e.key != k:
			return fmt.Errorf("block %q indexed under %q", e.key, k)
		case e.dead:
			return fmt.Errorf("dead block %q still indexed", k)
		case e.pend != nil:
			return fmt.Errorf("block %q has a disk write in flight", k)
		case e.pins != 0:
			return fmt.Errorf("block %q still pinned %d times", k, e.pins)
		case e.pages == nil && e.seg == nil:
			return fmt.Errorf("block %q indexed with no copy in DRAM or on disk", k)
		}
		switch e.pin {
		case TierDRAM:
			pinMem += memPinBytes(e)
			nPinned++
			if e.q != &s.pinned {
				return fmt.Errorf("block %q pinned in DRAM but not in the pinned list", k)
			}
		case TierDisk:
			pinDisk += e.size
			nPinned++
		}
		if e.q == &s.pinned && e.pin != TierDRAM {
			return fmt.Errorf("block %q in the pinned list but pinned %v", k, e.pin)
		}
		if e.q == &s.small || e.q == &s.main {
			prio[prioIndex(e.prio)]++
		}
		if _, ok := s.expiring[e]; ok != (e.expire != 0) {
			return fmt.Errorf("block %q expires at %d but listed as expiring: %v", k, e.expire, ok)
		}
		if e.pages != nil {
			if e.q != &s.small && e.q != &s.main && e.q != &s.pinned {
				return fmt.Errorf("block %q in DRAM but in no queue", k)
			}
			if len(e.pages) != pagesFor(e.size) {
				return fmt.Errorf("block %q of %d bytes holds %d pages", k, e.size, len(e.pages))
			}
			inQueues++
			if e.q == &s.small {
				smallBytes += e.size
			}
			for _, p := range e.pages {
				if o, dup := owner[p]; dup {
					return fmt.Errorf("page %d held by blocks %q and %q", p, o, k)
				}
				owner[p] = k
			}
		} else if e.q != nil {
			return fmt.Errorf("block %q not in DRAM but queued", k)
		}
		if e.seg != nil {
			if !segs[e.seg] {
				return fmt.Errorf("block %q points at segment %d, which is not listed", k, e.seg.id)
			}
			live[e.seg] += e.size
		}
	}
	if pinMem != s.pinnedMem || pinDisk != s.pinnedDisk || nPinned != s.nPinned {
		return fmt.Errorf("pins counted %d blocks, %d DRAM and %d disk bytes; the blocks hold %d, %d, %d", s.nPinned, s.pinnedMem, s.pinnedDisk, nPinned, pinMem, pinDisk)
	}
	if s.pinnedMem > s.pinQuotaMem || s.pinnedDisk > s.pinQuotaDisk {
		return fmt.Errorf("pins of %d DRAM and %d disk bytes beyond the quotas %d and %d", s.pinnedMem, s.pinnedDisk, s.pinQuotaMem, s.pinQuotaDisk)
	}
	if prio != s.prioCount {
		return fmt.Errorf("priority counts %v, the queues hold %v", s.prioCount, prio)
	}
	if len(s.expiring) > len(s.index) {
		return fmt.Errorf("%d blocks listed as expiring, %d indexed", len(s.expiring), len(s.index))
	}
	if n := s.small.Len() + s.main.Len() + s.pinned.Len(); n != inQueues {
		return fmt.Errorf("queues hold %d blocks, %d are in DRAM", n, inQueues)
	}
	if smallBytes != s.smallBytes {
		return fmt.Errorf("small queue counted %d bytes, holds %d", s.smallBytes, smallBytes)
	}
	if s.reserved < 0 || s.reservedPages < 0 || s.filling < 0 || s.filling == 0 && (s.reserved != 0 || s.reservedPages != 0) {
		return fmt.Errorf("reservations: %d open, %d bytes, %d pages", s.filling, s.reserved, s.reservedPages)
	}
	if s.arena != nil && len(owner)+s.reservedPages+s.arena.FreePages() != s.arena.Pages() {
		return fmt.Errorf("arena: %d pages held + %d reserved + %d free != %d", len(owner), s.reservedPages, s.arena.FreePages(), s.arena.Pages())
	}
	if disk != s.disk.Used() {
		return fmt.Errorf("disk usage %d, segments hold %d bytes", s.disk.Used(), disk)
	}
	for _, g := range s.segs {
		if live[g] != g.live {
			return fmt.Errorf("segment %d counts %d live bytes, its blocks hold %d", g.id, g.live, live[g])
		}
	}
	return nil
}

// checkAfter runs checkInvariants when t ends, before the store closes.
func checkAfter(t *testing.T, s *Store) {
	t.Cleanup(func() {
		if err := s.checkInvariants(); err != nil {
			t.Errorf("kvstore invariant: %v", err)
		}
	})
}

// TestInvariantCheck: the check passes on a store in use and catches a page
// that leaked and a miscounted disk.
func TestInvariantCheck(t *testing.T) {
	s, err := Open(Config{MemBytes: 1 << 20, Dir: t.TempDir(), DiskBytes: 64 << 20, SegmentSize: 1 << 20, MaxValue: 200 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 40; i++ { // more than DRAM holds: some demote to disk
		if _, err := s.Put([]byte(fmt.Sprint("k", i)), val("k", 100<<10), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	s.disk.Add(1)
	if s.checkInvariants() == nil {
		t.Error("a miscounted disk passed")
	}
	s.disk.Add(-1)
	leak, _ := s.arena.Alloc(1)
	if s.checkInvariants() == nil {
		t.Error("a leaked page passed")
	}
	s.arena.Release(leak)
}
