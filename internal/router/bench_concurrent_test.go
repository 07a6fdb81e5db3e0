package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// BenchmarkRouterConcurrentChats is issue 20 item 4: 64 chats at once,
// each sending its turns through the router (tokenize, plan, forward,
// commit) and, interleaved, the same request to the stand-in engine
// directly, so both see the same load; it reports what the router adds at
// p50 and p99. The engine answers at once and saves nothing, so the added
// latency is the router's and the master's own cost. Run:
//
//	go test -run '^$' -bench RouterConcurrentChats -benchtime 20x ./internal/router
//
// (b.N turns per chat.)
func BenchmarkRouterConcurrentChats(b *testing.B) {
	const chats = 64
	p := startRouter(b, cluster.Config{MemBytes: 64 << 20, DiskBytes: 1 << 30},
		client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "fp16", PageTokens: 16, Order: "kv_first"}, &engine{t: &testing.T{}, noSave: true},
		func(cl *client.Client) Config { return Config{Planner: cl.Sessions(), SharedSessions: true} })
	up, front := p.up, p.front
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * chats}}
	send := func(base, session string, turn int) (time.Duration, error) {
		prompt := strings.TrimSpace(strings.Repeat("w ", 40+8*turn)) // each turn a longer prompt
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 4})
		req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(string(body)))
		if session != "" {
			req.Header.Set("X-Session-ID", session)
		}
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("%s: %s", base, resp.Status)
		}
		return time.Since(t0), nil
	}
	var mu sync.Mutex
	var direct, routed []time.Duration
	errc := make(chan error, chats)
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := 0; w < chats; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var d, r []time.Duration
			for i := 0; i < b.N; i++ {
				x, err := send(up.URL, "", i)
				if err != nil {
					errc <- err
					return
				}
				y, err := send(front.URL, fmt.Sprintf("chat-%d", w), i)
				if err != nil {
					errc <- err
					return
				}
				d, r = append(d, x), append(r, y)
			}
			mu.Lock()
			direct, routed = append(direct, d...), append(routed, r...)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	b.StopTimer()
	select {
	case err := <-errc:
		b.Fatal(err)
	default:
	}
	q := func(d []time.Duration, p float64) time.Duration {
		slices.Sort(d)
		return d[int(p*float64(len(d)-1))]
	}
	dp50, dp99 := q(direct, 0.5), q(direct, 0.99)
	b.Logf("%d chats, %d turns each: engine direct p50 %v p99 %v; through the router with a session p50 %v p99 %v (adds p50 %v, p99 %v)",
		chats, b.N, dp50, dp99, q(routed, 0.5), q(routed, 0.99), q(routed, 0.5)-dp50, q(routed, 0.99)-dp99)
}
