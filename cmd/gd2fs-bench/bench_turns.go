package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/frames"
	"github.com/spf13/cobra"
)

// The turns benchmark is issue 20's measurement as a command: a router-like
// client runs chat turns (Sessions().Plan, the fresh range written to the
// servers, Commit) against a master and three servers, each its own process,
// on sessions that already hold a turn. It reports what a scheduler sees
// (turns/s, plan and commit latency), what the master spends (CPU seconds
// per 1,000 turns, master requests per turn by route, its own time for a
// plan and its goroutines' waits for a CPU, both from its metrics, to tell
// a slow master from a busy machine) and, as the reference, the same
// client's plain KV put and get of the same bytes.

func newBenchTurns() *cobra.Command {
	var metaDSN string
	var sessions, conc, servers int
	var turnTokens, prefixTokens int64
	var duration time.Duration
	var oldPath, enginePath, prefault, coalesce, plainHTTP, reference bool
	var coalesceInFlight int
	var rate, newShare float64
	var serverMem, durability, model, quota, sessionMem string
	cmd := &cobra.Command{
		Use:   "turns",
		Short: "Explicit-mode chat turns per second (plan, write, commit) with master and servers as separate processes",
		Example: `  go build -o gd2fs ./cmd/gd2fs && go build -o gd2fs-bench ./cmd/gd2fs-bench
  ./gd2fs-bench turns --sessions 100000 --concurrency 64 --turn-tokens 200 --duration 30s
  ./gd2fs-bench turns --meta 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
  # the leader answering turns at once and writing them just behind
  ./gd2fs-bench turns --sessions 10000 --session-durability window
  # latency at a given load rather than at saturation: 500 turns started a second
  ./gd2fs-bench turns --sessions 10000 --rate 500
  # a quarter of the turns start a new chat (a session's first plan and file)
  ./gd2fs-bench turns --sessions 10000 --session-durability window --new-chats 0.25
  # every chat starts from a shared 1,000-token system prompt registered as a prefix
  ./gd2fs-bench turns --sessions 10000 --session-durability window --new-chats 0.25 --prefix-tokens 1000
  # the turn as an engine saves it through pygd2fs (its writes, then the commit of what it saved)
  ./gd2fs-bench turns --sessions 10000 --session-durability window --engine-path
  # a full cache: the set-up fills the quota, so the turns' plans evict
  ./gd2fs-bench turns --sessions 2000 --session-quota 64MiB
  # a real model's KV (128 KiB a token): plans that allocate chunks, at a rate the bytes allow
  ./gd2fs-bench turns --model llama-8b --sessions 32 --concurrency 8 --rate 10 --duration 10s --server-mem 2GiB`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sessions < 1 || conc < 1 || turnTokens < 1 || servers < 1 || duration <= 0 {
				return fmt.Errorf("--sessions, --concurrency, --turn-tokens, --servers and --duration must be positive")
			}
			if prefixTokens < 0 || prefixTokens > 1<<20 {
				return fmt.Errorf("--prefix-tokens %d: from 0 (none) to 1048576", prefixTokens)
			}
			if rate < 0 || rate > 1e6 {
				return fmt.Errorf("--rate %g: give turns started a second, 0 (every chat starts its next turn at once) up to 1000000", rate)
			}
			if _, err := parseSize(serverMem); err != nil {
				return fmt.Errorf("--server-mem: %w", err)
			}
			l, ok := turnsLayouts[model]
			if !ok {
				return fmt.Errorf("--model %q: small (256 bytes of KV a token) or llama-8b (128 KiB a token)", model)
			}
			turnsLayout = l
			var masterArgs []string
			if durability != "" {
				masterArgs = []string{"--session-durability", durability}
			}
			if quota != "" {
				if _, err := parseSize(quota); err != nil {
					return fmt.Errorf("--session-quota: %w", err)
				}
				masterArgs = append(masterArgs, "--session-quota", quota)
			}
			if sessionMem != "" {
				if _, err := parseSize(sessionMem); err != nil {
					return fmt.Errorf("--session-memory: %w", err)
				}
				masterArgs = append(masterArgs, "--session-memory", sessionMem)
			}
			ccfg := client.Config{NoCoalesce: !coalesce, CoalesceInFlight: coalesceInFlight, PlainHTTP: plainHTTP}
			if newShare < 0 || newShare > 1 {
				return fmt.Errorf("--new-chats %v: a share from 0 to 1", newShare)
			}
			if oldPath && enginePath {
				return fmt.Errorf("--sync-path and --engine-path are two ways of a turn: give one")
			}
			way := turnWritten
			switch {
			case oldPath:
				way = turnSynced
			case enginePath:
				way = turnEngine
			}
			return benchTurns(context.Background(), metaDSN, serverMem, sessions, conc, servers, turnTokens, prefixTokens, duration, way, prefault, masterArgs, ccfg, rate, newShare, reference)
		},
	}
	f := cmd.Flags()
	f.StringVar(&metaDSN, "meta", "", "metadata store of the master (default: a temp SQLite file, as gd2fs up uses)")
	f.IntVar(&sessions, "sessions", 100000, "sessions created (one turn each) before the measurement; each holds at least one 64 KiB block on a server (size --server-mem to fit)")
	f.StringVar(&serverMem, "server-mem", "3GiB", "DRAM tier of each server")
	f.IntVar(&conc, "concurrency", 64, "turns in flight at once")
	f.IntVar(&servers, "servers", 3, "data servers, each its own process")
	f.Int64Var(&turnTokens, "turn-tokens", 200, "new tokens per turn")
	f.Int64Var(&prefixTokens, "prefix-tokens", 0, "a shared system prompt of this many tokens, registered as a prefix (its KV written once) that every chat starts from; 0: none")
	f.StringVar(&quota, "session-quota", "", "the master's --session-quota (default: the master's own, no limit): a quota the set-up fills makes the measured plans evict")
	f.Float64Var(&newShare, "new-chats", 0, "share of the measured turns that start a new chat (a session's first plan and file, as a router sees new conversations); 0: every turn continues one of --sessions")
	f.StringVar(&sessionMem, "session-memory", "", "the master's --session-memory (default: the master's own, no bound): a cap below the sessions' size makes plans of sessions dropped from memory run in SQL")
	f.StringVar(&model, "model", "small", "KV layout of the turns: small (256 bytes a token: the turn's shape, not its bytes) or llama-8b (128 KiB a token: a 16 MiB chunk every 128 tokens; size --server-mem for the bytes and use --rate)")
	f.DurationVar(&duration, "duration", 30*time.Second, "how long turns are measured")
	f.StringVar(&durability, "session-durability", "", "the master's --session-durability: flush, window or sync (default: the master's own, flush; leave it out for a gd2fs binary from before it)")
	f.BoolVar(&prefault, "server-prefault", true, "start the servers with --mem-prefault and measure once their DRAM tiers are resident, as on a server that has run until its tiers were full (false: pages are faulted in by the measured writes; needed for a gd2fs binary from before the flag)")
	f.BoolVar(&coalesce, "coalesce", !(client.Config{}).NoCoalesce, "send the client's concurrent plans, and its concurrent commits, to the master in batches (client.Config.NoCoalesce; default: the client's default); false: every call its own request")
	f.IntVar(&coalesceInFlight, "coalesce-inflight", 0, "batches of each kind in flight before calls queue for the next (client.Config.CoalesceInFlight; 0: the client's default)")
	f.BoolVar(&reference, "reference", true, "time a call the master answers at once (an empty batch of plans) every 5 ms while the turns run, the reference of a plan's time; its 200 calls a second are in the client's and master's CPU (false: none, as before the twentieth session, for comparisons of turns/s)")
	f.BoolVar(&plainHTTP, "plain-http", false, "send the client's plans and commits as HTTP requests (client.Config.PlainHTTP), not on framed connections: the transport before them, for comparison")
	f.Float64Var(&rate, "rate", 0, "turns started a second (open loop: a turn starts on schedule when one of the --concurrency chats is idle, else it is counted as missed); 0: every chat starts its next turn as soon as one ends (saturation)")
	f.BoolVar(&oldPath, "sync-path", false, "write with WriteFresh (open, write, Sync) and Commit, the turn before WriteAndCommit, for comparison")
	f.BoolVar(&enginePath, "engine-path", false, "the turn as an engine saves it through pygd2fs: one open handle a session file, the write, a Sync only when the master does not mark the file CommitRecordsSize (masters before the twenty-first session), and the commit of the saved segments (CommitSaved)")
	return cmd
}

// turnWay is how a turn writes its fresh range and commits it.
type turnWay int

const (
	turnWritten turnWay = iota // WriteAndCommit: the plan's fresh_files, one commit that records the size
	turnSynced                 // WriteFresh (write, Sync) and Commit
	turnEngine                 // pygd2fs's way: a handle a file, Sync only where needed, CommitSaved
)

// turnsLayouts are the models --model names. small: 256 bytes of KV per
// token, so the benchmark measures the turn's shape, not the bytes moved
// (a session file's 16 MiB chunk holds 65,536 tokens). llama-8b: Llama
// 3.1 8B's KV (32 layers, 8 KV heads of 128, fp16: 128 KiB a token), so a
// chunk holds 128 tokens and nearly every turn's plan allocates one; its
// bytes bound the rate, so run it with --rate and few sessions.
var turnsLayouts = map[string]client.Layout{
	"small":    {Model: "bench-small", Layers: 2, KVHeads: 1, HeadDim: 32, DType: "fp16", PageTokens: 16, Order: "layer_first"},
	"llama-8b": {Model: "bench-llama-8b", Layers: 32, KVHeads: 8, HeadDim: 128, DType: "fp16", PageTokens: 16, Order: "layer_first"},
}

// turnsLayout is the layout the run uses (--model).
var turnsLayout = turnsLayouts["small"]

func benchTurns(ctx context.Context, metaDSN, serverMem string, sessions, conc, servers int, turnTokens, prefixTokens int64, duration time.Duration, way turnWay, prefault bool, masterArgs []string, ccfg client.Config, rate, newShare float64, reference bool) error {
	dir, err := os.MkdirTemp("", "gd2fs-benchturns-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if metaDSN == "" {
		metaDSN = "sqlite://" + filepath.Join(dir, "meta.db")
	}
	var serverArgs []string
	if prefault {
		serverArgs = []string{"--mem-prefault"}
	}
	procs, url, err := startProcs(ctx, dir, metaDSN, serverMem, servers, masterArgs, serverArgs)
	if err != nil {
		return err
	}
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			stopProc(procs[i])
		}
	}()
	ccfg.Master = url
	cl, err := client.New(ccfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	ss := cl.Sessions()
	if err := ss.SetLayout(ctx, turnsLayout); err != nil {
		return err
	}
	// The shared system prompt: its KV written once, registered with its
	// ids (every chat's prompt starts with ids 0..prefixTokens-1), so a
	// session's first plan finds it stored.
	var prefixes []string
	if prefixTokens > 0 {
		const path = "/kv-bench-prefix/system"
		f, err := cl.Create(ctx, path, client.CreateOptions{Pool: "perf", Overwrite: true})
		if err == nil {
			_, err = f.Write(make([]byte, turnsLayout.RangeBytes(prefixTokens)))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil {
			err = ss.RegisterPrefixIDs(ctx, path, turnsLayout.Model, tokenIDs(0, prefixTokens))
		}
		if err != nil {
			return fmt.Errorf("the shared prefix: %w", err)
		}
		prefixes = []string{path}
	}
	run := fmt.Sprintf("t%d-", time.Now().UnixNano()%1e9)
	id := func(i int) string { return fmt.Sprintf("%s%07d", run, i) }
	tokens := make([]atomic.Int64, sessions) // committed tokens per session
	locks := make([]sync.Mutex, sessions)    // one turn of a session at a time, as a chat has
	// turn runs one chat turn of session i. kv holds the engine's KV for the
	// fresh range: a buffer the caller keeps, as an engine's KV memory is
	// there before the turn, so the client's CPU is the turn's, not the
	// allocation and first touch of 53 KB of fresh heap a turn.
	// engineSave writes the fresh range as pygd2fs's Write does
	// (python/bridge/transfer.go): through one handle a session file,
	// opened on its first write and kept, with a Sync after the write
	// unless the master marked the file CommitRecordsSize.
	type handle struct {
		f    *client.File
		sync bool
	}
	var handles sync.Map // path -> *handle
	engineSave := func(p client.Plan, kv []byte) error {
		for _, r := range p.Fresh {
			u, err := client.ParseURI(r.KVURI)
			if err != nil {
				return err
			}
			v, ok := handles.Load(u.Path)
			if !ok {
				f, err := cl.Open(ctx, u.Path)
				if err != nil {
					return err
				}
				v, _ = handles.LoadOrStore(u.Path, &handle{f: f, sync: !f.Info().CommitRecordsSize})
			}
			h := v.(*handle)
			if _, err := h.f.WriteAtContext(ctx, kv[:r.KVLength], r.KVStart); err != nil {
				return err
			}
			if h.sync {
				if err := h.f.Sync(ctx); err != nil {
					return err
				}
			}
			kv = kv[r.KVLength:]
		}
		return nil
	}
	// chat is one turn of session sid, which holds have tokens: plan,
	// write the fresh range, commit. It returns the tokens held after.
	chat := func(sid string, have int64, kv *[]byte) (plan, commit time.Duration, held int64, err error) {
		t0 := time.Now()
		if have == 0 {
			have = prefixTokens // a new chat's prompt: the system prompt, then the user's
		}
		p, err := ss.Plan(ctx, sid, client.PlanRequest{Model: turnsLayout.Model, TokenIDs: tokenIDs(0, have+turnTokens), Prefixes: prefixes})
		if err != nil {
			return 0, 0, 0, err
		}
		t1 := time.Now()
		var n int64
		for _, r := range p.Fresh {
			n += r.KVLength
		}
		if int64(cap(*kv)) < n {
			*kv = make([]byte, n)
		}
		b := (*kv)[:n]
		var s client.Session
		switch way {
		case turnSynced:
			if err = ss.WriteFresh(ctx, p, b); err == nil {
				s, err = ss.Commit(ctx, sid, p.PlanID)
			}
		case turnEngine:
			if err = engineSave(p, b); err == nil {
				s, err = ss.CommitSaved(ctx, sid, p.PlanID, p.Fresh)
			}
		default:
			s, err = ss.WriteAndCommit(ctx, sid, p, b)
		}
		if err != nil {
			return 0, 0, 0, err
		}
		return t1.Sub(t0), time.Since(t1), s.Tokens, nil
	}
	turn := func(i int, kv *[]byte) (plan, commit time.Duration, err error) {
		locks[i].Lock()
		defer locks[i].Unlock()
		plan, commit, held, err := chat(id(i), tokens[i].Load(), kv)
		if err == nil {
			tokens[i].Store(held)
		}
		return plan, commit, err
	}
	// A new chat: a session's first turn (its first plan, its file).
	var newChats atomic.Int64
	firstTurn := func(kv *[]byte) (plan, commit time.Duration, err error) {
		plan, commit, _, err = chat(fmt.Sprintf("new-%d", newChats.Add(1)), 0, kv)
		return plan, commit, err
	}
	// Set-up: every session gets its first turn.
	start := time.Now()
	if err := parallel(conc, sessions, func(i int) error { var kv []byte; _, _, err := turn(i, &kv); return err }); err != nil {
		return fmt.Errorf("set-up: %w", err)
	}
	resident := "DRAM tiers faulted in by the writes"
	if prefault {
		mem, _ := parseSize(serverMem)
		if err := waitResident(procs[1:], mem+turnsKVMem); err != nil {
			return err
		}
		resident = "DRAM tiers resident (--mem-prefault)"
	}
	coal := "coalesced plans and commits"
	if ccfg.NoCoalesce || ccfg.CoalesceInFlight < 0 {
		coal = "every call alone"
	} else if ccfg.CoalesceInFlight > 0 {
		coal += fmt.Sprintf(" (%d batches in flight)", ccfg.CoalesceInFlight)
	}
	if ccfg.PlainHTTP {
		coal += ", as HTTP requests"
	} else {
		coal += ", on framed connections"
	}
	pre := ""
	if prefixTokens > 0 {
		pre = fmt.Sprintf(" after a shared %d-token prefix", prefixTokens)
	}
	var synced int
	handles.Range(func(_, v any) bool {
		if v.(*handle).sync {
			synced++
		}
		return true
	})
	how := [...]string{turnWritten: "WriteAndCommit", turnSynced: "WriteFresh (with a Sync) and Commit",
		turnEngine: fmt.Sprintf("the engine's way (a handle a file, a Sync on %d files, CommitSaved)", synced)}[way]
	fmt.Printf("bench turns: %s, %d servers (%s), %d sessions set up in %s, %d concurrent turns of %d tokens%s of %s (%d bytes), written by %s, %s, load average %s\n",
		engineName(metaDSN), servers, resident, sessions, time.Since(start).Round(time.Millisecond), conc, turnTokens, pre,
		turnsLayout.Model, turnsLayout.RangeBytes(turnTokens), how, coal, loadAvg())

	before, err := masterRequests(ctx, url)
	if err != nil {
		return err
	}
	// CPU by process: this client, the master, the servers.
	meters := []*cpuMeter{{pids: []int{os.Getpid()}}, {pids: []int{procs[0].Process.Pid}}, {}}
	for _, p := range procs[1:] {
		meters[2].pids = append(meters[2].pids, p.Process.Pid)
	}
	var pgm *pgMeter
	walStart := "" // the PostgreSQL server's WAL position at the start
	if engineName(metaDSN) == "PostgreSQL" {
		if walStart, _, err = pgWAL(ctx, metaDSN, ""); err != nil {
			return fmt.Errorf("read the PostgreSQL server's WAL position: %w", err)
		}
		if pm, err := postmasterOf(ctx, metaDSN); err != nil {
			return fmt.Errorf("find the PostgreSQL server's processes: %w", err)
		} else if pm > 0 {
			pgm = &pgMeter{postmaster: pm}
			pgm.Start()
		}
	}
	for _, m := range meters {
		m.Start()
	}
	// The master's system calls: with the requests the same whatever the
	// binary, the difference between two binaries is their SQL store's
	// pages (SQLite writes a WAL frame in two pwrites).
	w0, r0, wb0, ioOK := procIO(procs[0].Process.Pid)
	var mu sync.Mutex
	var plans, commits []time.Duration
	var failed, missed atomic.Int64
	deadline := time.Now().Add(duration)
	t0 := time.Now()
	// With --rate a scheduler hands each turn to an idle chat at its time
	// (an unbuffered send succeeds only if one waits); without, each chat
	// starts its next turn as soon as one ends.
	var sched chan struct{}
	if rate > 0 {
		sched = make(chan struct{})
		go func() {
			defer close(sched)
			iv := time.Duration(float64(time.Second) / rate)
			for k := int64(0); ; k++ {
				due := t0.Add(time.Duration(k) * iv)
				if !due.Before(deadline) {
					return
				}
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				select {
				case sched <- struct{}{}:
				default:
					missed.Add(1)
				}
			}
		}()
	}
	next := func() bool {
		if sched == nil {
			return time.Now().Before(deadline)
		}
		_, ok := <-sched
		return ok
	}
	// The reference of a plan's time in the same run: a call the master
	// answers at once, on the client's transport, while the turns load the
	// machine. A plan's time beyond it is the plan's; the rest, the
	// processes' wake-ups on a busy machine.
	probeDone := make(chan probeResult, 1)
	if reference {
		go func() { probeDone <- probeMaster(ctx, url, ccfg.PlainHTTP, deadline) }()
	} else {
		probeDone <- probeResult{}
	}
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 20))
			var ps, cs []time.Duration
			var kv []byte
			for next() {
				var p, c time.Duration
				var err error
				if newShare > 0 && r.Float64() < newShare {
					p, c, err = firstTurn(&kv)
				} else {
					p, c, err = turn(r.IntN(sessions), &kv)
				}
				if err != nil {
					if failed.Add(1) == 1 {
						fmt.Fprintln(os.Stderr, "  turn failed:", err)
					}
					continue
				}
				ps, cs = append(ps, p), append(cs, c)
			}
			mu.Lock()
			plans, commits = append(plans, ps...), append(commits, cs...)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	el := time.Since(t0)
	var cpu [3]time.Duration
	for i, m := range meters {
		cpu[i] = m.total() - m.start
	}
	var pgCPU time.Duration
	if pgm != nil {
		pgCPU = pgm.total()
	}
	var walBytes int64
	if walStart != "" {
		// The run is done: a failed read loses this line, not the run.
		if _, walBytes, err = pgWAL(ctx, metaDSN, walStart); err != nil {
			fmt.Fprintf(os.Stderr, "bench turns: the PostgreSQL server's WAL position after the run: %v (its line is left out)\n", err)
			walStart = ""
		}
	}
	w1, r1, wb1, ioOK1 := procIO(procs[0].Process.Pid)
	probes := <-probeDone
	after, err := masterRequests(ctx, url)
	if err != nil {
		return err
	}
	// The reference calls are not the turns': off the master's counts
	// (their CPU, about 3 % of the master's at 1,000 turns/s, stays in).
	after["POST /v1/sessions/plans"] -= float64(probes.sent)
	if _, ok := after["framed"]; ok && !ccfg.PlainHTTP {
		after["framed"] -= float64(probes.sent)
	}
	n := len(plans)
	if n == 0 {
		return fmt.Errorf("no turn completed in %s (%d failed)", duration, failed.Load())
	}
	fmt.Printf("  %d turns in %s: %.0f turns/s, %d failed; load average %s\n", n, el.Round(time.Millisecond), float64(n)/el.Seconds(), failed.Load(), loadAvg())
	if newShare > 0 {
		fmt.Printf("  of which new chats (a session's first turn): %d (%.0f%%)\n", newChats.Load(), 100*float64(newChats.Load())/float64(n))
	}
	if rate > 0 {
		fmt.Printf("  offered %.0f turns/s: %d turns missed their start (all %d chats busy)\n", rate, missed.Load(), conc)
	}
	fmt.Printf("  plan:           p50 %s, p99 %s\n", dur(pct(plans, 50)), dur(pct(plans, 99)))
	fmt.Printf("  write + commit: p50 %s, p99 %s\n", dur(pct(commits, 50)), dur(pct(commits, 99)))
	if ts := probes.times; len(ts) > 0 {
		fmt.Printf("  reference in the same run: a call the master answers at once (%d, one each %s, on the same transport): p50 %s, p99 %s\n",
			len(ts), probeEvery, dur(pct(ts, 50)), dur(pct(ts, 99)))
		fmt.Printf("  a plan against that call: p50 %s, p99 %s\n", times(pct(plans, 50), pct(ts, 50)), times(pct(plans, 99), pct(ts, 99)))
	}
	per := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(n) }
	fmt.Printf("  master CPU: %.2f s per 1,000 turns\n", per(cpu[1]))
	fmt.Printf("  CPU per 1,000 turns: client %.2f s, master %.2f s, %d servers %.2f s; all %.2f s (%.2f cores busy)\n",
		per(cpu[0]), per(cpu[1]), len(procs)-1, per(cpu[2]), per(cpu[0]+cpu[1]+cpu[2]), (cpu[0]+cpu[1]+cpu[2]).Seconds()/el.Seconds())
	if pgm != nil {
		all := cpu[0] + cpu[1] + cpu[2] + pgCPU
		fmt.Printf("  PostgreSQL on this machine (postmaster %d and all its processes, other databases' work included): %.2f s per 1,000 turns; with it all %.2f s (%.2f cores busy)\n",
			pgm.postmaster, per(pgCPU), per(all), all.Seconds()/el.Seconds())
	}
	if walStart != "" {
		fmt.Printf("  PostgreSQL's WAL (the whole server's, other databases' included): %.1f KiB a turn\n", float64(walBytes)/1024/float64(n))
	}
	if ioOK && ioOK1 {
		fmt.Printf("  master system calls per turn (files and sockets): %.1f writes of %.1f KiB, %.1f reads\n",
			float64(w1-w0)/float64(n), float64(wb1-wb0)/1024/float64(n), float64(r1-r0)/float64(n))
	}
	if p50, p99, ok := handled(before, after, "POST /v1/sessions/{id}/plan"); ok {
		fmt.Printf("  the master's own time for a plan (request read to answer written, its histogram): p50 <= %s, p99 <= %s\n", p50, p99)
	}
	if p50, p99, ok := handled(before, after, "POST /v1/sessions/{id}/commit"); ok {
		// The client's write + commit includes the write to a server and
		// the trips; the commit target is this part of it.
		fmt.Printf("  the master's own time for a commit sent alone (not in a batch; its histogram): p50 <= %s, p99 <= %s\n", p50, p99)
	}
	if over, ok := schedWaits(before, after); ok {
		fmt.Printf("  the master's goroutines made runnable waited for a CPU (Go's scheduler): %s\n", over)
	}
	var routes []string
	for k, v := range after {
		if strings.HasPrefix(k, "bucket ") || !strings.Contains(k, "/") {
			continue // the write-behind counters, below
		}
		if d := v - before[k]; d > 0 {
			routes = append(routes, fmt.Sprintf("%s %.2f", k, d/float64(n)))
		}
	}
	sort.Strings(routes)
	fmt.Printf("  master requests per turn: %s\n", strings.Join(routes, ", "))
	if _, ok := after["framed"]; ok {
		fmt.Printf("  of them on framed connections: %.2f a turn\n", (after["framed"]-before["framed"])/float64(n))
	}
	if mem := after["from_memory"] - before["from_memory"]; after["flushes"] > 0 || mem > 0 {
		fl := after["flushes"] - before["flushes"]
		ops := after["flushed"] - before["flushed"]
		fmt.Printf("  answered from memory: %.0f%% of plans and commits; %.0f flushes, %.1f operations and %.1f ms each on average\n",
			100*mem/float64(2*n), fl, ops/max(fl, 1), 1000*(after["flush_s"]-before["flush_s"])/max(fl, 1))
		var slow []string
		for k, v := range after {
			if rest, ok := strings.CutPrefix(k, "sql "); ok {
				if d := v - before[k]; d > 0 {
					slow = append(slow, fmt.Sprintf("%s %.2f%%", rest, 100*d/float64(n)))
				}
			}
		}
		if len(slow) > 0 { // a master from before the count prints nothing
			sort.Strings(slow)
			fmt.Printf("  ran in SQL, by why, per 100 turns: %s\n", strings.Join(slow, ", "))
		}
		if _, ok := after["log_waits"]; ok { // a master from before the count prints nothing
			fmt.Printf("  reads and operations that waited for the leader's log (in window mode each forces a flush): %.3f a turn\n",
				(after["log_waits"]-before["log_waits"])/float64(n))
		}
		if st := after["stmts"] - before["stmts"]; st > 0 { // a master from before the count prints nothing
			fmt.Printf("  flushes wrote %.2f SQL statements an operation (%.2f left out: overwritten in the same flush)\n",
				st/max(ops, 1), (after["dropped"]-before["dropped"])/max(ops, 1))
		}
	}

	// Reference: the same client's plain KV round trips of the same bytes.
	kv := cl.KV("perf")
	val := make([]byte, turnsLayout.RangeBytes(turnTokens))
	buf := make([]byte, len(val))
	var puts, gets []time.Duration
	for i := 0; i < 2000 && (i < 200 || time.Since(t0) < el+5*time.Second); i++ {
		k := fmt.Sprintf("%sref/%d", run, i)
		t := time.Now()
		if err := kv.Put(ctx, k, val); err != nil {
			return err
		}
		puts = append(puts, time.Since(t))
		t = time.Now()
		if _, err := kv.GetInto(ctx, k, buf); err != nil {
			return err
		}
		gets = append(gets, time.Since(t))
	}
	fmt.Printf("  reference, plain KV of the same %d bytes, one at a time: put p50 %s p99 %s, get p50 %s p99 %s\n",
		len(val), dur(pct(puts, 50)), dur(pct(puts, 99)), dur(pct(gets, 50)), dur(pct(gets, 99)))
	fmt.Printf("  a turn's write + commit against that put (timed after the turns, on an idle cluster): p50 %s, p99 %s\n",
		times(pct(commits, 50), pct(puts, 50)), times(pct(commits, 99), pct(puts, 99)))
	if rss := procRSS(procs[0].Process.Pid); rss > 0 {
		fmt.Printf("  master RSS %s (%d sessions; the leader keeps the sessions it has served in memory, written through to the SQL store)\n", human(rss), sessions)
	}

	// Restart: SIGKILL the master, start it again on the same store, and
	// time until it plans again.
	procs[0].Process.Kill()
	procs[0].Wait()
	t1 := time.Now()
	bin, err := gd2fsPath()
	if err != nil {
		return err
	}
	m := exec.Command(bin, append([]string{"master", "--listen", strings.TrimPrefix(url, "http://"), "--meta", metaDSN, "--lead-warmup", "0s"}, masterArgs...)...)
	dieWithUs(m)
	if err := m.Start(); err != nil {
		return err
	}
	procs[0] = m
	for {
		if _, err := ss.Plan(ctx, id(0), client.PlanRequest{Model: turnsLayout.Model, TokenIDs: tokenIDs(0, tokens[0].Load()+turnTokens)}); err == nil {
			break
		}
		if time.Since(t1) > 5*time.Minute {
			return fmt.Errorf("the restarted master did not plan within 5 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("  restart after SIGKILL: the master plans again %s after it is started (%d sessions)\n", time.Since(t1).Round(time.Millisecond), sessions)
	return nil
}

// startProcs starts a master on metaDSN and servers data servers, each its
// own gd2fs process, and returns them (master first) once every server is up.
// turnsKVMem is each server's KV DRAM tier: the turns use none of it.
const turnsKVMem = 64 << 20

// waitResident waits until every process holds at least bytes resident:
// servers started with --mem-prefault, once their tiers are in place.
func waitResident(procs []*exec.Cmd, bytes int64) error {
	t := time.Now()
	for _, p := range procs {
		for procRSS(p.Process.Pid) < bytes {
			if time.Since(t) > 5*time.Minute {
				return fmt.Errorf("server pid %d holds %s resident, not yet its DRAM tiers' %s, after 5 minutes (an old kernel without MADV_POPULATE_WRITE? run with --server-prefault=false)",
					p.Process.Pid, human(procRSS(p.Process.Pid)), human(bytes))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func startProcs(ctx context.Context, dir, metaDSN, serverMem string, servers int, masterArgs, serverArgs []string) ([]*exec.Cmd, string, error) {
	bin, err := gd2fsPath()
	if err != nil {
		return nil, "", err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	url := "http://" + addr
	var procs []*exec.Cmd
	fail := func(err error) ([]*exec.Cmd, string, error) {
		for _, p := range procs {
			p.Process.Kill()
			p.Wait()
		}
		return nil, "", err
	}
	start := func(args ...string) error {
		cmd := exec.Command(bin, args...)
		cmd.Stderr = os.Stderr
		dieWithUs(cmd)
		if err := cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, cmd)
		return nil
	}
	if err := start(append([]string{"master", "--listen", addr, "--meta", metaDSN, "--lead-warmup", "0s"}, masterArgs...)...); err != nil {
		return fail(err)
	}
	for i := 0; i < servers; i++ {
		a, err := freeAddr()
		if err != nil {
			return fail(err)
		}
		if err := start(append([]string{"server", "--master", url, "--listen", a, "--id", fmt.Sprintf("s%d", i), "--mem", serverMem, "--kv-mem", strconv.Itoa(turnsKVMem)}, serverArgs...)...); err != nil {
			return fail(err)
		}
	}
	up, err := waitServersUp(ctx, url, servers)
	if err != nil {
		return fail(err)
	}
	if !up {
		return fail(fmt.Errorf("master and %d servers (%s) were not up within 30 s", servers, bin))
	}
	return procs, url, nil
}

// parallel runs fn(0..n-1) on conc goroutines; the first error stops it.
func parallel(conc, n int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, conc)
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					errc <- err
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// masterRequests reads the master's request counters by route (every status).
func masterRequests(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for k, name := range map[string]string{"from_memory": "gd2fs_master_session_ops_from_memory_total ",
			"flushes": "gd2fs_master_session_flushes_total ", "flushed": "gd2fs_master_session_flushed_ops_total ",
			"flush_s": "gd2fs_master_session_flush_seconds_total ", "stmts": "gd2fs_master_session_flushed_statements_total ",
			"dropped": "gd2fs_master_session_dropped_statements_total ", "framed": "gd2fs_master_framed_calls_total ",
			"log_waits": "gd2fs_master_session_log_waits_total "} {
			if v, ok := strings.CutPrefix(line, name); ok {
				out[k], _ = strconv.ParseFloat(v, 64)
			}
		}
		if rest, ok := strings.CutPrefix(line, "gd2fs_master_session_ops_in_sql_total{"); ok {
			// {op="plan",reason="chunk"} 12 -> "sql plan chunk"
			labels, v, _ := strings.Cut(rest, "} ")
			op, reason := promLabel(labels, "op"), promLabel(labels, "reason")
			if f, err := strconv.ParseFloat(v, 64); err == nil && op != "" && reason != "" {
				out["sql "+op+" "+reason] = f
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, "gd2fs_master_request_seconds_bucket{"); ok {
			// {route="POST /v1/sessions/{id}/plan",le="0.0032"} 12 -> "bucket POST /v1/sessions/{id}/plan 0.0032"
			labels, v, _ := strings.Cut(rest, "} ")
			route, le := promLabel(labels, "route"), promLabel(labels, "le")
			if f, err := strconv.ParseFloat(v, 64); err == nil && route != "" && le != "" {
				out["bucket "+route+" "+le] = f
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, "go_sched_latencies_seconds_bucket{"); ok {
			labels, v, _ := strings.Cut(rest, "} ")
			if f, err := strconv.ParseFloat(v, 64); err == nil && promLabel(labels, "le") != "" {
				out["bucket sched "+promLabel(labels, "le")] = f
			}
			continue
		}
		if !strings.HasPrefix(line, "gd2fs_master_requests_total{") {
			continue
		}
		i := strings.Index(line, `route="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		route := line[i+len(`route="`):]
		route = route[:strings.IndexByte(route, '"')]
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err != nil {
			continue
		}
		out[route] += v
	}
	return out, sc.Err()
}

// handled is the p50 and p99 of the master's handling time for route between
// two scrapes, as the upper bounds of the histogram buckets they fall in
// (the master's own clock: from its handler's start to its answer written, no
// network, no client). ok is false when the master counted no such request.
func handled(before, after map[string]float64, route string) (p50, p99 string, ok bool) {
	bs := bucketDiffs(before, after, "bucket "+route+" ")
	if bs == nil {
		return "", "", false
	}
	total := bs[len(bs)-1].n // buckets are cumulative
	at := func(q float64) string {
		for _, b := range bs {
			if b.n >= q*total {
				if math.IsInf(b.le, 1) {
					return "above the largest bucket"
				}
				return dur(time.Duration(b.le * float64(time.Second)))
			}
		}
		return "?"
	}
	return at(0.50), at(0.99), true
}

// histBucket is one cumulative bucket of a histogram: the count at or under
// le between two scrapes.
type histBucket struct{ le, n float64 }

// bucketDiffs is a histogram's buckets (keys prefix+le, as masterRequests
// names them) between two scrapes, sorted by bound, the last +Inf; nil when
// there are none or none were counted (or the master restarted between
// the scrapes, so the counts went down).
func bucketDiffs(before, after map[string]float64, prefix string) []histBucket {
	var bs []histBucket
	for k, v := range after {
		le, found := strings.CutPrefix(k, prefix)
		if !found {
			continue
		}
		f, err := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
		if err != nil {
			continue
		}
		bs = append(bs, histBucket{f, v - before[k]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || !math.IsInf(bs[len(bs)-1].le, 1) || bs[len(bs)-1].n <= 0 {
		return nil
	}
	return bs
}

// schedWaits says which share of the master's goroutine wake-ups between
// two scrapes waited longer than each of the larger bounds of
// go_sched_latencies_seconds (the runtime's /sched/latencies, in the
// Prometheus collector's coarse buckets): where a plan's tail goes when
// the master's own time is short. ok is false for a master without it.
func schedWaits(before, after map[string]float64) (string, bool) {
	bs := bucketDiffs(before, after, "bucket sched ")
	if bs == nil {
		return "", false
	}
	total := bs[len(bs)-1].n
	var parts []string
	for _, b := range bs {
		if b.le >= 0.5e-3 && !math.IsInf(b.le, 1) { // the sub-millisecond buckets say nothing of a tail
			parts = append(parts, fmt.Sprintf("%.2f%% over %s", 100*(total-b.n)/total, dur(time.Duration(b.le*float64(time.Second)))))
		}
	}
	// The runtime times one transition in eight: the count is a sample,
	// the shares are not skewed by it.
	return strings.Join(parts, ", "), true
}

// times is a over its reference b, as "1.25x"; "-" when b is zero (no
// reference was timed).
func times(a, b time.Duration) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, len(s)*p/100)]
}

// loadAvg is the machine's 1-minute load average, for the record.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}

// promLabel is the value of label name in a Prometheus sample's labels
// (`op="plan",reason="chunk"`), "" if absent.
func promLabel(labels, name string) string {
	for _, kv := range strings.Split(labels, ",") {
		if v, ok := strings.CutPrefix(kv, name+`="`); ok {
			return strings.TrimSuffix(v, `"`)
		}
	}
	return ""
}

// probeEvery is how often probeMaster calls.
const probeEvery = 5 * time.Millisecond

// probeResult is what probeMaster timed: its answered calls' times, and
// how many it sent.
type probeResult struct {
	times []time.Duration
	sent  int
}

// probeMaster times, until deadline, a call every probeEvery that the
// master answers without any work of a session: an empty batch of plans,
// refused (400) as soon as its body is read. It goes as the client's
// session calls go: on a framed connection, or as HTTP with plainHTTP.
// Each call starts on its tick whether or not the one before has ended,
// so a slow stretch is sampled as often as a quick one; each has 10 s.
// Calls that fail are left out; none is expected.
func probeMaster(ctx context.Context, url string, plainHTTP bool, deadline time.Time) probeResult {
	body := []byte(`{"plans":[]}`)
	hdr := http.Header{"Content-Type": {"application/json"}}
	var fc *frames.Client
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	if !plainHTTP {
		fc = &frames.Client{Transport: &http.Transport{}}
		defer fc.Close()
	}
	call := func() bool {
		if fc != nil {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			a, err := fc.Do(cctx, url, http.MethodPost, "/v1/sessions/plans", hdr, body, true)
			return err == nil && a.Status == http.StatusBadRequest
		}
		resp, err := hc.Post(url+"/v1/sessions/plans", "application/json", bytes.NewReader(body))
		if err != nil {
			return false
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err == nil && resp.StatusCode == http.StatusBadRequest
	}
	var out probeResult
	out.sent++
	if !call() { // the connection, outside the measurement
		fmt.Fprintln(os.Stderr, "  the reference call to the master failed: its figures are left out")
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	tk := time.NewTicker(probeEvery)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case now := <-tk.C:
			if !now.Before(deadline) {
				wg.Wait()
				return out
			}
			out.sent++
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.Now()
				if call() {
					d := time.Since(t)
					mu.Lock()
					out.times = append(out.times, d)
					mu.Unlock()
				}
			}()
		}
	}
}
