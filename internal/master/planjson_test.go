package master

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/kvlayout"
)

// FuzzPlanWire: a plan request (or a batch of them, a commit request or a
// batch of them)
// decodes through the hand parsers of planjson.go exactly as through
// encoding/json: the same
// request, or an error where it gave one. The seeds run in every `go test`;
// `go test -fuzz FuzzPlanWire ./internal/master` explores.
func FuzzPlanWire(f *testing.F) {
	h := kvlayout.BlockHashes([]uint32{1, 2, 3, 4, 5}, 2)
	for _, s := range []string{
		`{"model":"m","token_ids":[1,2,3]}`,
		`{"model":"m","token_ids":[]}`,
		`{"model":"m","token_ids":[ 0 , 4294967295 ]}`,
		`{"model":"m","token_ids":[4294967296]}`,
		`{"model":"m","token_ids":[01]}`,
		`{"model":"m","token_ids":[-1]}`,
		`{"model":"m","token_ids":[1.0]}`,
		`{"model":"m","token_ids":[1e2]}`,
		`{"model":"m","token_ids":[1,]}`,
		`{"model":"m","token_ids":[,1]}`,
		`{"model":"m","token_ids":["1"]}`,
		`{"model":"m","token_ids":null}`,
		`{"model":"m","token_ids":[1],"token_ids":[2,3]}`,
		`{"model":"m","block_hashes":["` + h[0].String() + `","` + h[1].String() + `"]}`,
		`{"model":"m","block_hashes":["` + strings.ToUpper(h[2].String()) + `"]}`,
		`{"model":"m","block_hashes":["\u0030` + h[0].String()[1:] + `"]}`,
		`{"model":"m","block_hashes":["` + h[0].String()[2:] + `"]}`,
		`{"model":"m","block_hashes":["` + h[0].String() + `",]}`,
		`{"model":"m","block_hashes":[]}`,
		`{"model":"m","block_hashes":[1]}`,
		`{"model":"m","prompt_tokens":3,"decode_tokens":4,"prefixes":["/p"],"flags":{"a":1},"bogus":1}`,
		`{"plans":[{"session":"a","plan":{"model":"m","token_ids":[7,8]}}]}`,
		`{"plans":[{"session":"a","request_id":"r","plan":{"model":"m","token_ids":[7,08]}}]}`,
		`{"model":"m","prefixes":["/p","gd2fs://local/p"],"prompt_tokens":-3,"token_ids":[1],"unsafe_count_only":true,"decode_tokens":4,"new_file":false,"format":"vllm","load_threshold":9}`,
		`{"model":"m","prefixes":[]}`, `{"model":"m","prefixes":null}`, `{"model":"m","prefixes":["a",]}`, `{"model":"m\u0041"}`,
		`{"model":"m","MODEL":"n"}`, `{"model":"m","model":"n"}`, `{"model":"m"} {}`, `{"model":"m"}x`, `{"model":"m","token_ids":[1,[2]]}`,
		`{"model":"m","token_ids":[1]]}`, `{"model":"m","block_hashes":["]"]}`, `{"model":"m","new_file":1}`, `{"model":"m","flags":{"a":true}}`,
		`{"plan_id":7,"written":true}`, `{"plan_id":7,"written":null}`, `{"plan_id":7,"fresh_kvcache":[]}`, `{"plan_id":7,"fresh_kvcache":null}`,
		`{"fresh_kvcache":[{"token_start":0,"token_length":16,"kv_uri":"gd2fs://local/kv-sessions/a/kv-1","kv_start":0,"kv_length":4096}]}`,
		`{"fresh_kvcache":[{"token_start":0,"bogus":1}]}`, `{"kvcache_params":{"id":"a","fresh_kvcache":[],"x":1}}`, `{"plan_id":7,"plan_id":8}`,
		// Batches as a client coalesces them (planBatchWire's hand decoder).
		`{"plans":[]}`, `{"plans":null}`, `{"plans":[{}]}`, `{"plans":[{"session":"a","session":"b"}]}`, `{"plans":[{"plan":null}]}`,
		`{"plans":[{"session":"a","request_id":"r1","plan":{"model":"m","token_ids":[1,2]}},{"session":"b","request_id":"r2","plan":{"model":"m","block_hashes":["` + h[0].String() + `"]}}]}`,
		`{"plans":[{"session":"a","plan":{"model":"m","flags":{"a":1}}}]}`, `{"plans":[{"session":"a","plan":{"model":"m"},"x":1}]}`,
		`{"plans":[{"session":"a","plan":{"model":"m"}}],"plans":[]}`, `{"PLANS":[{"session":"a","plan":{"model":"m"}}]}`,
		`{"plans":[{"session":"a","plan":{"model":"m","token_ids":[1]}},]}`,
		// Batches of commits, plain and an engine's (commitBatchWire's hand decoder).
		`{"commits":[{"session":"a","plan_id":7,"written":true},{"session":"b","plan_id":8,"fresh_kvcache":[{"token_start":0,"token_length":16,"kv_uri":"gd2fs://local/kv-sessions/b/kv-1","kv_start":0,"kv_length":4096}]}]}`,
		`{"commits":[{"session":"a","fresh_kvcache":[]}]}`, `{"commits":[{"session":"a","fresh_kvcache":null}]}`, `{"commits":[]}`, `{"commits":null}`,
		`{"commits":[{"session":"a","fresh_kvcache":[],"fresh_kvcache":[]}]}`, `{"commits":[{"session":"a","kvcache_params":{}}]}`,
		`{"commits":[{"session":"a","fresh_kvcache":[{"kv_uri":"u","x":1}]}]}`, `{"commits":[{"session":"a"},]}`, `{"COMMITS":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want api.PlanRequest
		var got planWire
		errW, errG := decodeStrict(b, &want), decodeStrict(b, &got)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, planWire %v", b, errW, errG)
		}
		if errW == nil && !reflect.DeepEqual(want, got.request()) {
			t.Fatalf("%q: encoding/json decodes %+v, planWire %+v", b, want, got.request())
		}
		var wantB api.PlanBatchRequest
		var gotB planBatchWire
		errW, errG = decodeStrict(b, &wantB), decodeStrict(b, &gotB)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, planBatchWire %v", b, errW, errG)
		}
		if errW == nil && !reflect.DeepEqual(wantB, gotB.request()) {
			t.Fatalf("%q: encoding/json decodes %+v, planBatchWire %+v", b, wantB, gotB.request())
		}
		var wantC api.CommitSessionRequest
		var gotC commitWire
		errW, errG = decodeStrict(b, &wantC), decodeStrict(b, &gotC)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, commitWire %v", b, errW, errG)
		}
		if errW == nil && !reflect.DeepEqual(wantC, gotC.CommitSessionRequest) {
			t.Fatalf("%q: encoding/json decodes %+v, commitWire %+v", b, wantC, gotC.CommitSessionRequest)
		}
		var wantCB api.CommitBatchRequest
		var gotCB commitBatchWire
		errW, errG = decodeStrict(b, &wantCB), decodeStrict(b, &gotCB)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, commitBatchWire %v", b, errW, errG)
		}
		if errW == nil && !reflect.DeepEqual(wantCB, gotCB.CommitBatchRequest) {
			t.Fatalf("%q: encoding/json decodes %+v, commitBatchWire %+v", b, wantCB, gotCB.CommitBatchRequest)
		}
	})
}

// BenchmarkPlanDecode decodes the plan request of a chat of 2,000 tokens,
// by encoding/json (the reference) and by planWire, and reports the ratio.
//
//	go test -run '^$' -bench PlanDecode ./internal/master
func BenchmarkPlanDecode(b *testing.B) {
	ids := make([]uint32, 2000)
	for i := range ids {
		ids[i] = uint32(i*7919) % 128000
	}
	body, err := json.Marshal(api.PlanRequest{Model: "meta-llama/Llama-3.1-8B", TokenIDs: ids, DecodeTokens: 256})
	if err != nil {
		b.Fatal(err)
	}
	hashes, err := json.Marshal(api.PlanRequest{Model: "meta-llama/Llama-3.1-8B", BlockHashes: kvlayout.BlockHashes(ids, 16)})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		body []byte
	}{{"token_ids", body}, {"block_hashes", hashes}} {
		var ref, wire float64
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			for b.Loop() {
				var r api.PlanRequest
				if err := decodeStrict(c.body, &r); err != nil {
					b.Fatal(err)
				}
			}
			ref = float64(b.Elapsed()) / float64(b.N)
		})
		b.Run(c.name+"/planWire", func(b *testing.B) {
			for b.Loop() {
				var r planWire
				if err := decodeStrict(c.body, &r); err != nil {
					b.Fatal(err)
				}
			}
			wire = float64(b.Elapsed()) / float64(b.N)
		})
		if wire > 0 {
			fmt.Printf("BenchmarkPlanDecode %s: planWire takes %.2fx encoding/json's time (%d-byte body)\n", c.name, wire/ref, len(c.body))
		}
	}
}

// allocated is the bytes f allocates, the least of a few runs of it.
// MemStats counts the whole process's allocations, and a goroutine an
// earlier test left (an idle keep-alive connection of its HTTP client,
// one still shutting down on a loaded machine) can allocate a few KiB in
// the middle of one run: as much as encoding/json's whole 1.5 KiB for a
// body it refuses at its first byte, so one run's count made
// TestPlanWireCommasAllocateNothing flaky. Such noise only adds, and a
// decoder that allocates for a bad body does so every run, so the least
// run is f's own. f must start afresh each run (a new value to decode
// into: a failed decode may leave fields set, and decodeStrict takes the
// hand path only into a zero value).
func allocated(f func()) uint64 {
	least := uint64(math.MaxUint64)
	for range 3 {
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		f()
		runtime.ReadMemStats(&b)
		least = min(least, b.TotalAlloc-a.TotalAlloc)
	}
	return least
}

// TestPlanWireCommasAllocateNothing: the hand parsers size their lists by
// counting commas; a bad body of commas (inside a string, or alone) must
// not make them allocate for each before they give up and encoding/json
// refuses the body (found in review: 84 MiB for a 4 MiB body, against
// encoding/json's 20).
func TestPlanWireCommasAllocateNothing(t *testing.T) {
	for name, body := range map[string][]byte{
		"hashes": []byte(`{"model":"m","block_hashes":["` + strings.Repeat(",", 4<<20-64) + `"]}`),
		"ids":    []byte(`{"model":"m","token_ids":[` + strings.Repeat(",", 4<<20-64) + `]}`),
	} {
		refN := allocated(func() {
			if decodeStrict(body, new(api.PlanRequest)) == nil {
				t.Fatalf("%s: encoding/json took a bad body", name)
			}
		})
		wireN := allocated(func() {
			if decodeStrict(body, new(planWire)) == nil {
				t.Fatalf("%s: the plan decoder took a bad body", name)
			}
		})
		if wireN > 2*refN {
			t.Errorf("%s: the plan decoder allocated %d MiB for a bad %d-byte body that encoding/json refuses with %d MiB", name, wireN>>20, len(body), refN>>20)
		}
	}
}

// TestPlainRequestsByHand: the requests a chat turn sends (a plan with
// token ids or block hashes, a commit) take the hand decoders — a change
// that sent them all to encoding/json would pass FuzzPlanWire and lose the
// gain — and decode to what was sent.
func TestPlainRequestsByHand(t *testing.T) {
	ids := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
	saved := []api.KVRange{{TokenStart: 16, TokenLength: 16, KVURI: "gd2fs://local/kv-sessions/a/kv-1", KVStart: 4096, KVLength: 4096}}
	for _, c := range []struct {
		in  any
		out plainDecoder
	}{
		{api.PlanRequest{Model: "m", TokenIDs: ids, DecodeTokens: 4, Prefixes: []string{"/p"}}, new(planWire)},
		{api.PlanRequest{Model: "m", BlockHashes: kvlayout.BlockHashes(ids, 16), Format: "vllm", LoadThreshold: 2}, new(planWire)},
		{api.CommitSessionRequest{PlanID: 7, Written: true}, new(commitWire)},
		{api.CommitSessionRequest{PlanID: 7, Fresh: &saved}, new(commitWire)},
		{api.PlanBatchRequest{Plans: []api.PlanBatchItem{{Session: "a", RequestID: "r", Plan: api.PlanRequest{Model: "m", TokenIDs: ids}},
			{Session: "b", Plan: api.PlanRequest{Model: "m", BlockHashes: kvlayout.BlockHashes(ids, 16)}}}}, new(planBatchWire)},
		{api.CommitBatchRequest{Commits: []api.CommitBatchItem{{Session: "a", PlanID: 7, Written: true}, {Session: "b", PlanID: 8, Fresh: &saved}}}, new(commitBatchWire)},
	} {
		b, err := json.Marshal(c.in)
		if err != nil {
			t.Fatal(err)
		}
		if !c.out.decodePlain(b) {
			t.Fatalf("%s is not decoded by hand", b)
		}
		var got any
		switch w := c.out.(type) {
		case *planWire:
			got = w.request()
		case *commitWire:
			got = w.CommitSessionRequest
		case *planBatchWire:
			got = w.request()
		case *commitBatchWire:
			got = w.CommitBatchRequest
		}
		if !reflect.DeepEqual(got, c.in) {
			t.Fatalf("%s decoded by hand as %+v", b, got)
		}
	}
}

// TestPlainAnswerAsEncoder: writeJSON's hand-written plan and session
// answers are the bytes json.Encoder wrote for them, newline included,
// and other answers are left to it.
func TestPlainAnswerAsEncoder(t *testing.T) {
	now := time.Now()
	rs := []api.KVRange{{TokenStart: 0, TokenLength: 16, KVURI: "gd2fs://local/kv-sessions/a/kv-1", KVStart: 0, KVLength: 4096}}
	for _, v := range []any{
		api.Plan{PlanID: 3, Stored: rs, Fresh: rs, HitRate: 0.5, FreshFiles: []api.File{{ID: 1, Path: "/kv-sessions/a/kv-1", Modified: now,
			Chunks: []api.Chunk{{ID: 9, Replicas: []api.Replica{{Server: "s0", Addr: "127.0.0.1:1", Up: true}}}}}}},
		api.Session{ID: "a", Model: "m", Tokens: 16, LastUsed: now, Created: now, Ranges: rs},
		api.EnginePlan{KVCacheParams: api.KVCacheParams{ID: "a", Stored: rs, Fresh: []api.KVRange{}}, PlanID: 4, HitRate: 1},
	} {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(v); err != nil {
			t.Fatal(err)
		}
		got, ok := plainAnswer(nil, v)
		if !ok || !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("%T written by hand as %q (%v), json.Encoder writes %q", v, got, ok, want.Bytes())
		}
	}
	if _, ok := plainAnswer(nil, api.Error{Error: "x", Code: "y"}); ok {
		t.Fatal("an error answer was written by hand")
	}
}

// spyCommit records whether decodeStrict decoded a body by hand.
type spyCommit struct {
	commitWire
	byHand bool
}

func (s *spyCommit) decodePlain(b []byte) bool {
	s.byHand = s.commitWire.decodePlain(b)
	return s.byHand
}

// TestDecodeStrictByHand: readJSON's decoder hands a plain commit request
// to its hand decoder, and one it turns down (an unknown field) to
// encoding/json, which refuses it.
func TestDecodeStrictByHand(t *testing.T) {
	var s spyCommit
	if err := decodeStrict([]byte(`{"plan_id":7,"written":true}`), &s); err != nil || !s.byHand || s.PlanID != 7 || !s.Written {
		t.Fatalf("decoded %+v (by hand: %v), %v", s.commitWire, s.byHand, err)
	}
	s = spyCommit{}
	if err := decodeStrict([]byte(`{"plan_id":7,"writen":true}`), &s); err == nil || s.byHand {
		t.Fatalf("a misspelt field: by hand %v, error %v", s.byHand, err)
	}
}

// BenchmarkAnswerEncode writes a plan answer (with its fresh file) and a
// commit answer, by json.Encoder (the reference, what writeJSON did
// before) and by plainAnswer, and reports the ratio.
//
//	go test -run '^$' -bench AnswerEncode ./internal/master
func BenchmarkAnswerEncode(b *testing.B) {
	now := time.Now()
	rs := []api.KVRange{{TokenStart: 0, TokenLength: 1800, KVURI: "gd2fs://local/kv-sessions/s1/kv-1", KVStart: 0, KVLength: 460800}}
	fresh := []api.KVRange{{TokenStart: 1800, TokenLength: 200, KVURI: "gd2fs://local/kv-sessions/s1/kv-1", KVStart: 460800, KVLength: 51200}}
	for _, c := range []struct {
		name string
		v    any
	}{
		{"plan", api.Plan{PlanID: 1037, Stored: rs, Fresh: fresh, CachedTokens: 1800, VerifiedTokens: 1800, PrefillTokens: 200, LoadBytes: 460800, HitRate: 0.9,
			FreshFiles: []api.File{{ID: 2, Path: "/kv-sessions/s1/kv-1", Pool: "perf", ChunkSize: 16 << 20, Modified: now,
				Chunks: []api.Chunk{{ID: 3, Replicas: []api.Replica{{Server: "server-2", Addr: "127.0.0.1:46255", Up: true}}}}}}}},
		{"session", api.Session{ID: "s1", Model: "bench-small", Tokens: 2000, Bytes: 512000, LastUsed: now, Created: now, Ranges: rs, HashedTokens: 2000}},
	} {
		var ref, hand float64
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			var w bytes.Buffer
			for b.Loop() {
				w.Reset()
				if err := json.NewEncoder(&w).Encode(c.v); err != nil {
					b.Fatal(err)
				}
			}
			ref = float64(b.Elapsed()) / float64(b.N)
		})
		b.Run(c.name+"/by-hand", func(b *testing.B) {
			var w bytes.Buffer
			for b.Loop() {
				w.Reset()
				buf := answers.Get().(*answerBuf)
				out, ok := plainAnswer(buf.B[:0], c.v)
				if !ok {
					b.Fatal("not plain")
				}
				w.Write(out)
				buf.B = out[:0]
				answers.Put(buf)
			}
			hand = float64(b.Elapsed()) / float64(b.N)
		})
		if hand > 0 {
			fmt.Printf("BenchmarkAnswerEncode %s: by hand takes %.2fx json.Encoder's time\n", c.name, hand/ref)
		}
	}
}

// TestPlainListsAllocateLittle: a long list of small elements in a body
// broken at its end (found by a review of the hand decoders) costs the
// hand path no more than encoding/json, which checks the syntax before it
// builds anything: the hand path turns a document of more than
// fastjson.MaxElems elements down. Before: 337 MiB for a 4 MiB commit
// body against encoding/json's 15 MiB, 147 MiB for a plan's prefixes.
func TestPlainListsAllocateLittle(t *testing.T) {
	for _, c := range []struct {
		name      string
		body      []byte
		ref, wire func() any
	}{
		{"commit fresh_kvcache", []byte(`{"fresh_kvcache":[` + strings.Repeat(`{},`, (4<<20-64)/3) + `{}]`),
			func() any { return new(api.CommitSessionRequest) }, func() any { return new(commitWire) }},
		{"plan prefixes", []byte(`{"model":"m","prefixes":[` + strings.Repeat(`"",`, (4<<20-64)/3) + `""]`),
			func() any { return new(api.PlanRequest) }, func() any { return new(planWire) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			refN := allocated(func() {
				if decodeStrict(c.body, c.ref()) == nil {
					t.Fatal("encoding/json took a bad body")
				}
			})
			wireN := allocated(func() {
				if decodeStrict(c.body, c.wire()) == nil {
					t.Fatal("the hand decoder took a bad body")
				}
			})
			t.Logf("%d-byte body: encoding/json %d MiB, hand path %d MiB", len(c.body), refN>>20, wireN>>20)
			if wireN > 2*refN {
				t.Fatalf("the hand decoder allocated %d MiB for a bad %d-byte body that encoding/json refuses with %d MiB", wireN>>20, len(c.body), refN>>20)
			}
		})
	}
}

// TestReadJSONKeepsNoView: readJSON reads bodies into pooled buffers, so
// nothing a decoder answers may be a view of the body. Each body is decoded
// as readJSON decodes it, its buffer then scribbled over (as the next
// request would), and the value must still equal a decode of a copy of the
// body that nothing touched.
func TestReadJSONKeepsNoView(t *testing.T) {
	h := kvlayout.BlockHashes([]uint32{1, 2, 3, 4, 5}, 2)
	hs, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		body string
		v    func() any
	}{
		{`{"model":"m","prefixes":["p1"],"token_ids":[1,2,3],"format":"vllm"}`, func() any { return &planWire{} }},
		{`{"model":"m\u00e9","token_ids":[7,8]}`, func() any { return &planWire{} }}, // escapes: encoding/json
		{`{"model":"m","block_hashes":` + string(hs) + `}`, func() any { return &planWire{} }},
		{`{"plans":[{"session":"s1","request_id":"r1","plan":{"model":"m","token_ids":[4,5]}}]}`, func() any { return &planBatchWire{} }},
		{`{"plan_id":3,"written":true}`, func() any { return &commitWire{} }},
		{`{"commits":[{"session":"s2","plan_id":4,"fresh_kvcache":[{"token_start":0,"token_length":16,"kv_uri":"gd2fs://c/kv/s2","kv_start":0,"kv_length":4096}]}]}`, func() any { return &commitBatchWire{} }},
		{`{"model":"m","layers":2,"kv_heads":1,"head_dim":64,"dtype":"fp16","page_tokens":16}`, func() any { return &api.Layout{} }},
	}
	for _, c := range cases {
		got := c.v()
		r, err := http.NewRequest("POST", "/", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := readJSONInto(r, got, &buf); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		buf.Reset()
		room := buf.AvailableBuffer()[:buf.Available()]
		for i := range room {
			room[i] = 'x'
		}
		want := c.v()
		if err := decodeStrict([]byte(c.body), want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: decoded %+v, after its buffer was reused %+v", c.body, want, got)
		}
	}
}
