package kvstore

import (
	"container/list"
	"fmt"
	"math/rand/v2"
	"testing"
)

// The LRU miniature is an exact LRU (checked against a plain list model),
// and the S3-FIFO miniature keeps its accounting: bytes used, small bytes,
// small target within 10%..90%, never over capacity.
func TestMiniatures(t *testing.T) {
	const capPages = 64
	lru := newMini(true, capPages*PageSize, 0)
	s3 := newMini(false, capPages*PageSize, 2*capPages)
	var model list.List
	at := map[uint64]*list.Element{}
	modelHits := 0
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 50000 {
		fp := uint64(r.IntN(200))
		if r.IntN(4) == 0 {
			fp = uint64(1000 + i) // a one-off
		}
		if el, ok := at[fp]; ok {
			modelHits++
			model.MoveToFront(el)
		} else {
			if model.Len() == capPages {
				delete(at, model.Remove(model.Back()).(uint64))
			}
			at[fp] = model.PushFront(fp)
		}
		lru.access(fp, PageSize, true)
		s3.access(fp, PageSize, true)
		if int(lru.hits) != modelHits {
			t.Fatalf("access %d: LRU miniature %v hits, model %d", i, lru.hits, modelHits)
		}
		var used, small int64
		for el := s3.small.Front(); el != nil; el = el.Next() {
			used += el.Value.(*miniEntry).size
			small += el.Value.(*miniEntry).size
		}
		for el := s3.main.Front(); el != nil; el = el.Next() {
			used += el.Value.(*miniEntry).size
		}
		if used != s3.used || small != s3.smallBytes || used > s3.cap || len(s3.at) != s3.small.Len()+s3.main.Len() {
			t.Fatalf("access %d: S3-FIFO miniature used %d (counted %d), small %d (counted %d), cap %d, %d indexed", i, s3.used, used, s3.smallBytes, small, s3.cap, len(s3.at))
		}
		if s3.smallTarget < s3.cap/10 || s3.smallTarget > s3.cap*9/10 {
			t.Fatalf("access %d: small target %d outside 10%%..90%% of %d", i, s3.smallTarget, s3.cap)
		}
	}
	if s3.hits <= lru.hits {
		t.Errorf("a hot set of 200 beside 25%% one-offs: S3-FIFO %v hits, LRU %v; S3-FIFO should win", s3.hits, lru.hits)
	}
}

// TestAutoPolicy: "auto" starts as LRU; traffic where LRU loses (hot blocks
// read again only after a DRAM's worth of one-off writes, so LRU evicts each
// just before its reuse) makes it switch to S3-FIFO, which then keeps the hot
// blocks; the store's invariants hold throughout, every read returns the
// bytes written, and a fixed policy never switches.
func TestAutoPolicy(t *testing.T) {
	const pages, steps = 64, 1200
	for _, policy := range []string{"auto", "lru"} {
		t.Run(policy, func(t *testing.T) {
			s := open(t, Config{MemBytes: pages * PageSize, Policy: policy})
			if st := s.Stats(); st.Policy != "lru" {
				t.Fatalf("starts as %q, want lru", st.Policy)
			}
			hot := make([]string, pages/4)
			for i := range hot {
				hot[i] = fmt.Sprintf("hot-%d", i)
			}
			hits, reads := 0, 0
			n := 0
			for step := range steps {
				for range 4 {
					k := fmt.Sprintf("once-%d", n)
					n++
					if _, err := s.Put([]byte(k), val(k, PageSize), false); err != nil {
						t.Fatal(err)
					}
				}
				k := hot[step%len(hot)]
				got, _, err := get(s, k)
				if step >= steps*2/3 {
					reads++
				}
				switch {
				case err == nil:
					if string(got) != string(val(k, PageSize)) {
						t.Fatalf("step %d: %s has wrong bytes", step, k)
					}
					if step >= steps*2/3 {
						hits++
					}
				default: // a miss: the client computes it and puts it
					if _, err := s.Put([]byte(k), val(k, PageSize), false); err != nil {
						t.Fatal(err)
					}
				}
				if step%200 == 0 {
					checkAfter(t, s)
				}
			}
			st := s.Stats()
			t.Logf("%s: policy now %s after %d switches; hot hits in the last third %d of %d", policy, st.Policy, st.PolicySwitches, hits, reads)
			if policy == "lru" {
				if st.Policy != "lru" || st.PolicySwitches != 0 {
					t.Fatalf("a fixed policy moved: %+v", st)
				}
				return
			}
			if st.Policy != "s3fifo" || st.PolicySwitches == 0 {
				t.Fatalf("auto did not switch to S3-FIFO: %s after %d switches", st.Policy, st.PolicySwitches)
			}
			if hits < reads*8/10 {
				t.Fatalf("S3-FIFO kept only %d of %d hot reads in the last third", hits, reads)
			}
		})
	}
}

func TestPolicyConfig(t *testing.T) {
	if _, err := Open(Config{MemBytes: 1 << 20, Policy: "lfu"}); err == nil {
		t.Fatal("an unknown policy was accepted")
	}
}

// Switching from LRU (which raises use counts to 3 and never lowers them)
// back to S3-FIFO must still find a block to evict at once; and in LRU mode a
// pinned block left in the small queue must not stop eviction from main.
// (Both made a put fail with "every block is in use"; found in review.)
func TestPolicySwitchStillEvicts(t *testing.T) {
	const pages = 64
	v := make([]byte, PageSize)
	s := open(t, Config{MemBytes: pages * PageSize})
	for i := range pages {
		k := []byte(fmt.Sprint("k", i))
		if _, err := s.Put(k, v, false); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, _, err := get(s, string(k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.mu.Lock()
	s.duel.useLRU = false // as duelAccessLocked does when S3-FIFO wins
	s.mu.Unlock()
	if _, err := s.Put([]byte("after-switch"), v, false); err != nil {
		t.Fatalf("first put after switching to S3-FIFO: %v", err)
	}
	checkAfter(t, s)

	s2 := open(t, Config{MemBytes: pages * PageSize, Policy: "s3fifo"})
	if _, err := s2.Put([]byte("pinned"), v, false); err != nil { // in small
		t.Fatal(err)
	}
	s2.mu.Lock()
	s2.index["pinned"].pins++ // a get in flight
	s2.duel.useLRU = true
	s2.mu.Unlock()
	for i := range 3 * pages {
		if _, err := s2.Put([]byte(fmt.Sprint("m", i)), v, false); err != nil {
			t.Fatalf("put %d in LRU mode with a pinned block in small: %v", i, err)
		}
	}
	s2.mu.Lock()
	s2.index["pinned"].pins--
	s2.mu.Unlock()
	checkAfter(t, s2)
}

// A key remembered again after a ghost hit keeps its ghost when its old ring
// slot is reused (it used to be forgotten early).
func TestGhostRingStaleSlot(t *testing.T) {
	g := newGhosts(4)
	g.add(1, true)
	if _, ok := g.take(1); !ok {
		t.Fatal("1 is not a ghost")
	}
	g.add(1, false)
	for fp := uint64(2); fp <= 4; fp++ {
		g.add(fp, true)
	}
	if !g.has(1) {
		t.Fatal("1 forgotten when its stale slot was reused")
	}
	if g.small != 3 || g.main != 1 || len(g.live) != 4 {
		t.Fatalf("counts small %d main %d live %d, want 3 1 4", g.small, g.main, len(g.live))
	}
	g.add(5, true) // now 1's live slot goes
	if g.has(1) || !g.has(5) || len(g.live) != 4 {
		t.Fatalf("after a fifth: has(1)=%v has(5)=%v live %d", g.has(1), g.has(5), len(g.live))
	}
}
