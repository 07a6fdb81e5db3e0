package meta

import (
	"context"
	"fmt"
	"testing"
)

// TestSessionMemoryCap: a leader with --session-memory keeps about that
// many bytes of sessions in memory, dropping the least recently used ones
// (memory only): every session still plans exactly what it stored (loaded
// back from SQL, in SQL), and a chat that keeps taking turns stays in
// memory while idle sessions come and go. Without the cap memory holds
// every session served.
func TestSessionMemoryCap(t *testing.T) {
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow} {
			for _, capped := range []bool{true, false} {
				if !capped && (name != "sqlite" || mode != DurabilityFlush) {
					continue // the control: one is enough (every batch compares all memory with SQL)
				}
				t.Run(fmt.Sprintf("%s-%s-capped-%v", name, mode, capped), func(t *testing.T) {
					s := inMode(open, mode)(t).(*sqlStore)
					ctx := context.Background()
					if err := s.PutLayout(ctx, wbLayout); err != nil {
						t.Fatal(err)
					}
					const limit = 8 << 10 // a few of these small sessions
					if capped {
						if err := s.SetSessionMemory(limit); err != nil {
							t.Fatal(err)
						}
					}
					if err := s.SetSessionMemory(-1); err == nil {
						t.Fatal("a negative session memory was taken")
					}
					const sessions = 64
					hot := seqIDs(1, 40)
					wbTurn(t, s, "hot", hot, true)
					for i := range sessions {
						wbTurn(t, s, fmt.Sprintf("idle-%d", i), seqIDs(uint32(1000*i+1), 20+i%7), true)
						if i%2 == 0 { // the hot chat goes on meanwhile
							hot = append(hot, seqIDs(uint32(500000+i), 6)...)
							wbTurn(t, s, "hot", hot, true)
						}
					}
					if err := s.barrier(ctx); err != nil { // window mode: the batches that shed
						t.Fatal(err)
					}
					st := s.WriteBehindStats()
					if capped && (st.Shed == 0 || st.Held >= sessions/2) {
						t.Fatalf("capped at %d bytes: memory holds %d sessions, %d dropped", limit, st.Held, st.Shed)
					}
					if !capped && (st.Shed != 0 || st.Held < sessions) {
						t.Fatalf("no cap: memory holds %d sessions, %d dropped", st.Held, st.Shed)
					}
					// The hot chat's turns were answered from memory.
					slowBefore := st.Slow[0][SlowNotInMemory]
					for range 5 {
						hot = append(hot, seqIDs(uint32(900000+len(hot)), 6)...)
						wbTurn(t, s, "hot", hot, true)
					}
					if n := s.WriteBehindStats().Slow[0][SlowNotInMemory] - slowBefore; n != 0 {
						t.Fatalf("%d of the hot chat's plans were not answered from memory", n)
					}
					// Every session plans what it holds, from SQL if dropped.
					for i := range sessions {
						ids := seqIDs(uint32(1000*i+1), 20+i%7)
						p, err := s.PlanSession(ctx, PlanInput{Session: fmt.Sprintf("idle-%d", i), Model: "m", TokenIDs: append(ids, 7), Dir: "/kv-sessions",
							Pool: "perf", ChunkSize: 1 << 20, PlanTTL: 0, Now: now, Place: wbPlace, Quota: 1 << 30})
						if err != nil {
							t.Fatal(err)
						}
						if want := int64(len(ids)); p.Cached != want {
							t.Fatalf("idle-%d: plan caches %d tokens, it stored %d", i, p.Cached, want)
						}
					}
				})
			}
		}
	}
}

// TestSessionPropertyMemoryCap is TestSessionPropertyWindow with the
// leader's memory capped at a few sessions, so that entries are dropped
// and loaded again all the time.
func TestSessionPropertyMemoryCap(t *testing.T) {
	propertyRuns(t, windowEngines(t), 120, 9, false, func(t *testing.T, s Store) {
		if err := s.(SessionMemorySetter).SetSessionMemory(6 << 10); err != nil {
			t.Fatal(err)
		}
	}, func(t *testing.T, s Store) {
		if st := s.(*sqlStore).WriteBehindStats(); st.Shed == 0 {
			t.Fatalf("no session was dropped from memory: %+v", st)
		}
	})
}

// TestShedDropsFilesOfSessionsNotHeld: past the cap, shed drops the files
// of owners memory does not hold as well as its victims' (a fork's ranges
// load its parent's file; the parent may never be loaded itself), so no
// file outlives the cap. Memory only: such a file is loaded again when a
// plan needs it.
func TestShedDropsFilesOfSessionsNotHeld(t *testing.T) {
	c := &sessionCache{on: true}
	c.reset()
	for i := range 64 {
		id := fmt.Sprintf("s%d", i)
		c.sessions[id] = &cachedSession{lastUsed: int64(i)}
		c.files["/kv/"+id] = &cachedFile{owner: id}
		c.owned[id] = []string{"/kv/" + id}
	}
	c.files["/kv/parent"] = &cachedFile{owner: "parent"}
	c.owned["parent"] = []string{"/kv/parent"}
	if n := c.shed(8<<10, nil); n == 0 || len(c.sessions) == 64 {
		t.Fatalf("shed dropped %d of 64 sessions", n)
	}
	for owner := range c.owned {
		if _, ok := c.sessions[owner]; !ok {
			t.Errorf("owned lists files of %s, which memory does not hold", owner)
		}
	}
	for p, f := range c.files {
		if _, ok := c.sessions[f.owner]; !ok {
			t.Errorf("file %s of %s, which memory does not hold, stays", p, f.owner)
		}
	}
	if len(c.files) != len(c.sessions) {
		t.Fatalf("%d files for %d sessions held", len(c.files), len(c.sessions))
	}
}

// TestIDFilter: every id added is found; of ids never added, about 1 % at
// the filter's capacity; a full filter starts again.
func TestIDFilter(t *testing.T) {
	var f idFilter
	if f.has("x") {
		t.Fatal("an empty filter has x")
	}
	for i := range idFilterCap {
		f.add(fmt.Sprint("s-", i))
	}
	for i := range idFilterCap {
		if !f.has(fmt.Sprint("s-", i)) {
			t.Fatalf("s-%d added, not found", i)
		}
	}
	fp := 0
	for i := range 10000 {
		if f.has(fmt.Sprint("other-", i)) {
			fp++
		}
	}
	if fp > 300 {
		t.Fatalf("%d of 10,000 ids never added found", fp)
	}
	f.add("next") // full: starts again
	if f.n != 1 || !f.has("next") {
		t.Fatalf("a full filter after one more id: %d ids", f.n)
	}
}
