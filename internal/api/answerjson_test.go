package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// A plan answer as the master writes it, with every field set.
var planAnswer = `{"plan_id":1037,"stored_kv_cache":[{"token_start":0,"token_length":1800,"kv_uri":"gd2fs://local/kv-sessions/s1/kv-1","kv_start":0,"kv_length":460800}],` +
	`"fresh_kv_cache":[{"token_start":1800,"token_length":200,"kv_uri":"gd2fs://local/kv-sessions/s1/kv-1","kv_start":460800,"kv_length":51200}],` +
	`"cached_tokens":1800,"verified_tokens":1800,"shortened":"server_down","shortened_tokens":16,"prefill_tokens":200,"decode_tokens":0,"load_bytes":460800,"hit_rate":0.9,` +
	`"evicted_sessions":["a","b"],"fresh_files":[{"id":2,"path":"/kv-sessions/s1/kv-1","pool":"perf","chunk_size":16777216,"size":0,"modified":"2026-12-02T07:12:39.259015233Z",` +
	`"chunks":[{"index":0,"id":3,"length":0,"replicas":[{"server":"server-2","addr":"127.0.0.1:46255","up":true},{"server":"server-1","addr":"127.0.0.1:46256","up":false}]}]}]}` + "\n"

// A commit answer (a Session) as the master writes it.
var sessionAnswer = `{"id":"s1","model":"bench-small","tokens":2000,"bytes":512000,"last_used":"2026-12-02T07:12:39.259015233Z","created":"2026-12-02T07:12:30Z",` +
	`"ranges":[{"token_start":0,"token_length":2000,"kv_uri":"gd2fs://local/kv-sessions/s1/kv-1","kv_start":0,"kv_length":512000}],"hashed_tokens":2000}` + "\n"

// An engine-format plan answer, as the router gets one.
var enginePlanAnswer = `{"kvcache_params":{"id":"s1","stored_kvcache":[{"token_start":0,"token_length":32,"kv_uri":"gd2fs://127.0.0.1:7070/kv-sessions/s1/kv-1?cluster=local","kv_start":0,"kv_length":8192}],` +
	`"fresh_kvcache":[],"load_threshold":0},"plan_id":12,"cached_tokens":32,"verified_tokens":32,"prefill_tokens":5,"decode_tokens":0,"load_bytes":8192,"hit_rate":0.8648648648648649}` + "\n"

// FuzzAnswerDecode: a plan or commit answer decodes through readAnswer
// (the hand decoders of answerjson.go) exactly as through encoding/json's
// Decoder, which the client used before: the same value, or an error where
// it gave one. The seeds run in every `go test`;
// `go test -fuzz FuzzAnswerDecode ./internal/api` explores.
func FuzzAnswerDecode(f *testing.F) {
	for _, s := range []string{
		planAnswer, sessionAnswer, enginePlanAnswer,
		`{"kvcache_params":{"id":"a","flags":{"x":1}}}`, `{"kvcache_params":{"ID":"a"}}`, `{"kvcache_params":{"id":"a","x":1}}`,
		`{"kvcache_params":{"stored_kvcache":[{"kv_uri":"u","x":1}]}}`, `{"kvcache_params":null}`, `{"kvcache_params":{},"kvcache_params":{}}`,
		`{}`, ` {"plan_id":1} `, `{"plan_id":1}{"plan_id":2}`, `{"plan_id":1} x`, `{"plan_id":1`, ``, `null`, `[]`,
		`{"plan_id":-0}`, `{"plan_id":01}`, `{"plan_id":1.0}`, `{"plan_id":1e2}`, `{"plan_id":9223372036854775808}`,
		`{"plan_id":"1"}`, `{"plan_id":null}`, `{"PLAN_ID":7}`, `{"plan_id":1,"plan_id":2}`, `{"bogus":1}`,
		`{"hit_rate":1e-7}`, `{"hit_rate":-0.0}`, `{"hit_rate":1e400}`, `{"hit_rate":.5}`, `{"hit_rate":5.}`,
		`{"shortened":"a\"b"}`, `{"shortened":"\u00e9"}`, "{\"shortened\":\"\xff\"}", "{\"shortened\":\"é\"}",
		`{"stored_kv_cache":[]}`, `{"stored_kv_cache":null}`, `{"stored_kv_cache":[{}]}`, `{"stored_kv_cache":[{"kv_uri":1}]}`,
		`{"stored_kv_cache":[{"token_start":1},]}`, `{"evicted_sessions":["a",]}`, `{"evicted_sessions":[]}`,
		`{"fresh_files":[{"chunks":[{"id":18446744073709551615,"replicas":[{"up":true}]}]}]}`,
		`{"fresh_files":[{"chunks":[{"id":-1}]}]}`, `{"fresh_files":[{"modified":"2026-13-02T07:12:39Z"}]}`,
		`{"fresh_files":[{"modified":"x"}]}`, `{"fresh_files":[{"is_dir":tru}]}`, `{"fresh_files":[{"attrs":{"a":"b"}}]}`,
		`{"id":"s","last_used":"2026-12-02T07:12:39+01:00","ranges":[]}`, `{"id":"s","created":null}`,
		// Batches (a client's coalesced plans and commits).
		`{"plans":[{"plan":` + planAnswer + `},{"error":{"error":"no model m","code":"not_found"}}]}`,
		`{"commits":[{"session":` + sessionAnswer + `},{"error":{"error":"plan again","code":"bad_request"}}]}`,
		`{"plans":[]}`, `{"plans":null}`, `{"plans":[{"plan":null}]}`, `{"plans":[{"plan":{"a":[1,{"b":[true,"x"]}]} }]}`,
		`{"plans":[{"plan":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}]}`, `{"plans":[{"plan":1,"plan":2}]}`, `{"plans":[{"error":{"error":"x","code":"y","z":1}}]}`,
		`{"commits":[{"session":{"id":"s"},"error":{"error":"e","code":"c"}}]}`, `{"commits":[{"session":null}]}`, `{"commits":[{}],"x":1}`,
		`{"commits":[{"error":{"Error":"e"}}]}`, `{"plans":[{"plan":{"x":1e5,"y":-0.5,"z":"\u0041"}}]}`,
		// Engine plans in a batch (a router's coalesced plans).
		`{"plans":[{"plan":` + enginePlanAnswer + `},{"plan":{"kvcache_params":{"id":"a","flags":{"prefill-only":true}},"plan_id":3}}]}`,
		`{"plans":[{"plan":{"kvcache_params":{"id":"a","fresh_kvcache":[{"kv_uri":"u","x":1}]}}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var wantP, gotP Plan
		errW := json.NewDecoder(bytes.NewReader(b)).Decode(&wantP)
		errG := readAnswer(bytes.NewReader(b), &gotP)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, readAnswer %v", b, errW, errG)
		}
		if !reflect.DeepEqual(wantP, gotP) {
			t.Fatalf("%q: encoding/json decodes %+v, readAnswer %+v", b, wantP, gotP)
		}
		var wantE, gotE EnginePlan
		errW = json.NewDecoder(bytes.NewReader(b)).Decode(&wantE)
		errG = readAnswer(bytes.NewReader(b), &gotE)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, readAnswer %v", b, errW, errG)
		}
		if !reflect.DeepEqual(wantE, gotE) {
			t.Fatalf("%q: encoding/json decodes %+v, readAnswer %+v", b, wantE, gotE)
		}
		var wantS, gotS Session
		errW = json.NewDecoder(bytes.NewReader(b)).Decode(&wantS)
		errG = readAnswer(bytes.NewReader(b), &gotS)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, readAnswer %v", b, errW, errG)
		}
		if !reflect.DeepEqual(wantS, gotS) {
			t.Fatalf("%q: encoding/json decodes %+v, readAnswer %+v", b, wantS, gotS)
		}
		var wantPB, gotPB PlanBatchAnswer
		errW = json.NewDecoder(bytes.NewReader(b)).Decode(&wantPB)
		errG = readAnswer(bytes.NewReader(b), &gotPB)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, readAnswer %v", b, errW, errG)
		}
		if !reflect.DeepEqual(wantPB, gotPB) {
			t.Fatalf("%q: encoding/json decodes %+v, readAnswer %+v", b, wantPB, gotPB)
		}
		for i, r := range wantPB.Plans {
			var want, got Plan
			errW, errG := json.Unmarshal(r.Plan, &want), DecodePlan(r.Plan, &got)
			if (errW == nil) != (errG == nil) || !reflect.DeepEqual(want, got) {
				t.Fatalf("%q: plan %d: encoding/json decodes %+v (%v), DecodePlan %+v (%v)", b, i, want, errW, got, errG)
			}
			var wantE, gotE EnginePlan
			errW, errG = json.Unmarshal(r.Plan, &wantE), DecodeEnginePlan(r.Plan, &gotE)
			if (errW == nil) != (errG == nil) || !reflect.DeepEqual(wantE, gotE) {
				t.Fatalf("%q: plan %d: encoding/json decodes %+v (%v), DecodeEnginePlan %+v (%v)", b, i, wantE, errW, gotE, errG)
			}
		}
		var wantCB, gotCB CommitBatchAnswer
		errW = json.NewDecoder(bytes.NewReader(b)).Decode(&wantCB)
		errG = readAnswer(bytes.NewReader(b), &gotCB)
		if (errW == nil) != (errG == nil) {
			t.Fatalf("%q: encoding/json says %v, readAnswer %v", b, errW, errG)
		}
		if !reflect.DeepEqual(wantCB, gotCB) {
			t.Fatalf("%q: encoding/json decodes %+v, readAnswer %+v", b, wantCB, gotCB)
		}
	})
}

// TestAnswerPlainPath: the master's answers take the hand decoders (a
// change of the answers' shape that sent them all to encoding/json would
// pass FuzzAnswerDecode and lose the gain), and what they decode is what
// was sent.
func TestAnswerPlainPath(t *testing.T) {
	var p Plan
	if !p.decodePlain([]byte(planAnswer)) {
		t.Fatal("the plan answer is not decoded by hand")
	}
	if len(p.FreshFiles) != 1 || len(p.FreshFiles[0].Chunks[0].Replicas) != 2 || p.HitRate != 0.9 || p.Evicted[1] != "b" ||
		!p.FreshFiles[0].Modified.Equal(time.Date(2026, 12, 2, 7, 12, 39, 259015233, time.UTC)) {
		t.Fatalf("plan decoded as %+v", p)
	}
	var e EnginePlan
	if !e.decodePlain([]byte(enginePlanAnswer)) || e.KVCacheParams.Stored[0].KVLength != 8192 || e.KVCacheParams.Fresh == nil || e.CachedTokens != 32 {
		t.Fatalf("the engine plan answer is not decoded by hand, or decoded as %+v", e)
	}
	var pb PlanBatchAnswer
	if !pb.decodePlain([]byte(`{"plans":[{"plan":`+planAnswer+`},{"error":{"error":"e","code":"not_found"}}]}`)) || len(pb.Plans) != 2 || pb.Plans[1].Error.Code != "not_found" {
		t.Fatalf("the plan batch answer is not decoded by hand, or decoded as %+v", pb)
	}
	if !new(Plan).decodePlain(pb.Plans[0].Plan) {
		t.Fatal("a plan of a batch is not decoded by hand")
	}
	var cb CommitBatchAnswer
	if !cb.decodePlain([]byte(`{"commits":[{"session":`+sessionAnswer+`},{"error":{"error":"e","code":"bad_request"}}]}`)) || len(cb.Commits) != 2 || cb.Commits[0].Session.Tokens != 2000 {
		t.Fatalf("the commit batch answer is not decoded by hand, or decoded as %+v", cb)
	}
	var s Session
	if !s.decodePlain([]byte(sessionAnswer)) {
		t.Fatal("the commit answer is not decoded by hand")
	}
	if s.Tokens != 2000 || len(s.Ranges) != 1 || s.Ranges[0].KVLength != 512000 || s.HashedTokens != 2000 {
		t.Fatalf("session decoded as %+v", s)
	}
	// An answer into a value that is not zero goes to encoding/json, which
	// keeps the fields the answer leaves out.
	s = Session{Model: "kept"}
	if err := readAnswer(strings.NewReader(`{"id":"x"}`), &s); err != nil || s.Model != "kept" || s.ID != "x" {
		t.Fatalf("decoded into a set session: %+v, %v", s, err)
	}
}

// TestAnswerCutShort: an answer whose connection breaks within it fails
// with the read's error, as the Decoder reading the stream did; one that
// breaks after the whole value decodes.
func TestAnswerCutShort(t *testing.T) {
	cut := errors.New("connection reset")
	var p Plan
	err := readAnswer(io.MultiReader(strings.NewReader(planAnswer[:100]), iotest.ErrReader(cut)), &p)
	if !errors.Is(err, cut) {
		t.Fatalf("an answer cut within its value: %v, want the read's error", err)
	}
	p = Plan{}
	if err := readAnswer(io.MultiReader(strings.NewReader(planAnswer), iotest.ErrReader(cut)), &p); err != nil || p.PlanID != 1037 {
		t.Fatalf("an answer cut after its value: %+v, %v", p, err)
	}
}

// BenchmarkAnswerDecode decodes a plan answer and a commit answer, by
// encoding/json's Decoder (the reference, what the client did before) and
// by readAnswer, and reports the ratio.
//
//	go test -run '^$' -bench AnswerDecode ./internal/api
func BenchmarkAnswerDecode(b *testing.B) {
	for _, c := range []struct {
		name string
		body string
		new  func() any
	}{
		{"plan", planAnswer, func() any { return new(Plan) }},
		{"session", sessionAnswer, func() any { return new(Session) }},
		{"engine-plan", enginePlanAnswer, func() any { return new(EnginePlan) }},
	} {
		var ref, hand time.Duration
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			start := time.Now()
			for b.Loop() {
				if err := json.NewDecoder(strings.NewReader(c.body)).Decode(c.new()); err != nil {
					b.Fatal(err)
				}
			}
			ref = time.Since(start) / time.Duration(b.N)
		})
		b.Run(c.name+"/readAnswer", func(b *testing.B) {
			start := time.Now()
			for b.Loop() {
				if err := readAnswer(strings.NewReader(c.body), c.new()); err != nil {
					b.Fatal(err)
				}
			}
			hand = time.Since(start) / time.Duration(b.N)
			if ref > 0 {
				b.ReportMetric(float64(hand)/float64(ref), "x-encoding-json")
			}
		})
	}
}

// spyPlan records whether Do decoded its answer by hand.
type spyPlan struct {
	Plan
	byHand bool
}

func (s *spyPlan) decodePlain(b []byte) bool {
	s.byHand = s.Plan.decodePlain(b)
	return s.byHand
}

// TestDoDecodesAnswersByHand: Do hands a plan answer to the hand decoder,
// which decodes what encoding/json decodes, and sends a plan request as
// the bytes json.Marshal writes.
func TestDoDecodesAnswersByHand(t *testing.T) {
	req := PlanRequest{Model: "m", TokenIDs: []uint32{1, 2, 3}, DecodeTokens: 8}
	want, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, err := io.ReadAll(r.Body); err != nil || !bytes.Equal(b, want) {
			writeErrJSON(w, 400, Error{Error: "request body not as json.Marshal writes it", Code: "bad_request"}, false)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, planAnswer)
	}))
	defer srv.Close()
	c := &Client{Base: srv.URL, RetryFor: -1}
	var got spyPlan
	if err := c.Do(context.Background(), "POST", "/v1/sessions/a/plan", req, &got); err != nil {
		t.Fatal(err)
	}
	var ref Plan
	if err := json.Unmarshal([]byte(planAnswer), &ref); err != nil {
		t.Fatal(err)
	}
	if !got.byHand || !reflect.DeepEqual(got.Plan, ref) {
		t.Fatalf("by hand: %v; decoded %+v, encoding/json %+v", got.byHand, got.Plan, ref)
	}
}

// TestAnswerErrorsAsDecoder: an answer that breaks off reports what
// encoding/json's Decoder reading the stream reported (found by a review
// of the hand path): a syntax error before the cut is that error, a value
// cut short is the read's error.
func TestAnswerErrorsAsDecoder(t *testing.T) {
	cut := errors.New("connection reset")
	for _, body := range []string{`{"plan_id":1,}`, `{"plan_id":1,"stored_kv`, `{"plan_id":1}`, `{"plan_id":1} trailing`} {
		stream := func() io.Reader { return io.MultiReader(strings.NewReader(body), iotest.ErrReader(cut)) }
		var a, b Plan
		errW := json.NewDecoder(stream()).Decode(&a)
		errG := readAnswer(stream(), &b)
		if (errW == nil) != (errG == nil) || errors.Is(errW, cut) != errors.Is(errG, cut) {
			t.Fatalf("%s: encoding/json's Decoder: %v; readAnswer: %v", body, errW, errG)
		}
	}
}
