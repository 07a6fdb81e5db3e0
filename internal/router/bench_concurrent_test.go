package router

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

var (
	benchDurability = flag.String("durability", "flush", "BenchmarkRouterConcurrentChats: the master's --session-durability (flush, window or sync)")
	benchGD2FS      = flag.String("gd2fs", "", "BenchmarkRouterConcurrentChats: a gd2fs binary; the master and servers then run as `gd2fs up`, a process of their own (default: in the benchmark's process)")
	benchCompute    = flag.Duration("engine-time", 0, "BenchmarkRouterConcurrentChats: how long the stand-in engine takes per completion (0: it answers at once, and 64 chats run as fast as the CPU allows)")
	benchWarmTurns  = flag.Int("warm-turns", 4, "BenchmarkRouterConcurrentChats: turns each chat makes before the measured ones")
	benchRouterProc = flag.Bool("router-process", false, "BenchmarkRouterConcurrentChats, with -gd2fs: the router runs as `gd2fs router`, a process of its own, as users run it (default: in the benchmark's process)")
	benchTokenIDs   = flag.Bool("token-ids", false, "BenchmarkRouterConcurrentChats: send each prompt as token ids (a client that tokenized already), which the router plans on without the engine's /tokenize")
	benchNoSession  = flag.Bool("no-session", false, "BenchmarkRouterConcurrentChats: the routed requests name no session, so the router only passes them on: what its hop alone costs, the floor under a planned request's")
	benchStagger    = flag.Bool("stagger", false, "BenchmarkRouterConcurrentChats: chat i starts i/64 of -engine-time after the first, so requests arrive spread over a completion's time, as users' do (default: all chats in step, 64 requests at the same instant each round)")
)

// BenchmarkRouterConcurrentChats is issue 20 item 4: 64 chats at once, each
// a long chat (-warm-turns turns not measured, then b.N measured turns). A
// turn sends the chat's whole prompt (a system prompt and every earlier
// turn, growing) to the stand-in engine directly and then the same prompt
// through the router with the chat's session, so both see the same load.
// Through the router the engine saves the fresh blocks of the prompt (real
// writes to the servers, so every plan after the first has a stored part
// whose content is checked), and it says in a header how long saving took;
// that time is the engine's, so it is taken off the routed request's
// latency. What is left above the direct request is the router's cost:
// the engine's /tokenize, the master's plan, the JSON, the extra hop, and a
// wait for the previous turn's commit when it is still running. Run:
//
//	go test -run '^$' -bench RouterConcurrentChats -benchtime 20x ./internal/router
//	go test -run '^$' -bench RouterConcurrentChats -benchtime 20x ./internal/router -durability window
//	go test -run '^$' -bench RouterConcurrentChats -benchtime 20x ./internal/router -token-ids
//	go build -o /tmp/gd2fs ./cmd/gd2fs &&
//	  go test -run '^$' -bench RouterConcurrentChats -benchtime 20x ./internal/router -gd2fs /tmp/gd2fs
//
// The router, the engine and the chats run in the benchmark's process, and
// the master and servers too unless -gd2fs is given.
func BenchmarkRouterConcurrentChats(b *testing.B) {
	const chats = 64
	l := client.Layout{Model: "m", Layers: 2, KVHeads: 2, HeadDim: 4, DType: "fp16", PageTokens: 16, Order: "kv_first"}
	e := &engine{timeSaves: true, compute: *benchCompute}
	cfg := func(cl *client.Client) Config { return Config{Planner: cl.Sessions(), SharedSessions: true} }
	var p parts
	where := "in process"
	masterPID, routerPID := 0, 0
	front := "" // the router's URL when it runs as a process
	if *benchGD2FS != "" {
		where = "gd2fs up, its own process"
		var cl *client.Client
		var master string
		cl, masterPID, master = startUp(b, *benchGD2FS, *benchDurability)
		p = startRouterOn(b, cl, l, e, cfg)
		p.master = master
		if *benchRouterProc {
			where = "gd2fs up and gd2fs router, processes of their own"
			front, routerPID = startRouterProcess(b, *benchGD2FS, master, p.up.URL, l.Model)
		}
	} else {
		p = startRouter(b, cluster.Config{MemBytes: 64 << 20, DiskBytes: 1 << 30, SessionDurability: *benchDurability}, l, e, cfg)
	}
	if front == "" {
		front = p.front.URL
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * chats}}
	// A chat's prompt at turn t: a shared system prompt of 200 words, then
	// 60 words a turn, so every turn adds about 4 blocks to the session.
	words := make([]string, 200+60*(*benchWarmTurns+b.N+1))
	for i := range words {
		words[i] = "w" + strconv.Itoa(i%997)
	}
	// send posts one turn and returns its latency less the engine's time
	// saving KV (zero for a direct request).
	send := func(base, session string, turn int) (time.Duration, error) {
		var prompt any = strings.Join(words[:200+60*turn], " ")
		if *benchTokenIDs {
			prompt = wordIDs(prompt.(string))
		}
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
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		if err != nil {
			return 0, err
		}
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("%s: %s", base, resp.Status)
		}
		if s := resp.Header.Get("X-Engine-Save"); s != "" {
			save, err := time.ParseDuration(s)
			if err != nil {
				return 0, err
			}
			d -= save
		}
		return d, nil
	}
	var mu sync.Mutex
	var direct, routed []time.Duration
	errc := make(chan error, chats)
	run := func(from, to int, keep bool) {
		var wg sync.WaitGroup
		for w := 0; w < chats; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				if *benchStagger {
					// Each phase (warm-up, measured) starts after every
					// chat ended the one before, so each is staggered
					// anew; within it the chats keep their phase (each
					// turn takes one engine time plus the router's cost).
					time.Sleep(time.Duration(w) * *benchCompute / chats)
				}
				var d, r []time.Duration
				for i := from; i < to; i++ {
					x, err := send(p.up.URL, "", i)
					if err != nil {
						errc <- err
						return
					}
					session := fmt.Sprintf("chat-%d", w)
					if *benchNoSession {
						session = ""
					}
					y, err := send(front, session, i)
					if err != nil {
						errc <- err
						return
					}
					d, r = append(d, x), append(r, y)
				}
				if keep {
					mu.Lock()
					direct, routed = append(direct, d...), append(routed, r...)
					mu.Unlock()
				}
			}(w)
		}
		wg.Wait()
		select {
		case err := <-errc:
			b.Fatal(err)
		default:
		}
	}
	run(0, *benchWarmTurns, false)
	before := routerCounters(b, front)
	mbefore := masterSessionRequests(b, p.master)
	e.mu.Lock()
	e.saves = nil
	e.mu.Unlock()
	cpu0, mcpu0, rcpu0 := cpuSeconds(b, 0), cpuSeconds(b, masterPID), 0.0
	if routerPID != 0 {
		rcpu0 = cpuSeconds(b, routerPID)
	}
	b.ResetTimer()
	run(*benchWarmTurns, *benchWarmTurns+b.N, true)
	b.StopTimer()
	cpu, mcpu, rcpu := cpuSeconds(b, 0)-cpu0, cpuSeconds(b, masterPID)-mcpu0, 0.0
	if routerPID != 0 {
		rcpu = cpuSeconds(b, routerPID) - rcpu0
	}
	after := routerCounters(b, front)
	mafter := masterSessionRequests(b, p.master)
	q := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0 // no saves: the routed requests named no session
		}
		slices.Sort(d)
		return d[int(p*float64(len(d)-1))]
	}
	dp50, dp99 := q(direct, 0.5), q(direct, 0.99)
	rp50, rp99 := q(routed, 0.5), q(routed, 0.99)
	e.mu.Lock()
	saves := e.saves
	e.mu.Unlock()
	diff := func(k string) float64 { return after[k] - before[k] }
	b.Logf("%d chats, %d warm-up + %d measured turns each, engine time %v, durability %s, master %s, staggered %v, routed requests without a session %v",
		chats, *benchWarmTurns, b.N, *benchCompute, *benchDurability, where, *benchStagger, *benchNoSession)
	b.Logf("engine alone p50 %v p99 %v; through the router (less the engine's save) p50 %v p99 %v; router adds p50 %v p99 %v",
		dp50, dp99, rp50, rp99, rp50-dp50, rp99-dp99)
	b.Logf("the engine's save (not counted) p50 %v p99 %v; measured turns: %.0f plans, %.0f misses, %.0f commits, %.0f commit failures, %.0f%% of prompt tokens cached",
		q(saves, 0.5), q(saves, 0.99), diff("gd2fs_router_plans_total"), diff("gd2fs_router_store_misses_total"),
		diff("gd2fs_router_commits_total"), diff("gd2fs_router_commit_failures_total"),
		100*diff("gd2fs_router_cached_tokens_total")/(diff("gd2fs_router_cached_tokens_total")+diff("gd2fs_router_prefill_tokens_total")))
	mean := func(h string) time.Duration {
		if n := diff(h + "_count"); n > 0 {
			return time.Duration(diff(h+"_sum") / n * 1e9)
		}
		return 0
	}
	if _, ok := after["gd2fs_router_tokenize_seconds_count"]; ok {
		b.Logf("means through the router: waiting for the previous turn's commit %v, /tokenize %v, /tokenize and the master's plan %v (its p50 at most %v, p99 at most %v)",
			mean("gd2fs_router_commit_wait_seconds"), mean("gd2fs_router_tokenize_seconds"), mean("gd2fs_router_plan_seconds"),
			bucketQuantile(before, after, "gd2fs_router_plan_seconds", 0.5), bucketQuantile(before, after, "gd2fs_router_plan_seconds", 0.99))
	}
	turns := float64(chats * b.N)
	md := func(r string) float64 { return mafter[r] - mbefore[r] }
	b.Logf("master requests a measured routed turn: plans %.2f alone + %.2f batches, commits %.2f alone + %.2f plain batches + %.2f engine batches",
		md("POST /v1/sessions/{id}/plan")/turns, md("POST /v1/sessions/plans")/turns,
		md("POST /v1/sessions/{id}/commit")/turns, md("POST /v1/sessions/commits")/turns, md("POST /v1/sessions/commits/saved")/turns)
	if n := md("count POST /v1/sessions/{id}/plan"); n > 0 {
		// The master's histogram: handler start to answer written.
		b.Logf("the master's own mean time for a plan sent alone: %v", time.Duration(md("sum POST /v1/sessions/{id}/plan")/n*1e9))
	}
	if n := md("count POST /v1/sessions/{id}/commit"); n > 0 {
		b.Logf("the master's own mean time for a commit sent alone: %v", time.Duration(md("sum POST /v1/sessions/{id}/commit")/n*1e9))
	}
	if routerPID != 0 {
		b.Logf("CPU per turn (a direct and a routed request): the benchmark's process (chats, engine) %.2f ms, gd2fs router %.2f ms, gd2fs up (master, servers) %.2f ms", 1e3*cpu/turns, 1e3*rcpu/turns, 1e3*mcpu/turns)
	} else if masterPID != 0 {
		b.Logf("CPU per turn (a direct and a routed request): the benchmark's process (chats, engine, router) %.2f ms, gd2fs up (master, servers) %.2f ms", 1e3*cpu/turns, 1e3*mcpu/turns)
	} else {
		b.Logf("CPU per turn (a direct and a routed request): the benchmark's process (chats, engine, router, master, servers) %.2f ms", 1e3*cpu/turns)
	}
	if diff("gd2fs_router_store_misses_total") != 0 || diff("gd2fs_router_commit_failures_total") != 0 {
		b.Errorf("the store missed plans or refused commits: the figures are not of the cached path")
	}
	b.ReportMetric(float64(rp50-dp50)/1e6, "added-p50-ms")
	b.ReportMetric(float64(rp99-dp99)/1e6, "added-p99-ms")
}

// routerCounters reads the router's counters (untyped lines of /metrics).
func routerCounters(tb testing.TB, base string) map[string]float64 {
	tb.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") && !strings.Contains(name, "_bucket{le=") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			tb.Fatalf("metrics line %q: %v", sc.Text(), err)
		}
		out[name] = f
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// bucketQuantile is the upper bound of the bucket of histogram h that holds
// its q quantile of the observations made between the counters before and
// after (routerCounters), or -1 when there were none or it is beyond the
// last bucket.
func bucketQuantile(before, after map[string]float64, h string, q float64) time.Duration {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for k, v := range after {
		le, ok := strings.CutPrefix(k, h+`_bucket{le="`)
		if !ok {
			continue
		}
		le = strings.TrimSuffix(le, `"}`)
		f, err := strconv.ParseFloat(le, 64)
		if err != nil || le == "+Inf" {
			continue // +Inf's is the count
		}
		bs = append(bs, bucket{f, v - before[k]})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	total := after[h+"_count"] - before[h+"_count"]
	for _, b := range bs {
		if total > 0 && b.n >= q*total {
			return time.Duration(b.le * 1e9)
		}
	}
	return -1
}

// masterSessionRequests reads the master's request counters by route
// (every status) from its /metrics.
func masterSessionRequests(tb testing.TB, base string) map[string]float64 {
	tb.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		// The request counters by route, and the request time's sum and
		// count by route under "sum ROUTE" and "count ROUTE".
		prefix := ""
		switch {
		case strings.HasPrefix(line, "gd2fs_master_requests_total{"):
		case strings.HasPrefix(line, "gd2fs_master_request_seconds_sum{"):
			prefix = "sum "
		case strings.HasPrefix(line, "gd2fs_master_request_seconds_count{"):
			prefix = "count "
		default:
			continue
		}
		_, route, ok := strings.Cut(line, `route="`)
		j := strings.LastIndexByte(line, ' ')
		if !ok || j < 0 || strings.IndexByte(route, '"') < 0 {
			tb.Fatalf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err != nil {
			tb.Fatalf("metrics line %q: %v", line, err)
		}
		out[prefix+route[:strings.IndexByte(route, '"')]] += v
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// cpuSeconds is the user and system CPU time process pid has used (0: this
// process), from /proc.
func cpuSeconds(tb testing.TB, pid int) float64 {
	tb.Helper()
	name := "/proc/self/stat"
	if pid != 0 {
		name = "/proc/" + strconv.Itoa(pid) + "/stat"
	}
	b, err := os.ReadFile(name)
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command's closing parenthesis: utime and stime are
	// the 12th and 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		tb.Fatalf("%s: %q", name, b)
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	s, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("%s: %q", name, b)
	}
	return (u + s) / 100
}

// startUp runs `bin up` (a master on SQLite and 3 servers, one process, as
// a user runs it) with the given session durability and returns a client of
// it, the process id and the master's URL, once its servers are up. The
// process ends with tb.
func startUp(tb testing.TB, bin, durability string) (*client.Client, int, string) {
	tb.Helper()
	addr := freeAddr(tb)
	cmd := startProcess(tb, bin, "up", "--dir", tb.TempDir(), "--listen", addr, "--port", "0", "--resp-port", "0",
		"--servers", "3", "--mem", "64MiB", "--session-durability", durability)
	cl, err := client.New(client.Config{Master: "http://" + addr})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cl.Close() })
	// Set-up, not a measurement: poll until the three servers are up.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := cl.Status(ctx)
		n := 0
		for _, s := range st.Servers {
			if err == nil && s.State == "up" {
				n++
			}
		}
		if n == 3 {
			return cl, cmd.Process.Pid, "http://" + addr
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("gd2fs up at %s: 3 servers not up within 60 s (%v)", addr, err)
		case <-tick.C:
		}
	}
}

// startRouterProcess runs `bin router` (shared sessions, as the in-process
// router is configured) in front of upstream and returns its URL and
// process id once it answers /metrics. The process ends with tb.
func startRouterProcess(tb testing.TB, bin, master, upstream, model string) (string, int) {
	tb.Helper()
	addr := freeAddr(tb)
	cmd := startProcess(tb, bin, "router", "--master", master, "--listen", addr, "--upstream", upstream, "--model", model, "--shared-sessions")
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/metrics")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return base, cmd.Process.Pid
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("gd2fs router at %s: no answer within 30 s (%v)", addr, err)
		}
		time.Sleep(50 * time.Millisecond) // set-up, not a measurement
	}
}

// freeAddr is a loopback address no one listens on (a moment ago).
func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startProcess starts bin with args, its standard error on the test's,
// interrupted and waited for when tb ends.
func startProcess(tb testing.TB, bin string, args ...string) *exec.Cmd {
	tb.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // an interrupted run leaves nothing behind
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	return cmd
}
