package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/kvlayout"
)

// turnMessages are the four messages of a chat turn built from the fuzzed
// values: a string, a float, an integer, a time and a count.
func turnMessages(s string, f float64, n int64, t time.Time, k uint8) (PlanRequest, CommitSessionRequest, Plan, Session, EnginePlan) {
	cnt := int(k % 5)
	ids := make([]uint32, cnt*7)
	for i := range ids {
		ids[i] = uint32(n) * uint32(i+1)
	}
	var strs []string
	var ranges []KVRange
	for i := range cnt {
		strs = append(strs, fmt.Sprint(s, i))
		ranges = append(ranges, KVRange{TokenStart: n * int64(i), TokenLength: -n, KVURI: s, KVStart: int64(i), KVLength: n ^ int64(i)})
	}
	if k&8 != 0 {
		strs, ranges = []string{}, []KVRange{}
	}
	req := PlanRequest{Model: s, Prefixes: strs, PromptTokens: n, TokenIDs: ids, UnsafeCountOnly: k&16 != 0, DecodeTokens: -n,
		NewFile: k&32 != 0, Format: s, LoadThreshold: n / 3}
	if k&64 != 0 {
		req.TokenIDs, req.BlockHashes = nil, kvlayout.BlockHashes(ids, 2)
	}
	if k&128 != 0 {
		req.Flags = map[string]any{"a": true}
	}
	commit := CommitSessionRequest{PlanID: n, Written: k&16 != 0}
	if k&32 != 0 {
		commit.Fresh = &ranges
	}
	var files []File
	if k&2 != 0 {
		var reps []Replica
		for i := range cnt {
			reps = append(reps, Replica{Server: s, Addr: fmt.Sprint(i), Up: i%2 == 0})
		}
		files = []File{{ID: n, Path: s, IsDir: k&4 != 0, Pool: s, ChunkSize: n, Size: -n, Sealed: k&16 != 0, CommitRecordsSize: n&1 != 0, Modified: t,
			Chunks: []Chunk{{Index: n, ID: uint64(n) * 3, Length: n, Replicas: reps}, {}}}}
		if k&128 != 0 {
			files[0].Attrs = map[string]string{"a": s}
		}
	}
	plan := Plan{PlanID: n, Stored: ranges, Fresh: ranges, CachedTokens: n, VerifiedTokens: -n, Shortened: s, ShortenedTokens: n % 7,
		PrefillTokens: n, DecodeTokens: n, LoadBytes: n, HitRate: f, Evicted: strs, FreshFiles: files}
	sess := Session{ID: s, Model: s, Tokens: n, Bytes: -n, LastUsed: t, Created: t.Add(-time.Hour), Ranges: ranges, HashedTokens: n}
	eng := EnginePlan{KVCacheParams: KVCacheParams{ID: s, Stored: ranges, Fresh: ranges, LoadThreshold: n / 5}, PlanID: n, CachedTokens: n,
		VerifiedTokens: n, Shortened: s, ShortenedTokens: n % 3, PrefillTokens: -n, DecodeTokens: n, LoadBytes: n, HitRate: f, Evicted: strs}
	if k&128 != 0 {
		eng.KVCacheParams.Flags = map[string]any{"a": 1.0}
	}
	return req, commit, plan, sess, eng
}

// FuzzPlainEncode: whatever the hand encoders of plainenc.go write is
// byte for byte what encoding/json writes for the same message (they may
// decline, leaving it to encoding/json). The seeds run in every `go test`;
// `go test -fuzz FuzzPlainEncode ./internal/api` explores.
func FuzzPlainEncode(f *testing.F) {
	f.Add("gd2fs://local/kv-sessions/s1/kv-1", 0.9, int64(1037), int64(1764659559259015233), uint8(0xff))
	f.Add("gd2fs://local/kv-sessions/s1/kv-1", 0.9, int64(1037), int64(1764659559259015233), uint8(2|4|16|32|64))
	f.Add("gd2fs://local/kv-sessions/s1/kv-1", 0.25, int64(-5), int64(-1), uint8(2|3|8))
	for i, s := range []string{"", "a", `a"b`, `a\b`, "a<b", "a&b", "é", "\x7f", "\x01", "\xff"} {
		f.Add(s, []float64{0, 1, 1e-6, 1e-7, 1e21, 123456789.125, math.Copysign(0, -1), math.Inf(1), math.NaN(), 0.5}[i], int64(i)*-77, int64(i)<<40, uint8(i*29))
	}
	f.Fuzz(func(t *testing.T, s string, fl float64, n, nanos int64, k uint8) {
		tm := time.Unix(0, nanos).UTC()
		if k&1 != 0 {
			tm = tm.In(time.FixedZone("x", int(n%50000)))
		}
		req, commit, plan, sess, eng := turnMessages(s, fl, n, tm, k)
		check := func(name string, v any, got []byte, ok bool) {
			want, err := json.Marshal(v)
			if ok && (err != nil || !bytes.Equal(got, want)) {
				t.Fatalf("%s: encoding/json writes %s (%v), the hand encoder %s", name, want, err, got)
			}
		}
		b, ok := appendRequest(nil, req)
		check("plan request", req, b, ok)
		b, ok = appendRequest(nil, commit)
		check("commit request", commit, b, ok)
		b, ok = AppendPlanJSON(nil, &plan)
		check("plan", plan, b, ok)
		b, ok = AppendSessionJSON(nil, &sess)
		check("session", sess, b, ok)
		b, ok = AppendEnginePlanJSON(nil, &eng)
		check("engine plan", eng, b, ok)
		// Batches, as a client coalesces them and the master answers.
		pb := PlanBatchRequest{Plans: []PlanBatchItem{{Session: s, RequestID: s, Plan: req}, {Session: "a", Plan: req}}}
		if k&4 != 0 {
			pb.Plans = pb.Plans[:0]
		}
		b, ok = appendRequest(nil, pb)
		check("plan batch", pb, b, ok)
		cb := CommitBatchRequest{Commits: []CommitBatchItem{{Session: s, PlanID: n, Written: k&16 != 0}, {Session: "b", PlanID: -n}}}
		if commit.Fresh != nil { // an engine's commit (a router's coalesced CommitSaved)
			cb.Commits = append(cb.Commits, CommitBatchItem{Session: s, PlanID: n, Fresh: commit.Fresh})
		}
		b, ok = appendRequest(nil, cb)
		check("commit batch", cb, b, ok)
		e := &Error{Error: s, Code: "bad_request"}
		raw, okP := AppendPlanJSON(nil, &plan)
		pa := PlanBatchAnswer{Plans: []PlanBatchResult{{Error: e}}}
		if okP {
			pa.Plans = append(pa.Plans, PlanBatchResult{Plan: raw})
		}
		b, ok = AppendPlanBatchAnswerJSON(nil, &pa)
		check("plan batch answer", pa, b, ok)
		ca := CommitBatchAnswer{Commits: []CommitBatchResult{{Session: &sess}, {Error: e}}}
		if k&8 != 0 {
			ca.Commits = ca.Commits[:0]
		}
		b, ok = AppendCommitBatchAnswerJSON(nil, &ca)
		check("commit batch answer", ca, b, ok)
	})
}

// TestPlainEncodeTakesTurns: a chat turn's messages, in the form the
// master and the client make them, are written by hand (a change that sent
// them all to encoding/json would pass FuzzPlainEncode and lose the gain).
func TestPlainEncodeTakesTurns(t *testing.T) {
	req, commit, plan, sess, eng := turnMessages("gd2fs://local/kv-sessions/s1/kv-1", 0.9, 1037, time.Now(), 2|32|4)
	if _, ok := appendRequest(nil, req); !ok {
		t.Error("a plan request is not written by hand")
	}
	if _, ok := appendRequest(nil, commit); !ok {
		t.Error("a commit request is not written by hand")
	}
	if _, ok := AppendPlanJSON(nil, &plan); !ok {
		t.Error("a plan is not written by hand")
	}
	if _, ok := AppendSessionJSON(nil, &sess); !ok {
		t.Error("a session is not written by hand")
	}
	if _, ok := AppendEnginePlanJSON(nil, &eng); !ok {
		t.Error("an engine plan is not written by hand")
	}
	req.Format = "" // what a batch holds
	if _, ok := appendRequest(nil, PlanBatchRequest{Plans: []PlanBatchItem{{Session: "s", RequestID: "r", Plan: req}}}); !ok {
		t.Error("a plan batch is not written by hand")
	}
	if _, ok := appendRequest(nil, CommitBatchRequest{Commits: []CommitBatchItem{{Session: "s", PlanID: 1, Written: true}}}); !ok {
		t.Error("a commit batch is not written by hand")
	}
	if _, ok := appendRequest(nil, CommitBatchRequest{Commits: []CommitBatchItem{{Session: "s", PlanID: 1, Fresh: commit.Fresh}}}); !ok || commit.Fresh == nil {
		t.Error("a commit batch of engine commits is not written by hand")
	}
	raw, _ := AppendPlanJSON(nil, &plan)
	if _, ok := AppendPlanBatchAnswerJSON(nil, &PlanBatchAnswer{Plans: []PlanBatchResult{{Plan: raw}, {Error: &Error{Error: "e", Code: "not_found"}}}}); !ok {
		t.Error("a plan batch answer is not written by hand")
	}
	if _, ok := AppendCommitBatchAnswerJSON(nil, &CommitBatchAnswer{Commits: []CommitBatchResult{{Session: &sess}, {Error: &Error{Error: "e", Code: "not_found"}}}}); !ok {
		t.Error("a commit batch answer is not written by hand")
	}
}

// BenchmarkPlanRequestEncode writes the plan request of a chat of 2,000
// tokens, by json.Marshal (the reference, what the client did before) and
// by hand, and reports the ratio.
//
//	go test -run '^$' -bench PlanRequestEncode ./internal/api
func BenchmarkPlanRequestEncode(b *testing.B) {
	ids := make([]uint32, 2000)
	for i := range ids {
		ids[i] = uint32(i*7919) % 128000
	}
	req := PlanRequest{Model: "meta-llama/Llama-3.1-8B", TokenIDs: ids, DecodeTokens: 256}
	var ref time.Duration
	b.Run("encoding-json", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			if _, err := json.Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
		ref = time.Since(start) / time.Duration(b.N)
	})
	b.Run("by-hand", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			if _, ok := appendRequest(nil, req); !ok {
				b.Fatal("not plain")
			}
		}
		if ref > 0 {
			b.ReportMetric(float64(time.Since(start)/time.Duration(b.N))/float64(ref), "x-encoding-json")
		}
	})
}
