package master

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/internal/api"
)

// fuzzRoutes are the master's routes that take input; {p} is replaced by the
// fuzzed path or id.
var fuzzRoutes = []string{
	"POST /v1/servers/heartbeat",
	"PUT /v1/files/{p...}",
	"GET /v1/files/{p...}",
	"DELETE /v1/files/{p...}",
	"POST /v1/alloc/{p...}",
	"POST /v1/commit/{p...}",
	"POST /v1/link/{p...}",
	"PUT /v1/attrs/{p...}",
	"GET /v1/list/{p...}",
	"PUT /v1/dirs/{p...}",
	"PUT /v1/models/{p}/layout",
	"POST /v1/prefixes",
	"POST /v1/sessions/{p}/plan",
	"POST /v1/sessions/{p}/commit",
	"POST /v1/sessions/{p}/fork",
	"GET /v1/sessions/{p}",
	"DELETE /v1/sessions/{p}",
	"GET /v1/sessions?limit={p}&after={p}",
	"POST /v1/refill/{p...}",
	"GET /readyz?probe={p}", // probes take no input; a stray query or body changes nothing
	"GET /healthz?probe={p}",
	"GET /v1/sessions/{p}/plans/{p}",
	"POST /v1/sessions/s/plan?request_id={p}",
	"POST /v1/sessions/s/fork?request_id={p}",
	"GET /v1/list/d?limit={p}&after={p}",
	"POST /v1/servers/{p}/drain",
	"POST /v1/servers/{p}/drain?undo={p}",
	"POST /v1/sessions/plans",         // a batch of plans (27)
	"POST /v1/rename/{p...}",          // 28
	"POST /v1/sessions/commits",       // a batch of commits (29)
	"POST /v1/sessions/commits/saved", // a batch with engine commits (30)
}

// FuzzHandlers sends arbitrary JSON bodies, paths and query figures to every
// route of one master. Invariants: no panic, no 5xx but 503 for a real
// outage (no data server is up to place chunks on), and /v1/status keeps
// answering 200. The seeds (testdata/fuzz/FuzzHandlers and below) run in
// every `go test`; `go test -fuzz FuzzHandlers ./internal/master` explores.
func FuzzHandlers(f *testing.F) {
	m := startMaster(f, Config{})
	h := m.Handler()
	// A server to place chunks on, so alloc, link and plans get past placement.
	hb := api.Heartbeat{ServerInfo: api.ServerInfo{ID: "s1", Addr: "127.0.0.1:1", MemCap: 1 << 40, DiskCap: 1 << 40}}
	seed := func(route uint8, p, body string) { f.Add(route, p, []byte(body)) }
	seed(0, "", `{"id":"s1","addr":"127.0.0.1:1","mem_cap":1099511627776,"disk_cap":1099511627776}`)
	seed(1, "f", `{"pool":"perf"}`)
	seed(1, "f", `null`)
	seed(1, "f", `{"pool":"perf"}{"pool":"ha"}`)
	seed(1, "g", `{"pool":"perf","chunk_size":-1}`)
	seed(4, "f", `{"indexes":[0,1,9223372036854775807,-1]}`)
	seed(5, "f", `{"size":9223372036854775807}`)
	seed(5, "f", `{"size":1048576,"lengths":{"0":-5,"9223372036854775807":1}}`)
	seed(6, "l", `{"source":"s3://b/k","size":4611686018427387904}`)
	seed(6, "l2", `{"source":"s3://b/k","size":9223372036854775807,"chunk_size":65536}`)
	seed(7, "f", `{"sha256":"x"}`)
	seed(8, "a%0Ab", ``)
	seed(9, "d%FF", ``)
	seed(10, "m", `{"layers":4611686018427387904,"kv_heads":8,"head_dim":128,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	seed(10, "m", `{"layers":32,"kv_heads":8,"head_dim":128,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	seed(11, "", `{"path":"/f","model":"m","tokens":9223372036854775807}`)
	seed(12, "s", `{"model":"m","prompt_tokens":16,"decode_tokens":9223372036854775807}`)
	seed(12, "s", `{"model":"m","prompt_tokens":100,"prefixes":["gd2fs://local/f"]}`)
	seed(12, "s", `{"model":"m","token_ids":[1,2,3,4294967295,0],"decode_tokens":3}`)
	seed(12, "s", `{"model":"m","token_ids":[1,-2,4294967296]}`)
	seed(12, "s", `{"model":"m","prompt_tokens":20,"block_hashes":["00112233445566778899aabbccddeeff","zz"]}`)
	seed(12, "s", `{"model":"m","prompt_tokens":16,"block_hashes":["00112233445566778899aabbccddeeff"],"format":"vllm"}`)
	seed(12, "s", `{"model":"m","prompt_tokens":16,"unsafe_count_only":true,"token_ids":[1]}`)
	seed(12, "s", `{"model":"m","prompt_tokens":16}`)
	seed(11, "", `{"path":"/f","model":"m","tokens":3,"token_ids":[1,2]}`)
	seed(13, "s", `{"plan_id":-1}`)
	seed(13, "s", `{"plan_id":1,"written":true}`)
	seed(13, "s", `{"written":true,"fresh_kvcache":[{"token_start":0,"token_length":16,"kv_uri":"gd2fs://local/kv-sessions/s/kv-1","kv_start":9223372036854775807,"kv_length":1}]}`)
	seed(12, "s", `{"model":"m","prompt_tokens":40,"format":"vllm","flags":{"prefill-only":true,"x":[1]}}`)
	seed(13, "s", `{"kvcache_params":{"id":"s","flags":{"prefill-only":true},"zz":{},"fresh_kvcache":[{"token_start":0,"token_length":16,"kv_uri":"gd2fs://local/kv-sessions/s/kv-1","kv_start":0,"kv_length":1,"y":2}]}}`)
	seed(14, "s", `{"new_id":"s/2"}`)
	seed(19, "r1", `{"model":"m","token_ids":[1,2,3]}`)
	seed(19, "r1", `{"model":"m","token_ids":[1,2,3]}`) // a repeat
	seed(19, "\x00\n", `{"model":"m","token_ids":[1]}`)
	seed(20, "f1", `{"new_id":"s9"}`)
	seed(20, "f1", `{"new_id":"s9"}`)
	// Issue 28's inputs: the sglang format (flags refused), kv_inner and
	// hybrid layouts (kv_layers); ids and a count that disagree.
	seed(12, "s", `{"model":"m","prompt_tokens":16,"token_ids":[1,2],"format":"sglang","flags":{"a":true}}`)
	seed(12, "s", `{"model":"m","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"format":"sglang","load_threshold":-1}`)
	seed(10, "h", `{"layers":32,"kv_layers":40,"kv_heads":8,"head_dim":128,"dtype":"bf16","page_tokens":16,"layout":"kv_inner","tp_size":3}`)
	seed(10, "h", `{"layers":4,"kv_layers":2,"kv_heads":2,"head_dim":4,"dtype":"fp8","page_tokens":1,"layout":"kv_inner","tp_size":2,"replicated":true}`)
	seed(17, "abc", ``)
	seed(17, "-1", ``)
	seed(18, "l", `{"index":0,"failed":["s1"]}`)
	seed(18, "l", `{"index":-1}`)
	seed(18, "f", `{"index":9223372036854775807,"failed":[]}`)
	seed(19, "1", ``)
	seed(19, "-9223372036854775808", ``)
	seed(19, "x%2F", ``)
	// Names and text the store cannot hold (issue 22 findings 9, 10).
	seed(0, "", `{"id":"x\u0000","addr":"127.0.0.1:1"}`)
	seed(0, "", `{"id":"..","addr":"127.0.0.1:1"}`)
	seed(0, "", `{"id":"s2","addr":"nowhere"}`)
	seed(7, "f", `{"k":"v\u0000"}`)
	seed(1, "g", `{"pool":"perf","request_id":"r\u0000"}`)
	seed(10, "m\x00", `{"layers":2,"kv_heads":2,"head_dim":4,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	seed(10, "..", `{"layers":2,"kv_heads":2,"head_dim":4,"dtype":"bf16","page_tokens":16,"layout":"layer_first"}`)
	seed(12, "..", `{"model":"m","prompt_tokens":16}`)
	seed(12, "s\xff", `{"model":"m","prompt_tokens":16}`)
	seed(12, "s", `{"model":"m\u0000","prompt_tokens":16}`)
	seed(14, "s", `{"new_id":".."}`)
	seed(15, "a\x00", ``)
	seed(17, "\xff", ``)
	seed(6, "l3", `{"source":"s3://../../etc/passwd","size":10}`)
	seed(24, "5", ``) // GET /v1/list/d?limit=&after=
	seed(24, "\xff", ``)
	seed(5, "f", `{"size":10,"lengths":{"-1":5,"99999":5}}`)
	for v := 1; v <= 4; v++ { // the web page's variants of a heartbeat and a create
		seed(uint8(v*len(fuzzRoutes)), "", `{"id":"s1","addr":"10.66.66.66:1"}`)
		seed(uint8(v*len(fuzzRoutes)+1), "f", `{"pool":"perf"}`)
	}
	seed(19, "x", `{}`)
	seed(20, "", `x`)
	// Batches of plans: good, bad and repeated plans mixed, sizes out of
	// bounds, request ids the single plan refuses.
	seed(27, "", `{"plans":[{"session":"s","request_id":"r1","plan":{"model":"m","token_ids":[1,2,3]}},{"session":"s","request_id":"r1","plan":{"model":"m","token_ids":[1,2,3]}},{"session":"..","plan":{"model":"m","prompt_tokens":16}},{"session":"t","plan":{"model":"m","prompt_tokens":16,"format":"vllm","flags":{"x":[1]}}}]}`)
	seed(27, "", `{"plans":[]}`)
	seed(28, "f", `{"to":"/g","request_id":"r1"}`)
	seed(28, "g", `{"to":"/g/x","no_replace":true}`)
	seed(28, "", `{"to":""}`)
	seed(28, "d", `{"to":"/d/e"}`)
	seed(27, "", `{"plans":null}`)
	seed(27, "", `{"plans":[{"session":"s","request_id":"r\u0000","plan":{"model":"m","prompt_tokens":16}}]}`)
	seed(27, "", `{"plans":[{"session":"s\u0000","plan":{"model":"m\u0000","decode_tokens":9223372036854775807,"unsafe_count_only":true,"prompt_tokens":9223372036854775807}}]}`)
	seed(27, "", `{"plans":[{"session":"s","plan":{"model":"m","prompt_tokens":20,"block_hashes":["00112233445566778899aabbccddeeff","zz"]}}],"x":1}`)
	// Batches of commits: stale, unknown and repeated plans, sessions the
	// store cannot name, sizes out of bounds, an engine's fields (refused).
	seed(29, "", `{"commits":[{"session":"s","plan_id":1,"written":true},{"session":"s","plan_id":1,"written":true},{"session":"..","plan_id":2},{"session":"nobody","plan_id":-1}]}`)
	seed(29, "", `{"commits":[]}`)
	seed(29, "", `{"commits":null}`)
	seed(29, "", `{"commits":[{"session":"s\u0000","plan_id":9223372036854775807}]}`)
	seed(29, "", `{"commits":[{"session":"s","plan_id":1,"fresh_kvcache":[]}]}`)
	seed(29, "", `{"commits":[{"session":"s","plan_id":1}],"x":1}`)
	// Batches with engine commits: saved segments the servers never saw,
	// kv_uris of no file or another cluster, too many segments, plain
	// commits beside them, nulls.
	seed(30, "", `{"commits":[{"session":"t","plan_id":2,"fresh_kvcache":[{"token_start":0,"token_length":16,"kv_uri":"gd2fs://local/kv-sessions/t/kv-1","kv_start":0,"kv_length":4096}]},{"session":"s","plan_id":1,"written":true},{"session":"t","plan_id":0,"fresh_kvcache":[]}]}`)
	seed(30, "", `{"commits":[{"session":"t","fresh_kvcache":[{"token_start":-1,"token_length":9223372036854775807,"kv_uri":"gd2fs://other/x","kv_start":9223372036854775807,"kv_length":9223372036854775807}]}]}`)
	seed(30, "", `{"commits":[{"session":"t","plan_id":2,"fresh_kvcache":null},{"session":"..","fresh_kvcache":[{"kv_uri":"/../x"}]}]}`)
	seed(30, "", `{"commits":[{"session":"t","plan_id":2,"fresh_kvcache":[{"kv_uri":"gd2fs://local/kv-sessions/t/kv-1","x":1}]}]}`)
	seed(30, "", `{"commits":[]}`)
	// variant > 0 sends what a web page could (guard.go): no JSON type, an
	// Origin of another site, a foreign Host, no server role.
	do := func(t *testing.T, method, target string, body []byte, variant ...int) int {
		req := httptest.NewRequest(method, "http://127.0.0.1:7070"+target, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(api.RoleHeader, "server")
		switch append(variant, 0)[0] {
		case 1:
			req.Header.Set("Content-Type", "text/plain")
		case 2:
			req.Header.Set("Origin", "http://attacker.example")
		case 3:
			req.Host = "attacker.example"
		case 4:
			req.Header.Del(api.RoleHeader)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 && !(rec.Code == http.StatusServiceUnavailable &&
			(strings.Contains(rec.Body.String(), `"unavailable"`) || strings.Contains(rec.Body.String(), `"no_space"`))) {
			t.Fatalf("%s %s %q: %d %s", method, target, body, rec.Code, rec.Body.String())
		}
		return rec.Code
	}
	f.Fuzz(func(t *testing.T, route uint8, p string, body []byte) {
		hbBody, _ := json.Marshal(hb)
		do(t, "POST", "/v1/servers/heartbeat", hbBody)
		method, target, _ := strings.Cut(fuzzRoutes[int(route)%len(fuzzRoutes)], " ")
		switch {
		case strings.Contains(target, "?"):
			p = url.QueryEscape(p)
		case strings.HasSuffix(target, "{p...}"):
			p = api.EscapePath(p) // a namespace path, as the SDK sends it
			target = strings.TrimSuffix(target, "...}") + "}"
		default:
			p = url.PathEscape(p) // one segment: a model or session id
		}
		do(t, method, strings.ReplaceAll(target, "{p}", p), body, int(route)/len(fuzzRoutes))
		if code := do(t, "GET", "/v1/status", nil); code != 200 {
			t.Fatalf("status answers %d after %s %s %q", code, method, target, body)
		}
	})
}
