package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// BenchmarkRouterLatency measures what the router adds to a request, beside
// the same requests sent to the engine directly in the same run: a request
// without a session (a pass-through) and one with a session (tokenize,
// plan, forward, commit). The engine is a stand-in that answers at once and
// saves nothing, so the figures are the router's and the store's own cost
// (the master runs in the benchmark's process). Run:
//
//	go test -run '^$' -bench 'RouterLatency$' -benchtime 2000x ./internal/router [-durability window]
func BenchmarkRouterLatency(b *testing.B) {
	p := startRouter(b, cluster.Config{MemBytes: 64 << 20, DiskBytes: 1 << 30, SessionDurability: *benchDurability},
		client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "fp16", PageTokens: 16, Order: "kv_first"}, &engine{noSave: true},
		func(cl *client.Client) Config { return Config{Planner: cl.Sessions(), SharedSessions: true} })
	up, front := p.up, p.front
	prompt := strings.TrimSpace(strings.Repeat("w ", 40))
	send := func(base, session string, i int) time.Duration {
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 4})
		req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(string(body)))
		if session != "" {
			req.Header.Set("X-Session-ID", fmt.Sprintf("%s-%d", session, i%64))
		}
		t0 := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(t0)
	}
	var direct, pass, sess []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ { // interleaved, so load on the machine hits all three alike
		direct = append(direct, send(up.URL, "", i))
		pass = append(pass, send(front.URL, "", i))
		sess = append(sess, send(front.URL, "chat", i))
	}
	b.StopTimer()
	q := func(d []time.Duration, p float64) time.Duration {
		slices.Sort(d)
		return d[int(p*float64(len(d)-1))]
	}
	dp50, dp99 := q(direct, 0.5), q(direct, 0.99)
	b.Logf("engine direct: p50 %v p99 %v", dp50, dp99)
	b.Logf("router, no session: p50 %v p99 %v (adds p50 %v, p99 %v)", q(pass, 0.5), q(pass, 0.99), q(pass, 0.5)-dp50, q(pass, 0.99)-dp99)
	b.Logf("router, session (tokenize+plan+commit): p50 %v p99 %v (adds p50 %v, p99 %v)", q(sess, 0.5), q(sess, 0.99), q(sess, 0.5)-dp50, q(sess, 0.99)-dp99)
}
