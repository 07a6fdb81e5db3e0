package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/spf13/cobra"
)

// planBench is gd2fs-bench plan: the session table's scale, in process
// (docs/kv-cache.md, "Scale of the session table").
type planBench struct {
	dsn, setup                 string
	sessions, plans, conc      int
	from                       int // with --reuse: the first session that is left
	turns, quotaPlans          int
	system, turnTok, answerTok int64
	reuse, warm, restart       bool
	cpuProfile, memCap         string
	durability                 string

	ms   meta.Store
	l    meta.Layout
	conv []uint32
}

const planBenchPrefix = "/kv-bench-prefix/system"

func newBenchPlan() *cobra.Command {
	b := &planBench{}
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "The session table's scale: plan latency, leader memory, file size, restart and eviction with many sessions",
		Long: `plan makes --sessions sessions in a metadata store (each a shared system prompt, registered as a
prefix, and --turns turns), then times plans on random sessions with 1 and --concurrency planners,
in process, as the leading master plans (from the session table in its memory). It prints the
process's RSS and Go heap before and after the plans (per session touched) and, with --warm, with
every session in the leader's memory; the SQLite file's size per session; with --restart, the time
for a store opened again on the same database to lead and answer its first plan; with
--quota-plans, plans under a session quota that evicts on each (the victims are checked to be
exactly the least recently used sessions). --session-durability is the master's: in flush mode (the
default) each plan waits for the group transaction that writes it to SQL, so its time is mostly the
database's sync; in window mode a plan of a session in memory is answered at once.

Set-up: --setup seed (default) makes one session through plans and commits and copies it row for
row (meta.SeedSessions: each copy is what the same plans and commits make, TestSeedSessions);
--setup api makes every session through plans and commits (about 200-300 sessions/s here).
--reuse skips set-up on a --meta that a previous run of the same flags filled.`,
		Example: `  gd2fs-bench plan --sessions 10000                              # a temp SQLite file
  gd2fs-bench plan --sessions 1000000 --meta sqlite:///tmp/p1m.db --warm --restart --quota-plans 1000
  gd2fs-bench plan --sessions 1000000 --meta sqlite:///tmp/p1m.db --reuse --restart   # the same table again
  gd2fs-bench plan --sessions 1000000 --meta sqlite:///tmp/p1m.db --warm --session-durability window
  gd2fs-bench plan --sessions 10000 --setup api                  # every session through plans and commits
  gd2fs-bench plan --meta 'postgres://postgres@127.0.0.1:55433/postgres?sslmode=disable'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return b.run(context.Background()) },
	}
	f := cmd.Flags()
	f.StringVar(&b.dsn, "meta", "", "metadata store (default: a temp SQLite file, removed after)")
	f.IntVar(&b.sessions, "sessions", 100000, "sessions")
	f.StringVar(&b.setup, "setup", "seed", "how sessions are made: seed (one through the API, copied) or api (each through the API)")
	f.BoolVar(&b.reuse, "reuse", false, "the --meta database already holds the sessions (a previous run with the same flags)")
	f.IntVar(&b.from, "from", 0, "with --reuse: plan on sessions --from..--sessions-1 only (an earlier run's quota evicted those before)")
	f.IntVar(&b.turns, "turns", 3, "turns per session")
	f.Int64Var(&b.system, "system-tokens", 1000, "tokens of the shared system prompt (a registered prefix)")
	f.Int64Var(&b.turnTok, "turn-tokens", 200, "prompt tokens a turn adds")
	f.Int64Var(&b.answerTok, "answer-tokens", 100, "answer tokens a turn adds")
	f.IntVar(&b.plans, "plans", 5000, "plans to time, per measurement")
	f.IntVar(&b.conc, "concurrency", 8, "concurrent planners for the second measurement (and --setup api)")
	f.BoolVar(&b.warm, "warm", false, "then load every session into the leader's memory and measure it")
	f.BoolVar(&b.restart, "restart", false, "then close the store, open it again and time leading and the first plan")
	f.IntVar(&b.quotaPlans, "quota-plans", 0, "then time this many plans under a session quota that evicts on each")
	f.StringVar(&b.cpuProfile, "cpuprofile", "", "write a CPU profile of the timed plans (1 and --concurrency planners) to this file")
	f.StringVar(&b.memCap, "session-memory", "0", "bound the leader's memory of sessions (gd2fs master --session-memory; 0: none)")
	f.StringVar(&b.durability, "session-durability", meta.DurabilityFlush, "as gd2fs master --session-durability: flush (a plan waits for its write to SQL), window (answered at once) or sync")
	return cmd
}

// planners are the measurements' numbers of planners: 1, then --concurrency.
func (b *planBench) planners() []int {
	if b.conc == 1 {
		return []int{1}
	}
	return []int{1, b.conc}
}

func (b *planBench) id(i int) string { return fmt.Sprintf("s%07d", i) }

// turnInput is the plan of turn k of a session (k = turns: the next one).
func (b *planBench) turnInput(id string, k int) meta.PlanInput {
	n := b.system + int64(k)*(b.turnTok+b.answerTok) + b.turnTok
	return meta.PlanInput{Session: id, Model: b.l.Model, TokenIDs: b.conv[:n], DecodeTokens: b.answerTok, Prefixes: []string{planBenchPrefix},
		Dir: "/kv-bench", Pool: "perf", ChunkSize: 16 << 20, PlanTTL: time.Hour, Now: time.Now(),
		Place: func(fileID, idx int64) ([]string, error) { return []string{"bench-server"}, nil }}
}

// session makes session id through plans and commits.
func (b *planBench) session(ctx context.Context, id string) error {
	for k := 0; k < b.turns; k++ {
		p, err := b.ms.PlanSession(ctx, b.turnInput(id, k))
		if err != nil {
			return err
		}
		if _, err := b.ms.CommitSession(ctx, meta.CommitInput{Session: id, PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
			return err
		}
	}
	return nil
}

func (b *planBench) open(ctx context.Context) error {
	ms, err := meta.Open(ctx, b.dsn)
	if err != nil {
		return err
	}
	if ds, ok := ms.(meta.DurabilitySetter); !ok {
		ms.Close()
		return fmt.Errorf("--session-durability: the store of %s has no write-behind", engineName(b.dsn))
	} else if err := ds.SetSessionDurability(b.durability); err != nil {
		ms.Close()
		return fmt.Errorf("--session-durability: %w", err)
	}
	// Plan as a master does: as the leader, from the session table in its
	// memory (internal/meta/cache.go).
	if ok, err := ms.Lead(ctx, "http://gd2fs-bench"); err != nil || !ok {
		ms.Close()
		return fmt.Errorf("the benchmark's store does not lead (another master uses %s?): %v", b.dsn, err)
	}
	if b.memCap != "" && b.memCap != "0" {
		n, err := parseSize(b.memCap)
		if err == nil {
			if ms, ok := ms.(meta.SessionMemorySetter); ok {
				err = ms.SetSessionMemory(n)
			} else {
				err = fmt.Errorf("this store keeps no sessions in memory")
			}
		}
		if err != nil {
			ms.Close()
			return fmt.Errorf("--session-memory: %w", err)
		}
	}
	b.ms = ms
	return nil
}

func (b *planBench) run(ctx context.Context) error {
	if b.from < 0 || b.from >= b.sessions || (b.from > 0 && !b.reuse) {
		return fmt.Errorf("--from must be below --sessions, and only with --reuse")
	}
	if b.sessions < 1 || b.plans < 1 || b.conc < 1 || b.turns < 1 || b.system < 1 || b.turnTok < 1 || b.answerTok < 0 {
		return fmt.Errorf("--sessions, --plans, --concurrency, --turns, --system-tokens and --turn-tokens must be at least 1")
	}
	if b.setup != "seed" && b.setup != "api" {
		return fmt.Errorf("--setup %q: use seed or api", b.setup)
	}
	if b.dsn == "" {
		if b.reuse {
			return fmt.Errorf("--reuse needs --meta (the database a previous run filled)")
		}
		dir, err := os.MkdirTemp("", "gd2fs-benchplan-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		b.dsn = "sqlite://" + filepath.Join(dir, "meta.db")
	}
	if err := b.open(ctx); err != nil {
		return err
	}
	defer func() { b.ms.Close() }()
	b.l = meta.Layout{Model: "bench-llama", Layers: 32, KVHeads: 8, HeadDim: 128, DType: "bf16", PageTokens: 16, Order: "layer_first"}
	b.conv = tokenIDs(0, b.system+int64(b.turns+1)*(b.turnTok+b.answerTok))
	fmt.Printf("bench plan: %s (session durability %s), %d sessions of a %d-token system prompt and %d turns of %d+%d tokens\n",
		engineName(b.dsn), b.durability, b.sessions, b.system, b.turns, b.turnTok, b.answerTok)
	if !b.reuse {
		if err := b.fill(ctx); err != nil {
			return err
		}
	}
	if first, err := b.ms.Sessions(ctx, "", 1); err != nil || len(first) == 0 {
		return fmt.Errorf("no sessions in %s (--reuse on a database no run filled?): %v", b.dsn, err)
	}
	if err := b.fileSize(); err != nil {
		return err
	}
	rss0, heap0 := memNow()
	fmt.Printf("  leader memory before plans: RSS %s, Go heap %s\n", human(rss0), human(heap0))
	touched := map[string]bool{}
	var mu sync.Mutex
	touch := func(id string) { mu.Lock(); touched[id] = true; mu.Unlock() }
	if b.cpuProfile != "" {
		f, err := os.Create(b.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	for _, c := range b.planners() {
		if err := b.timePlans(ctx, c, touch); err != nil {
			return err
		}
	}
	if b.cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	rss1, heap1 := memNow()
	fmt.Printf("  after plans on %d sessions: RSS %s (+%s, %s a session), Go heap %s (+%s, %s a session)\n", len(touched),
		human(rss1), human(rss1-rss0), human((rss1-rss0)/int64(len(touched))), human(heap1), human(heap1-heap0), human((heap1-heap0)/int64(len(touched))))
	if b.warm {
		t0 := time.Now()
		for i := b.from; i < b.sessions; i += 10000 {
			ids := make([]string, 0, 10000)
			for j := i; j < min(i+10000, b.sessions); j++ {
				ids = append(ids, b.id(j))
			}
			if err := meta.WarmSessions(ctx, b.ms, ids); err != nil {
				return err
			}
		}
		rss2, heap2 := memNow()
		fmt.Printf("  every session in the leader's memory (%s to load): RSS %s (+%s, %s a session), Go heap %s (+%s, %s a session)\n",
			time.Since(t0).Round(time.Millisecond), human(rss2), human(rss2-rss0), human((rss2-rss0)/int64(b.sessions-b.from)),
			human(heap2), human(heap2-heap0), human((heap2-heap0)/int64(b.sessions-b.from)))
		if st, ok := b.ms.(meta.WriteBehindStatser); ok {
			w := st.WriteBehindStats()
			fmt.Printf("  sessions in the leader's memory: %d (%d dropped for --session-memory %s)\n", w.Held, w.Shed, b.memCap)
		}
		for _, c := range b.planners() {
			if err := b.timePlans(ctx, c, touch); err != nil {
				return err
			}
		}
	}
	if b.quotaPlans > 0 {
		if err := b.quota(ctx, touched); err != nil {
			return err
		}
	}
	if b.restart {
		if err := b.restartLead(ctx); err != nil {
			return err
		}
	}
	return nil
}

// fill makes the sessions: the prefix, then every session through the API
// or one and its copies.
func (b *planBench) fill(ctx context.Context) error {
	if err := b.ms.PutLayout(ctx, b.l); err != nil {
		return err
	}
	f, err := b.ms.CreateFile(ctx, meta.File{Path: planBenchPrefix, Pool: "perf", ChunkSize: 16 << 20, Modified: time.Now()})
	if err != nil {
		return fmt.Errorf("%w (a database a previous run filled? add --reuse)", err)
	}
	if _, err := b.ms.Commit(ctx, f.ID, b.l.RangeBytes(b.system), nil, true, time.Now()); err != nil {
		return err
	}
	if err := b.ms.PutPrefix(ctx, meta.Prefix{Path: planBenchPrefix, Model: b.l.Model, TokenIDs: b.conv[:b.system]}); err != nil {
		return err
	}
	start := time.Now()
	var shown atomic.Int64
	progress := func(done int) {
		if k := int64(done / 100000); (k > shown.Load() && shown.CompareAndSwap(shown.Load(), k)) || done == b.sessions {
			fmt.Fprintf(os.Stderr, "  %d sessions (%.0f/s)\n", done, float64(done)/time.Since(start).Seconds())
		}
	}
	if b.setup == "api" {
		var n atomic.Int64
		err = parallel(b.conc, b.sessions, func(i int) error {
			if err := b.session(ctx, b.id(i)); err != nil {
				return err
			}
			progress(int(n.Add(1)))
			return nil
		})
	} else if err = b.session(ctx, b.id(0)); err == nil {
		err = meta.SeedSessions(ctx, b.ms, meta.SeedInput{Template: b.id(0), Dir: "/kv-bench", N: b.sessions - 1,
			ID: func(i int) string { return b.id(i + 1) }, Progress: func(done int) { progress(done + 1) }})
	}
	if err != nil {
		return err
	}
	fmt.Printf("  set-up (%s): %s\n", b.setup, time.Since(start).Round(time.Millisecond))
	return nil
}

// timePlans times b.plans plans of the next turn on random sessions with c
// planners.
func (b *planBench) timePlans(ctx context.Context, c int, touch func(string)) error {
	lat := make([]time.Duration, b.plans)
	var next atomic.Int64
	errc := make(chan error, c)
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(c)))
			for {
				i := next.Add(1) - 1
				if i >= int64(b.plans) {
					return
				}
				id := b.id(b.from + r.IntN(b.sessions-b.from))
				t := time.Now()
				if _, err := b.ms.PlanSession(ctx, b.turnInput(id, b.turns)); err != nil {
					errc <- err
					return
				}
				lat[i] = time.Since(t)
				touch(id)
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(t0)
	select {
	case err := <-errc:
		return err
	default:
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("  %2d planners: %6.0f plans/s, p50 %s, p99 %s (%d plans)\n", c, float64(b.plans)/el.Seconds(), dur(lat[b.plans/2]), dur(lat[b.plans*99/100]), b.plans)
	return nil
}

// quota times plans each under a quota one byte below what was reserved
// before it, so that each evicts one session, and checks the victims are the least recently used idle
// sessions in order: with --setup seed, the sessions no plan touched, by
// id (a copy's last use is its number of nanoseconds after the template's).
func (b *planBench) quota(ctx context.Context, touched map[string]bool) error {
	cands, err := b.lruCandidates(ctx, touched)
	if err != nil {
		return err
	}
	lat := make([]time.Duration, b.quotaPlans)
	var evicted []string
	r := rand.New(rand.NewPCG(7, 7))
	for i := range lat {
		in := b.turnInput(b.id(b.from+r.IntN(b.sessions-b.from)), b.turns)
		total, err := meta.ReservedBytes(ctx, b.ms)
		if err != nil {
			return err
		}
		in.Quota = total - 1
		t := time.Now()
		p, err := b.ms.PlanSession(ctx, in)
		if err != nil {
			return err
		}
		lat[i] = time.Since(t)
		evicted = append(evicted, p.Evicted...)
		for _, e := range p.Evicted {
			if touched[e] {
				return fmt.Errorf("plan %d evicted %s, a session a plan touched (it has a plan outstanding)", i, e)
			}
		}
		touched[in.Session] = true
	}
	slices.Sort(lat)
	n := len(lat)
	fmt.Printf("  under a quota: %d plans evicted %d sessions, p50 %s, p99 %s\n", n, len(evicted), dur(lat[n/2]), dur(lat[n*99/100]))
	want := make([]string, 0, len(evicted))
	for _, id := range cands {
		if len(want) == len(evicted) {
			break
		}
		if !touched[id] || slices.Contains(evicted, id) {
			want = append(want, id)
		}
	}
	if !slices.Equal(evicted, want) {
		return fmt.Errorf("eviction is not least recently used first: evicted %s, want %s", short(evicted), short(want))
	}
	fmt.Printf("  victims: exactly the least recently used idle sessions, in order (%s)\n", short(evicted))
	return nil
}

// lruCandidates are, in their least-recently-used order, the sessions a
// quota may evict first: those of the seeded table no plan has touched
// since. A copy's creation and last use are the template's plus its number
// in ns, so every untouched copy has the template's last use minus
// creation; a touched one (by this run or an earlier one, whose plans are
// still outstanding) is used later, and one made again after an eviction
// was created at its first plan. Read through Sessions (SQL in id order,
// every session, --from or not), not through the quota's query.
func (b *planBench) lruCandidates(ctx context.Context, touched map[string]bool) ([]string, error) {
	if b.setup != "seed" {
		return nil, fmt.Errorf("--quota-plans checks the victims' order, known only for --setup seed")
	}
	var out []string
	var age time.Duration // the template's last use minus creation
	for after := ""; len(out) < 2*b.quotaPlans+100; {
		page, err := b.ms.Sessions(ctx, after, 1000)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		if age == 0 { // the most common age of the first page: the copies'
			n := map[time.Duration]int{}
			for _, ss := range page {
				if n[ss.LastUsed.Sub(ss.Created)]++; age == 0 || n[ss.LastUsed.Sub(ss.Created)] > n[age] {
					age = ss.LastUsed.Sub(ss.Created)
				}
			}
		}
		for _, ss := range page {
			if !touched[ss.ID] && ss.LastUsed.Sub(ss.Created) == age {
				out = append(out, ss.ID)
			}
		}
		after = page[len(page)-1].ID
	}
	return out, nil
}

func short(ids []string) string {
	if len(ids) > 6 {
		return strings.Join(ids[:3], " ") + " … " + strings.Join(ids[len(ids)-3:], " ")
	}
	return strings.Join(ids, " ")
}

// restartLead closes the store and times a new one on the same database
// to open, lead, and answer a first and a second plan.
func (b *planBench) restartLead(ctx context.Context) error {
	if err := b.ms.Close(); err != nil {
		return err
	}
	b.ms = nil
	runtime.GC()
	t0 := time.Now()
	if err := b.open(ctx); err != nil {
		return err
	}
	led := time.Since(t0)
	var firsts []time.Duration
	r := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < 2; i++ {
		t := time.Now()
		if _, err := b.ms.PlanSession(ctx, b.turnInput(b.id(b.from+r.IntN(b.sessions-b.from)), b.turns)); err != nil {
			return err
		}
		firsts = append(firsts, time.Since(t))
	}
	fmt.Printf("  restart: opened and leading in %s, first plan %s later (%s from the start), second plan %s\n",
		led.Round(time.Microsecond), dur(firsts[0]), (led + firsts[0]).Round(time.Microsecond), dur(firsts[1]))
	return nil
}

// fileSize prints the SQLite file's size (with its WAL) per session.
func (b *planBench) fileSize() error {
	if !strings.HasPrefix(b.dsn, "sqlite://") {
		return nil
	}
	file, _, _ := strings.Cut(strings.TrimPrefix(b.dsn, "sqlite://"), "?")
	var total int64
	for _, f := range []string{file, file + "-wal"} {
		st, err := os.Stat(f)
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		if err == nil {
			total += st.Size()
		}
	}
	fmt.Printf("  SQLite file and WAL: %s, %s a session\n", human(total), human(total/int64(b.sessions)))
	return nil
}

// memNow is the process's RSS and live Go heap after a collection.
func memNow() (rss, heap int64) {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	data, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				rss = kb << 10
			}
		}
	}
	return rss, int64(m.HeapAlloc)
}
