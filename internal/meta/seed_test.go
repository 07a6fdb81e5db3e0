package meta

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// seedTurns gives session id the benchmark's shape: a shared system prompt
// (a registered prefix) and turns, each planned with its token ids, its
// chunks placed, and committed as written.
func seedTurns(t *testing.T, s Store, id string, sys []uint32, turns int) {
	t.Helper()
	ctx := context.Background()
	conv := slices.Clone(sys)
	for i := 0; i < turns; i++ {
		for j := 0; j < 40; j++ {
			conv = append(conv, uint32(5000+len(conv)))
		}
		p, err := s.PlanSession(ctx, PlanInput{Session: id, Model: "seed", TokenIDs: conv, DecodeTokens: 8, Prefixes: []string{"/prefixes/seed"},
			Dir: "/kv-seed", Pool: "perf", ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(),
			Place: func(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: p.ID, Written: true, Now: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
}

// seedDump is session id's rows in every table its plans and commits
// wrote, with its id, its directory, times and ids from the id counter
// (by rank) written so that two sessions made by the same turns read the
// same.
func seedDump(t *testing.T, s *sqlStore, id string) []string {
	t.Helper()
	ctx := context.Background()
	in := SeedInput{Template: id, Dir: "/kv-seed"}
	if err := s.barrier(ctx); err != nil { // window mode: what was answered, in SQL
		t.Fatal(err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	tables, err := s.seedTemplate(ctx, tx, in)
	if err != nil {
		t.Fatal(err)
	}
	// Plan ids are ranked apart: the leader takes them from the counter in
	// blocks (writebehind.go), so a plan's id says nothing of its order
	// among file and chunk ids.
	var ids, planIDs []int64
	for _, tb := range tables {
		for _, c := range seedIDCols[tb.name] {
			for _, r := range tb.rows {
				if c == "last_plan" {
					planIDs = append(planIDs, r[col(tb.cols, c)].(int64))
					continue
				}
				ids = append(ids, r[col(tb.cols, c)].(int64))
			}
		}
		if i := col(tb.cols, "path"); i >= 0 {
			for _, r := range tb.rows {
				if seq, ok := seedFileSeq(r[i].(string), "/kv-seed/"+id+"/"); ok {
					ids = append(ids, seq)
				}
			}
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	slices.Sort(planIDs)
	planIDs = slices.Compact(planIDs)
	rankIn := func(set []int64, v int64) string {
		if v == 0 {
			return "0"
		}
		i, _ := slices.BinarySearch(set, v)
		return "#" + strconv.Itoa(i)
	}
	rank := func(v int64) string { return rankIn(ids, v) }
	var out []string
	for _, tb := range tables {
		var rows []string
		for _, r := range tb.rows {
			var b strings.Builder
			b.WriteString(tb.name)
			for j, v := range r {
				c := strings.ToLower(tb.cols[j])
				if c == "last_used" || c == "created" || c == "mtime" {
					continue
				}
				switch x := v.(type) {
				case int64:
					if c == "last_plan" {
						v = "plan" + rankIn(planIDs, x)
					} else if slices.Contains(seedIDCols[tb.name], c) {
						v = rank(x)
					}
				case string:
					if seq, ok := seedFileSeq(x, "/kv-seed/"+id+"/"); ok {
						v = "D/kv-" + rank(seq)
					} else if x == id {
						v = "S"
					} else {
						v = strings.ReplaceAll(x, "/kv-seed/"+id, "D")
					}
				}
				fmt.Fprintf(&b, " %s=%v", c, v)
			}
			rows = append(rows, b.String())
		}
		sort.Strings(rows)
		out = append(out, rows...)
	}
	return out
}

// TestSeedSessions: a session SeedSessions copies is, row for row, what
// the same plans and commits make (its twin), the invariants hold over
// all, and the copies then live as sessions do: a turn, a deletion, and
// eviction under a quota in their LRU order.
func TestSeedSessions(t *testing.T) {
	// Window mode too: the template's last commit, answered from memory,
	// is read from SQL only after its log is written.
	for name, open := range engines(t) {
		for _, mode := range []string{DurabilityFlush, DurabilityWindow} {
			t.Run(name+"-"+mode, func(t *testing.T) {
				ctx := context.Background()
				s := inMode(open, mode)(t).(*sqlStore)
				l := Layout{Model: "seed", Layers: 2, KVHeads: 1, HeadDim: 8, DType: "fp16", PageTokens: 16, Order: "layer_first"}
				if err := s.PutLayout(ctx, l); err != nil {
					t.Fatal(err)
				}
				sys := make([]uint32, 50)
				for i := range sys {
					sys[i] = uint32(100 + i)
				}
				f, err := s.CreateFile(ctx, File{Path: "/prefixes/seed", Pool: "ha", ChunkSize: 1 << 20, Modified: now})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Commit(ctx, f.ID, l.RangeBytes(50), nil, true, now); err != nil {
					t.Fatal(err)
				}
				if err := s.PutPrefix(ctx, Prefix{Path: "/prefixes/seed", Model: "seed", TokenIDs: sys}); err != nil {
					t.Fatal(err)
				}
				seedTurns(t, s, "tmpl", sys, 3)
				seedTurns(t, s, "twin", sys, 3)
				var progress []int
				err = SeedSessions(ctx, s, SeedInput{Template: "tmpl", Dir: "/kv-seed", N: 5, Batch: 2,
					ID: func(i int) string { return "c" + strconv.Itoa(i) }, Progress: func(n int) { progress = append(progress, n) }})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(progress, []int{2, 4, 5}) {
					t.Fatalf("progress %v", progress)
				}
				if err := s.checkInvariants(ctx); err != nil {
					t.Fatal(err)
				}
				twin := seedDump(t, s, "twin")
				for _, c := range []string{"tmpl", "c0", "c4"} {
					if got := seedDump(t, s, c); !slices.Equal(got, twin) {
						t.Fatalf("%s is not what the same turns make:\n%s\ntwin:\n%s", c, strings.Join(got, "\n"), strings.Join(twin, "\n"))
					}
				}
				// A plan on a copy is the plan on its twin; so is the turn.
				seedTurns(t, s, "c3", sys, 4)
				seedTurns(t, s, "twin", sys, 4)
				if a, b := seedDump(t, s, "c3"), seedDump(t, s, "twin"); !slices.Equal(a, b) {
					t.Fatalf("after a turn, c3:\n%s\ntwin:\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
				}
				if err := s.DeleteSession(ctx, "c2"); err != nil {
					t.Fatal(err)
				}
				// The quota: least recently used first, the copies in their order.
				var total int64
				if err := s.barrier(ctx); err != nil {
					t.Fatal(err)
				}
				if err := s.db.QueryRowContext(ctx, `SELECT SUM(reserved) FROM kv_files`).Scan(&total); err != nil {
					t.Fatal(err)
				}
				tm, err := s.Session(ctx, "tmpl")
				if err != nil {
					t.Fatal(err)
				}
				one := tm.Bytes // what each of tmpl, c0, c1 reserved in its 3 turns
				in := PlanInput{Session: "new", Model: "seed", TokenIDs: sys, Prefixes: []string{"/prefixes/seed"},
					Dir: "/kv-seed", Pool: "perf", ChunkSize: 1 << 20, PlanTTL: time.Hour, Now: time.Now(), Quota: total - 2*one}
				in.DecodeTokens = 1
				p, err := s.PlanSession(ctx, in)
				if err != nil {
					t.Fatal(err)
				}
				if want := []string{"tmpl", "c0", "c1"}; !slices.Equal(p.Evicted, want) {
					t.Fatalf("evicted %v, want %v (reserved %d, one session %d)", p.Evicted, want, total, one)
				}
				if err := s.checkInvariants(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
