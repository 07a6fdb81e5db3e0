package router

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// chatEngine is a stand-in for vLLM's chat front: its chat template puts
// the request's tools, its chat_template_kwargs and each message (an image
// part as 4 placeholder tokens, as vLLM's multimodal models do) into the
// prompt, /tokenize renders only the fields it is sent (as vLLM's
// TokenizeChatRequest does), and the KV of token i depends on the prompt's
// content up to i (an image's placeholders on the image itself). It saves
// the whole blocks of its prompt in the fresh segments and, on a request
// with stored segments, reads them back and reports any that do not hold
// the KV of its current prompt: stale KV served as a hit.
type chatEngine struct {
	t  *testing.T
	cl *client.Client
	l  client.Layout
	mu sync.Mutex
	// stale: stored segments whose bytes were computed for other content.
	stale     []string
	stored    int64 // stored tokens loaded, over all requests
	tokenizes int   // /tokenize calls
}

// render is the prompt of a chat request: token ids (what /tokenize
// answers) and content keys (what the KV is computed from).
func render(doc map[string]any) (ids, keys []uint32) {
	word := func(w string) uint32 {
		h := fnv.New32a()
		h.Write([]byte(w))
		return h.Sum32()
	}
	add := func(text string) {
		for _, w := range strings.Fields(text) {
			ids, keys = append(ids, word(w)), append(keys, word(w))
		}
	}
	if tools, ok := doc["tools"]; ok {
		b, _ := json.Marshal(tools)
		add("TOOLS " + strings.NewReplacer("{", " ", "}", " ", ",", " ", ":", " ", "\"", " ", "[", " ", "]", " ").Replace(string(b)))
	}
	if kw, ok := doc["chat_template_kwargs"].(map[string]any); ok && kw["enable_thinking"] == true {
		add("THINK")
	}
	if p, ok := doc["prompt"].([]any); ok { // a completion's token ids: the prompt as it is
		for _, id := range p {
			f, _ := id.(float64)
			ids, keys = append(ids, uint32(f)), append(keys, uint32(f))
		}
		return ids, keys
	}
	msgs, _ := doc["messages"].([]any)
	for _, m := range msgs {
		m, _ := m.(map[string]any)
		role, _ := m["role"].(string)
		add(role)
		switch c := m["content"].(type) {
		case string:
			add(c)
		case []any:
			for _, p := range c {
				p, _ := p.(map[string]any)
				if p["type"] == "text" {
					t, _ := p["text"].(string)
					add(t)
					continue
				}
				b, _ := json.Marshal(p)
				for range 4 {
					ids, keys = append(ids, word("<image>")), append(keys, word(string(b)))
				}
			}
		}
	}
	if g, ok := doc["add_generation_prompt"].(bool); !ok || g {
		add("ASSISTANT")
	}
	return ids, keys
}

// kv is the KV of tokens [start, start+n) of a prompt whose content keys
// are keys: each token's bytes a function of keys[0..i].
func (e *chatEngine) kv(keys []uint32, start, n int64) []byte {
	tb := e.l.TokenBytes()
	out := make([]byte, 0, n*tb)
	h := fnv.New64a()
	var b [4]byte
	for i := int64(0); i < start+n; i++ {
		binary.LittleEndian.PutUint32(b[:], keys[i])
		h.Write(b[:])
		if i >= start {
			out = append(out, bytes.Repeat([]byte{byte(h.Sum64())}, int(tb))...)
		}
	}
	return out
}

func (e *chatEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var doc map[string]any
	json.NewDecoder(r.Body).Decode(&doc)
	ids, keys := render(doc)
	if r.URL.Path == "/tokenize" {
		e.mu.Lock()
		e.tokenizes++
		e.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": 4096, "tokens": ids})
		return
	}
	answer := map[string]any{"choices": []any{map[string]any{"message": map[string]any{"role": "assistant", "content": "ok"}}}}
	ktp, ok := doc["kv_transfer_params"].(map[string]any)
	if !ok {
		json.NewEncoder(w).Encode(answer)
		return
	}
	kp := ktp["kvcache_params"].(map[string]any)
	ctx := r.Context()
	segs := func(key string) []client.KVRange {
		var out []client.KVRange
		b, _ := json.Marshal(kp[key])
		json.Unmarshal(b, &out)
		return out
	}
	for _, seg := range segs("stored_kvcache") {
		u, err := client.ParseURI(seg.KVURI)
		if err != nil {
			e.t.Error(err)
			return
		}
		f, err := e.cl.Open(ctx, u.Path)
		got := make([]byte, seg.KVLength)
		if err == nil {
			_, err = f.ReadAtContext(ctx, got, seg.KVStart)
		}
		if err != nil {
			e.t.Error(err)
			return
		}
		e.mu.Lock()
		e.stored += seg.TokenLength
		if seg.TokenStart+seg.TokenLength > int64(len(keys)) || !bytes.Equal(got, e.kv(keys, seg.TokenStart, seg.TokenLength)) {
			e.stale = append(e.stale, fmt.Sprintf("tokens %d+%d", seg.TokenStart, seg.TokenLength))
		}
		e.mu.Unlock()
	}
	saved := []client.KVRange{}
	whole := int64(len(keys)) / int64(e.l.PageTokens) * int64(e.l.PageTokens)
	for _, seg := range segs("fresh_kvcache") {
		seg.TokenLength = min(seg.TokenLength, whole-seg.TokenStart)
		if seg.TokenLength <= 0 {
			continue
		}
		seg.KVLength = seg.TokenLength * e.l.TokenBytes()
		u, err := client.ParseURI(seg.KVURI)
		if err != nil {
			e.t.Error(err)
			return
		}
		f, err := e.cl.Open(ctx, u.Path)
		if err == nil {
			_, err = f.WriteAtContext(ctx, e.kv(keys, seg.TokenStart, seg.TokenLength), seg.KVStart)
		}
		if err == nil {
			err = f.Sync(ctx)
		}
		if err != nil {
			e.t.Error(err)
			return
		}
		saved = append(saved, seg)
	}
	answer["kv_transfer_params"] = map[string]any{"kvcache_params": map[string]any{"id": kp["id"], "fresh_kvcache": saved}}
	json.NewEncoder(w).Encode(answer)
}

// TestRouterChatContent: the ids a plan is checked against are those of
// the prompt the engine runs. A chat's tools, its chat_template_kwargs and
// its images are part of that prompt: a turn that changes them (the
// messages' text unchanged) must not be served the KV computed for the
// old ones. And a turn that changes nothing is served its stored KV.
func TestRouterChatContent(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), MemBytes: 8 << 20, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	l := client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "fp16", PageTokens: 4, Order: "kv_first"}
	if err := cl.Sessions().SetLayout(ctx, l); err != nil {
		t.Fatal(err)
	}
	e := &chatEngine{t: t, cl: cl, l: l}
	up := httptest.NewServer(e)
	defer up.Close()
	u, _ := url.Parse(up.URL)
	front := httptest.NewServer(New(Config{Upstream: u, Model: "m", Planner: cl.Sessions(), SharedSessions: true}))
	defer front.Close()
	chat := func(session string, doc map[string]any) {
		t.Helper()
		if _, ok := doc["model"]; !ok {
			doc["model"] = "m"
		}
		doc["max_tokens"] = 2
		path := "/v1/chat/completions"
		if _, ok := doc["prompt"]; ok {
			path = "/v1/completions"
		}
		b, _ := json.Marshal(doc)
		req, _ := http.NewRequest("POST", front.URL+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Session-ID", session)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("chat answered %s", resp.Status)
		}
	}
	text := "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
	user := func(s string) map[string]any { return map[string]any{"role": "user", "content": s} }
	tool := func(name string) []any {
		return []any{map[string]any{"type": "function", "function": map[string]any{"name": name, "parameters": map[string]any{}}}}
	}
	image := func(url, s string) map[string]any {
		return map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}, map[string]any{"type": "text", "text": s}}}
	}
	ids := func(from, n int, edit ...int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = from + i
		}
		for _, at := range edit {
			out[at] = 99999
		}
		return out
	}
	turns := []struct {
		name          string
		session       string
		first, second map[string]any
	}{
		// A completion whose prompt is token ids is planned on those ids,
		// without /tokenize (checked below); an edit inside them is still
		// seen by the content check.
		{"token ids, same prompt grown", "ids-same",
			map[string]any{"prompt": ids(1000, 20)}, map[string]any{"prompt": ids(1000, 30)}},
		{"token ids, an early id edited, same length", "ids-edit",
			map[string]any{"prompt": ids(2000, 20)}, map[string]any{"prompt": ids(2000, 20, 2)}},
		// The same ids under another model (a LoRA adapter's name): KV
		// computed under one is not the other's.
		{"model switched", "ids-model",
			map[string]any{"prompt": ids(3000, 20)}, map[string]any{"prompt": ids(3000, 30), "model": "m-lora"}},
		{"same chat", "chat-same",
			map[string]any{"messages": []any{user(text)}},
			map[string]any{"messages": []any{user(text), map[string]any{"role": "assistant", "content": "ok"}, user("more")}}},
		{"tools changed", "chat-tools",
			map[string]any{"messages": []any{user(text)}, "tools": tool("get_weather")},
			map[string]any{"messages": []any{user(text), map[string]any{"role": "assistant", "content": "ok"}, user("more")}, "tools": tool("get_stock")}},
		{"thinking switched on", "chat-think",
			map[string]any{"messages": []any{user(text)}, "chat_template_kwargs": map[string]any{"enable_thinking": false}},
			map[string]any{"messages": []any{user(text), user("more")}, "chat_template_kwargs": map[string]any{"enable_thinking": true}}},
		{"image changed", "chat-image",
			map[string]any{"messages": []any{image("https://example.invalid/cat.png", text)}},
			map[string]any{"messages": []any{image("https://example.invalid/dog.png", text), user("more")}}},
	}
	for _, tc := range turns {
		e.mu.Lock()
		stored0, tokenizes0 := e.stored, e.tokenizes
		e.mu.Unlock()
		chat(tc.session, tc.first)
		chat(tc.session, tc.second)
		e.mu.Lock()
		stale, stored, tokenizes := e.stale, e.stored-stored0, e.tokenizes-tokenizes0
		e.stale = nil
		e.mu.Unlock()
		if len(stale) > 0 {
			t.Errorf("%s: the engine was given stale KV as stored: %v", tc.name, stale)
		}
		if (tc.name == "same chat" || tc.name == "token ids, same prompt grown") && stored == 0 {
			t.Errorf("%s: nothing stored was loaded on the second turn", tc.name)
		}
		if tc.name == "model switched" && stored != 0 {
			t.Errorf("%s: %d tokens of the first model's KV loaded for the second", tc.name, stored)
		}
		if _, ids := tc.first["prompt"]; ids && tokenizes != 0 {
			t.Errorf("%s: a prompt of token ids was sent to /tokenize %d times", tc.name, tokenizes)
		}
		if tc.name == "same chat" && tokenizes != 2 {
			t.Errorf("%s: %d calls to /tokenize for two turns", tc.name, tokenizes)
		}
	}
}

// TestTokenizable: requests whose prompt has content the token ids cannot
// show are not planned (a miss), the others are.
func TestTokenizable(t *testing.T) {
	for body, ok := range map[string]bool{
		`{"messages":[{"role":"user","content":"hi"}]}`:                                                    true,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"tools":[]}`:                true,
		`{"prompt":"hi","documents":null}`:                                                                 true,
		`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`:               false,
		`{"messages":[{"role":"user","content":"hi"}],"documents":[{"title":"a","text":"b"}]}`:             false,
		`{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"high"}`:                          false,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"tool_choice":"none"}`: false,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}],"tool_choice":"auto"}`: true,
		`{"prompt":[1,2,3],"truncate_prompt_tokens":2}`:                                                    false,
		`{"messages":[{"role":"user","content":"hi"}],"truncate_prompt_tokens":null}`:                      true,
		`{"prompt":"hi","prompt_embeds":"AAAA"}`:                                                           false,
		// Keys are case-sensitive, as the engine reads them.
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}],"Content":"hi"}]}`: false,
		`{"messages":[{"role":"user","content":[{"type":"image_url","Type":"text"}]}]}`:                 false,
		`{"messages":[{"role":"user","content":[{"Type":"text","text":"hi"}]}]}`:                        false,
	} {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &doc); err != nil {
			t.Fatal(err)
		}
		if err := tokenizable(doc); (err == nil) != ok {
			t.Errorf("%s: tokenizable %v, want ok %v", body, err, ok)
		}
	}
}

// TestPromptIDs: only a completion's prompt that is one non-empty list of
// token ids is taken as the ids; everything else goes to /tokenize.
func TestPromptIDs(t *testing.T) {
	for _, tc := range []struct {
		path, body string
		want       []uint32
	}{
		{"/v1/completions", `{"prompt":[1, 2,3]}`, []uint32{1, 2, 3}},
		{"/v1/completions", `{"prompt":"1 2 3"}`, nil},
		{"/v1/completions", `{"prompt":[]}`, nil},
		{"/v1/completions", `{"prompt":[[1,2],[3]]}`, nil},
		{"/v1/completions", `{"prompt":[1,-2]}`, nil},
		{"/v1/completions", `{"prompt":[1,4294967296]}`, nil},
		{"/v1/completions", `{"prompt":[1,null]}`, nil},
		{"/v1/completions", `{"prompt":["a"]}`, nil},
		{"/v1/completions", `{}`, nil},
		{"/v1/chat/completions", `{"prompt":[1,2]}`, nil},
	} {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(tc.body), &doc); err != nil {
			t.Fatal(err)
		}
		got, ok := promptIDs(tc.path, doc)
		if ok != (tc.want != nil) || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s %s: %v %v, want %v", tc.path, tc.body, got, ok, tc.want)
		}
	}
}
