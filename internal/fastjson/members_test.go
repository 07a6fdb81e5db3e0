package fastjson

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// membersSeeds are request bodies of the kinds the router reads.
var membersSeeds = []string{
	`{"model":"m","prompt":[1,2,3,4],"max_tokens":4}`,
	`{"model": "m", "messages": [{"role": "user", "content": "h\u00e9llo\n\"x\"\\ \/"}], "stream": true, "user": null}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"日本語"}]}],"temperature":0.7,"top_p":1e-3,"n":-0}`,
	` { "a" : { "b" : [ true , false , null , { } , [ ] ] } , "a" : 2 } `,
	`{"kv_transfer_params":{"kvcache_params":{"id":1}},"prompt":"x"}`,
	`{"kv\u005ftransfer_params":1}`,
	`{}`, `[]`, `null`, `{"a":1}x`, `{"a":01}`, `{"a":"\x01"}`, `{"a":"\q"}`, `{"a":"\u12"}`, `{"a":1,}`, `{"a" 1}`,
	`{"a":-}`, `{"a":1.}`, `{"a":1e}`, `{"a":tru}`, `{"a":"` + "\xff\xfe" + `"}`, `{"` + "\xff" + `":1}`, `{"a":[1,2]]}`,
	`{"a":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`,
}

// TestMembers: the documents Members takes, it reads exactly as
// encoding/json does; the ones it turns down are invalid or left to it.
func TestMembers(t *testing.T) {
	takes := 0
	for _, s := range membersSeeds {
		if checkMembers(t, []byte(s)) {
			takes++
		}
	}
	// A chat request with escapes, non-ASCII text and null is taken (the
	// fast path is not only for plain bodies).
	for _, s := range membersSeeds[:4] {
		if _, ok := Members([]byte(s)); !ok {
			t.Errorf("Members turned down a valid request %s", s)
		}
	}
	if takes == len(membersSeeds) {
		t.Fatal("Members took every document, the invalid ones too")
	}
}

// checkMembers compares Members with json.Unmarshal on b and says whether
// Members took it.
func checkMembers(t *testing.T, b []byte) bool {
	t.Helper()
	m, ok := Members(b)
	var want map[string]json.RawMessage
	err := json.Unmarshal(b, &want)
	if !ok {
		return false
	}
	if err != nil || want == nil {
		t.Fatalf("Members took %q, which encoding/json refuses (%v)", b, err)
	}
	if len(m) != len(want) {
		t.Fatalf("%q: Members %d members, encoding/json %d", b, len(m), len(want))
	}
	for k, v := range want {
		if got, has := m[k]; !has || !bytes.Equal(got, v) {
			t.Fatalf("%q: member %q: Members %q, encoding/json %q", b, k, got, v)
		}
	}
	return true
}

func FuzzMembers(f *testing.F) {
	for _, s := range membersSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkMembers(t, b) })
}

func BenchmarkMembers(b *testing.B) {
	ids := make([]uint32, 1700)
	for i := range ids {
		ids[i] = uint32(i * 797 % 50000)
	}
	body, err := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 4})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.Run("Members", func(b *testing.B) {
		for b.Loop() {
			if _, ok := Members(body); !ok {
				b.Fatal("not taken")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(body, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
