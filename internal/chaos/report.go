package chaos

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

func itoa(n int) string { return strconv.Itoa(n) }

var shortKind = [nKinds]string{"ha w", "ha r", "perf w", "perf r", "kv put", "kv get", "sess plan", "sess commit", "linked"}

// report renders the run as markdown (also printed).
func (c *cluster) report(st *Stats, m *model, steps []*step, sw sweep, before, after map[string]usage, loadTime time.Duration, res *Result) string {
	cfg := c.cfg
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("## Chaos run, %s", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	p("")
	p("Command: `%s`", cfg.Command)
	p("")
	nm := len(c.masters)
	p("Cluster: %d master(s) on %s, %d servers (32 MiB DRAM, disk tier on a %s), each behind the harness's TCP proxy; %s. Seed %d; load ran %.0fs; each fault held %s.",
		nm, map[bool]string{true: "PostgreSQL (fresh schema)", false: "SQLite"}[nm > 1], cfg.Servers,
		map[bool]string{true: "384 MiB tmpfs", false: "directory"}[c.tmpfs], c.netNote, cfg.Seed, loadTime.Seconds(), cfg.Hold)
	if cfg.KeepFiles > 0 {
		p("")
		p("Each writer keeps its last %d files and removes older ones, so reads race removes.", cfg.KeepFiles)
	}
	p("")
	p("### Faults injected, and recovery after each heal")
	p("")
	p("Recovery: seconds from the heal to the end of the first successful operation of each kind that started after it (`-`: none within %s). Failed: operations that failed (not ok, not a clean miss) while the fault was in force.", cfg.RecoveryBound)
	p("")
	hdr := "| # | fault | victim | failed |"
	sep := "|---|---|---|---|"
	for k := range nKinds {
		hdr += " " + shortKind[k] + " |"
		sep += "---|"
	}
	hdr += " note |"
	sep += "---|"
	p("%s", hdr)
	p("%s", sep)
	for i, s := range steps {
		row := fmt.Sprintf("| %d | %s | %s |", i+1, s.fault, s.victim)
		if s.skipped != "" {
			p("%s |%s skipped: %s |", row, strings.Repeat(" |", int(nKinds)), s.skipped)
			continue
		}
		if s.injected.IsZero() {
			p("%s |%s not reached |", row, strings.Repeat(" |", int(nKinds)))
			continue
		}
		bad := 0
		for k := range nKinds {
			bad += s.bad[k]
		}
		row += fmt.Sprintf(" %d |", bad)
		for k := range nKinds {
			if s.recovery[k] < 0 {
				row += " **-** |"
			} else {
				row += fmt.Sprintf(" %.1f |", s.recovery[k].Seconds())
			}
		}
		row += " " + s.note + " |"
		p("%s", row)
	}
	p("")
	p("### Operations by outcome")
	p("")
	p("| kind | ok | clean miss | shortened plan | unavailable | other error | WRONG BYTES | LOST ACK | slowest |")
	p("|---|---|---|---|---|---|---|---|---|")
	for k := range nKinds {
		row := "| " + k.String() + " |"
		for o := range nOutcomes {
			row += fmt.Sprintf(" %d |", st.counts[k][o].Load())
		}
		row += fmt.Sprintf(" %.1fs |", time.Duration(st.maxLat[k].Load()).Seconds())
		p("%s", row)
	}
	p("")
	p("Bytes verified against the content model: %s (reads during the load and the final sweep). Files acknowledged: %d HA, %d perf.",
		humanBytes(st.verified.Load()), m.acked[0].Load(), m.acked[1].Load())
	p("")
	p("Final sweep (every fault healed, load stopped): HA files %d intact, %d LOST; perf files %d intact, %d missing (allowed); %d with wrong bytes; %d being removed (not counted). KV keys: %d ok, %d clean miss, %d unavailable, %d WRONG.",
		sw.haOK, sw.haLost, sw.perfOK, sw.perfMissing, sw.wrong, sw.skipped, sw.kvOK, sw.kvMiss, sw.kvUnavail, sw.kvWrong)
	p("")
	p("### Processes: open file descriptors and goroutines, at rest before and after")
	p("")
	p("| process | fds before | fds after | goroutines before | goroutines after | note |")
	p("|---|---|---|---|---|---|")
	var names []string
	for n := range before {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		bu, au := before[n], after[n]
		note := ""
		if bu.pid != au.pid {
			note = "restarted during the run (not compared)"
		}
		p("| %s | %d | %d | %d | %d | %s |", n, bu.fds, au.fds, bu.goroutines, au.goroutines, note)
	}
	p("")
	if errs := st.topErrors(25); len(errs) > 0 {
		p("### Errors seen (most frequent first; numbers replaced by N)")
		p("")
		p("| kind | outcome | message | count | first seen |")
		p("|---|---|---|---|---|")
		for _, e := range errs {
			for i := range e {
				e[i] = strings.ReplaceAll(e[i], "|", "\\|")
			}
			p("| %s |", strings.Join(e[:], " | "))
		}
		p("")
	}
	p("### Verdict")
	p("")
	if res.Violations == 0 {
		p("Integrity: **PASS** (no wrong bytes, no lost acknowledged HA write).")
	} else {
		p("Integrity: **FAIL**: %d violations:", res.Violations)
		st.mu.Lock()
		for i, e := range st.examples {
			if i == 20 {
				p("- ... %d more", len(st.examples)-20)
				break
			}
			p("- %s", e)
		}
		st.mu.Unlock()
	}
	p("")
	if len(res.Findings) == 0 {
		p("Availability: **PASS** (every kind recovered within %s of each heal; no leak).", cfg.RecoveryBound)
	} else {
		p("Availability findings (%d; fatal only with --strict):", len(res.Findings))
		p("")
		for _, f := range res.Findings {
			p("- %s", f)
		}
	}
	return b.String()
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}
