package kvtrace

import (
	"bytes"
	"strings"
	"testing"
)

func reqs(chains ...[]int64) []Request {
	var out []Request
	for i, c := range chains {
		out = append(out, Request{Timestamp: int64(i), InputLength: int64(len(c)) * BlockTokens, HashIDs: c})
	}
	return out
}

// Hand-computed: capacity 2.
//
//	[1 2]  miss miss            LRU: 2 1        hits 0
//	[1 3]  hit, miss (evict 2)  LRU: 3 1        hits 1
//	[1 2]  hit, miss (evict 3)  LRU: 2 1        hits 1
//	[3]    miss (evict 1)                       hits 0
//
// 2 prefix hits of 7 blocks.
func TestLRUHandComputed(t *testing.T) {
	r := LRU(reqs([]int64{1, 2}, []int64{1, 3}, []int64{1, 2}, []int64{3}), 2)
	if r.Blocks != 7 || r.PrefixHit != 2 {
		t.Fatalf("got %+v, want 2 of 7", r)
	}
}

// A hit after a miss in the same request is not a prefix hit.
func TestPrefixRunStopsAtFirstMiss(t *testing.T) {
	r := LRU(reqs([]int64{1, 2, 3}, []int64{9, 2, 3}), 10)
	if r.PrefixHit != 0 {
		t.Fatalf("got %d prefix hits, want 0", r.PrefixHit)
	}
	r = Belady(reqs([]int64{1, 2, 3}, []int64{9, 2, 3}), 10)
	if r.PrefixHit != 0 {
		t.Fatalf("Belady: got %d prefix hits, want 0", r.PrefixHit)
	}
}

// Hand-computed: capacity 2, same trace as above. Belady admits 1, 2; at
// [1 3] block 3's next use (access 6) is after 2's (access 4), so 3 is not
// admitted; [1 2] hits twice; [3] misses.
//
// 3 prefix hits of 7 blocks, one more than LRU.
func TestBeladyHandComputed(t *testing.T) {
	r := Belady(reqs([]int64{1, 2}, []int64{1, 3}, []int64{1, 2}, []int64{3}), 2)
	if r.Blocks != 7 || r.PrefixHit != 3 {
		t.Fatalf("got %+v, want 3 of 7", r)
	}
}

// Belady never admits a block with no next use, and evicts the furthest.
func TestBeladyEvictsFurthest(t *testing.T) {
	// cap 2: [1] [2] [3] [2] [1]: at 3, next uses: 1 → 4, 2 → 3, 3 → never:
	// 3 is not admitted; 2 and 1 hit.
	r := Belady(reqs([]int64{1}, []int64{2}, []int64{3}, []int64{2}, []int64{1}), 2)
	if r.PrefixHit != 2 {
		t.Fatalf("got %d hits, want 2", r.PrefixHit)
	}
	// LRU on the same: 3 evicts 1, 2 hits, 1 misses.
	if r := LRU(reqs([]int64{1}, []int64{2}, []int64{3}, []int64{2}, []int64{1}), 2); r.PrefixHit != 1 {
		t.Fatalf("LRU: got %d hits, want 1", r.PrefixHit)
	}
}

func TestReadWriteRoundTrip(t *testing.T) {
	in := Generate(GenConfig{Seed: 3, Requests: 50, SystemPrompts: 2, SystemBlocks: 2, OneOffFraction: 0.3,
		MeanTurns: 3, UserBlocks: 2, OutputBlocks: 1, OneOffBlocks: 3, MeanThinkMillis: 1000, SessionsPerSec: 5})
	if len(in) != 50 {
		t.Fatalf("generated %d requests, want 50", len(in))
	}
	var buf bytes.Buffer
	if err := Write(&buf, in); err != nil {
		t.Fatal(err)
	}
	out, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) || out[7].Timestamp != in[7].Timestamp || len(out[7].HashIDs) != len(in[7].HashIDs) {
		t.Fatal("round trip changed the trace")
	}
	for i := 1; i < len(in); i++ {
		if in[i].Timestamp < in[i-1].Timestamp {
			t.Fatal("trace not sorted by time")
		}
	}
}

func TestReadPublicFormatAndErrors(t *testing.T) {
	got, err := Read(strings.NewReader(`{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}` + "\n\n" +
		`{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47]}` + "\n"))
	if err != nil || len(got) != 2 || got[0].HashIDs[2] != 2353 {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, bad := range []string{
		`{"timestamp": 1, "hash_ids": [1,`,
		`{"timestamp": 1, "input_length": -5, "hash_ids": [1]}`,
		`{"timestamp": 1, "hash_ids": "x"}`,
	} {
		if _, err := Read(strings.NewReader("{}\n" + bad)); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: got %v, want an error naming line 2", bad, err)
		}
	}
}

// ciTrace is small enough for CI: 1500 requests, a few seconds with -race.
func ciTrace() []Request {
	g := DefaultGen()
	g.Requests = 1500
	g.SessionsPerSec = 20
	g.MeanThinkMillis = 20000
	return Generate(g)
}

// TestReplayAgainstReferences replays a small synthetic multi-turn trace
// through gd2fs's store, LRU and Belady at 10% and 25% of the distinct
// blocks. Belady is a ceiling for both; the store must keep at least LRU's
// prefix hits (on this memoryless synthetic traffic LRU is close to the best
// an online policy can do, and the store's "auto" policy runs LRU when its
// miniature simulations say so; see docs/kv-cache.md).
func TestReplayAgainstReferences(t *testing.T) {
	rs := ciTrace()
	d := Distinct(rs)
	for _, f := range []float64{0.10, 0.25} {
		c := int(float64(d) * f)
		l, b := LRU(rs, c), Belady(rs, c)
		s, err := Store(rs, c, 4096)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%.0f%% of %d blocks: gd2fs %.4f LRU %.4f Belady %.4f (gd2fs/LRU %.3f)", f*100, d, s.Ratio(), l.Ratio(), b.Ratio(), s.Ratio()/l.Ratio())
		if s.Blocks != l.Blocks || b.Blocks != l.Blocks {
			t.Fatalf("block counts differ: %d %d %d", s.Blocks, l.Blocks, b.Blocks)
		}
		if b.Ratio() < l.Ratio() || b.Ratio() < s.Ratio() {
			t.Errorf("Belady %.4f below LRU %.4f or gd2fs %.4f", b.Ratio(), l.Ratio(), s.Ratio())
		}
		if s.PrefixHit < l.PrefixHit {
			t.Errorf("gd2fs %.4f (%d blocks) is below LRU %.4f (%d)", s.Ratio(), s.PrefixHit, l.Ratio(), l.PrefixHit)
		}
	}
}

func TestParseGen(t *testing.T) {
	c, err := ParseGen(DefaultGen(), "requests=10, mean_think_ms=500,one_off_fraction=0.2")
	if err != nil || c.Requests != 10 || c.MeanThinkMillis != 500 || c.OneOffFraction != 0.2 {
		t.Fatalf("got %+v, %v", c, err)
	}
	for _, bad := range []string{"requests", "bogus=1", "requests=-1", "one_off_fraction=2", "sessions_per_sec=0", "requests=x"} {
		if _, err := ParseGen(DefaultGen(), bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// FuzzRead: any bytes give a trace or an error, never a panic, and a trace
// read back after Write is the same.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`))
	f.Add([]byte("{}\n\n{\"hash_ids\":[]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, err := Read(bytes.NewReader(b))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := Write(&buf, rs); err != nil {
			t.Fatal(err)
		}
		again, err := Read(&buf)
		if err != nil || len(again) != len(rs) {
			t.Fatalf("round trip: %d → %d, %v", len(rs), len(again), err)
		}
	})
}
