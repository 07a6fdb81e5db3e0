package console

import (
	"math"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
)

// kvDelta is what a server's KV counters moved by between two samples.
type kvDelta struct {
	memHits, diskHits, misses, puts float64
	demotions, promotions, evicts   float64
	lat                             map[string][]float64 // per op, cumulative bucket deltas
}

func (d *kvDelta) add(o kvDelta) {
	d.memHits += o.memHits
	d.diskHits += o.diskHits
	d.misses += o.misses
	d.puts += o.puts
	d.demotions += o.demotions
	d.promotions += o.promotions
	d.evicts += o.evicts
	if d.lat == nil {
		d.lat = map[string][]float64{}
	}
	for op, b := range o.lat {
		acc := d.lat[op]
		if acc == nil {
			acc = make([]float64, len(b))
		}
		for i := range min(len(acc), len(b)) {
			acc[i] += b[i]
		}
		d.lat[op] = acc
	}
}

func (d kvDelta) gets() float64 { return d.memHits + d.diskHits + d.misses }

// kvInterval is the movement between two consecutive samples ending at At.
type kvInterval struct {
	At      time.Time
	Seconds float64
	Servers map[string]kvDelta
	Total   kvDelta
}

// diffKV turns counters into deltas. A server missing from either sample,
// or whose counters went back (it restarted), has no delta for that interval.
func diffKV(a, b *api.KVStats) (kvDelta, bool) {
	if a == nil || b == nil {
		return kvDelta{}, false
	}
	type pair struct{ x, y uint64 }
	ps := []pair{{a.MemHits, b.MemHits}, {a.DiskHits, b.DiskHits}, {a.Misses, b.Misses}, {a.Puts, b.Puts},
		{a.Demotions, b.Demotions}, {a.Promotions, b.Promotions}, {a.Evictions, b.Evictions}}
	v := make([]float64, len(ps))
	for i, p := range ps {
		if p.y < p.x {
			return kvDelta{}, false
		}
		v[i] = float64(p.y - p.x)
	}
	d := kvDelta{memHits: v[0], diskHits: v[1], misses: v[2], puts: v[3], demotions: v[4], promotions: v[5], evicts: v[6],
		lat: map[string][]float64{}}
	for op, bb := range b.Latency {
		ab := a.Latency[op]
		if len(ab) != len(bb) {
			continue
		}
		out := make([]float64, len(bb))
		for i := range bb {
			if bb[i] < ab[i] {
				return kvDelta{}, false
			}
			out[i] = float64(bb[i] - ab[i])
		}
		d.lat[op] = out
	}
	return d, true
}

func kvIntervals(ss []sample) []kvInterval {
	var out []kvInterval
	for i := 1; i < len(ss); i++ {
		a, b := ss[i-1], ss[i]
		iv := kvInterval{At: b.At, Seconds: b.At.Sub(a.At).Seconds(), Servers: map[string]kvDelta{}}
		if iv.Seconds <= 0 {
			continue
		}
		prev := map[string]*api.KVStats{}
		for _, s := range a.Servers {
			prev[s.ID] = s.KV
		}
		for _, s := range b.Servers {
			if d, ok := diffKV(prev[s.ID], s.KV); ok {
				iv.Servers[s.ID] = d
				iv.Total.add(d)
			}
		}
		out = append(out, iv)
	}
	return out
}

// quantile estimates the q-quantile, in seconds, from cumulative bucket
// counts over api.LatencyBounds (last entry: all), interpolating linearly
// within a bucket as Prometheus's histogram_quantile does. NaN: no samples.
func quantile(q float64, cum []float64) float64 {
	n := len(api.LatencyBounds)
	if len(cum) != n+1 || cum[n] <= 0 {
		return math.NaN()
	}
	rank := q * cum[n]
	for i := 0; i < n; i++ {
		if cum[i] >= rank {
			lo, prev := 0.0, 0.0
			if i > 0 {
				lo, prev = api.LatencyBounds[i-1], cum[i-1]
			}
			if cum[i] == prev {
				return api.LatencyBounds[i]
			}
			return lo + (api.LatencyBounds[i]-lo)*(rank-prev)/(cum[i]-prev)
		}
	}
	return api.LatencyBounds[n-1] // beyond the last bound: say at least that
}

func div(a, b float64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}

// kvCharts draws the series of one server (id) or of all (id == "").
func kvCharts(prefix string, ivs []kvInterval, id string, full bool) []Chart {
	if len(ivs) == 0 {
		return []Chart{mkChart(prefix+"-hit", "Hit ratio per tier", "%", 100, time.Time{}, time.Time{}, []string{"DRAM", "disk"}, [][]point{nil, nil}, trimFloat)}
	}
	from, to := ivs[0].At.Add(-time.Duration(ivs[0].Seconds*float64(time.Second))), ivs[len(ivs)-1].At
	pick := func(iv kvInterval) (kvDelta, bool) {
		if id == "" {
			return iv.Total, true
		}
		d, ok := iv.Servers[id]
		return d, ok
	}
	series := func(n int, f func(d kvDelta, sec float64) []float64) [][]point {
		out := make([][]point, n)
		for _, iv := range ivs {
			d, ok := pick(iv)
			vals := make([]float64, n)
			if ok {
				vals = f(d, iv.Seconds)
			} else {
				for i := range vals {
					vals[i] = math.NaN()
				}
			}
			for i := range out {
				out[i] = append(out[i], point{iv.At, vals[i]})
			}
		}
		return out
	}
	hit := series(2, func(d kvDelta, _ float64) []float64 {
		return []float64{100 * div(d.memHits, d.gets()), 100 * div(d.diskHits, d.gets())}
	})
	moves := series(3, func(d kvDelta, s float64) []float64 {
		return []float64{d.evicts / s, d.demotions / s, d.promotions / s}
	})
	charts := []Chart{
		mkChart(prefix+"-hit", "Hit ratio per tier (% of gets)", "%", 100, from, to, []string{"DRAM", "disk"}, hit, trimFloat),
		mkChart(prefix+"-moves", "Evictions, demotions, promotions per second", "/s", 0, from, to, []string{"evictions", "demotions", "promotions"}, moves, rate),
	}
	lat := func(op string, qs ...float64) func(d kvDelta, _ float64) []float64 {
		return func(d kvDelta, _ float64) []float64 {
			out := make([]float64, len(qs))
			for i, q := range qs {
				out[i] = quantile(q, d.lat[op])
			}
			return out
		}
	}
	ms := func(f float64) string { return millis(f) }
	if !full {
		p99 := series(3, func(d kvDelta, _ float64) []float64 {
			return []float64{quantile(.99, d.lat["kv_get"]), quantile(.99, d.lat["kv_put"]), quantile(.99, d.lat["kv_exists"])}
		})
		return append(charts, mkChart(prefix+"-p99", "p99 latency (ms)", " ms", 0, from, to, []string{"get", "put", "exists"}, p99, ms))
	}
	ops := series(2, func(d kvDelta, s float64) []float64 { return []float64{d.gets() / s, d.puts / s} })
	charts = append(charts, mkChart(prefix+"-ops", "Gets and puts per second", "/s", 0, from, to, []string{"gets", "puts"}, ops, rate))
	for _, op := range []struct{ key, name string }{{"kv_get", "get"}, {"kv_put", "put"}, {"kv_exists", "exists"}} {
		charts = append(charts, mkChart(prefix+"-"+op.name, op.name+" latency p50 / p99 (ms)", " ms", 0, from, to,
			[]string{"p50", "p99"}, series(2, lat(op.key, .5, .99)), ms))
	}
	return charts
}

func (c *Console) kvView(v *View, st api.Status) {
	ss := c.snapshot()
	ivs := kvIntervals(ss)
	var win kvDelta
	var secs float64
	perServer := map[string]kvDelta{}
	for _, iv := range ivs {
		win.add(iv.Total)
		secs += iv.Seconds
		for id, d := range iv.Servers {
			acc := perServer[id]
			acc.add(d)
			perServer[id] = acc
		}
	}
	window := "last " + span(time.Duration(secs*float64(time.Second)))
	var tot api.KVStats
	withKV := 0
	for _, s := range st.Servers {
		if s.KV == nil || s.State != "up" {
			continue
		}
		withKV++
		k := s.KV
		tot.Keys += k.Keys
		tot.MemKeys += k.MemKeys
		tot.MemCap += k.MemCap
		tot.MemUsed += k.MemUsed
		tot.DiskCap += k.DiskCap
		tot.DiskUsed += k.DiskUsed
		tot.PinnedKeys += k.PinnedKeys
		tot.PinnedMem += k.PinnedMem
		tot.PinnedDisk += k.PinnedDisk
		tot.PinQuotaMem += k.PinQuotaMem
		tot.PinQuotaDisk += k.PinQuotaDisk
		tot.ExpiringKeys += k.ExpiringKeys
	}
	note := "Figures come from the servers' heartbeats; the master keeps " + count(int64(c.cfg.Keep)) + " samples, one every " +
		c.cfg.Interval.String() + ". Rates and ratios cover the " + window + "."
	if withKV == 0 {
		note = "No up server reports a KV cache (start servers with --kv-mem or --kv-disk). " + note
	}
	v.Sections = append(v.Sections, Section{ID: "kv-total", Title: "All servers", Note: note, Stats: []Stat{
		{ID: "kv-keys", Label: "keys", Value: count(tot.Keys), Sub: count(tot.MemKeys) + " with a DRAM copy"},
		{ID: "kv-dram", Label: "DRAM", Value: usedOf(tot.MemUsed, tot.MemCap), Meter: frac(tot.MemUsed, tot.MemCap)},
		{ID: "kv-disk", Label: "disk", Value: usedOf(tot.DiskUsed, tot.DiskCap), Meter: frac(tot.DiskUsed, tot.DiskCap)},
		{ID: "kv-hit-dram", Label: "DRAM hit ratio", Value: ratio(div(win.memHits, win.gets())), Sub: window},
		{ID: "kv-hit-disk", Label: "disk hit ratio", Value: ratio(div(win.diskHits, win.gets())), Sub: rate(div(win.gets(), secs)) + " gets/s"},
		{ID: "kv-pinned", Label: "pinned", Value: count(tot.PinnedKeys) + " blocks",
			Sub: "DRAM " + usedOf(tot.PinnedMem, tot.PinQuotaMem) + ", disk " + usedOf(tot.PinnedDisk, tot.PinQuotaDisk) + " of the pin quotas; " + count(tot.ExpiringKeys) + " with a TTL"},
		{ID: "kv-get-p99", Label: "get p50 / p99", Value: millis(quantile(.5, win.lat["kv_get"])) + " / " + millis(quantile(.99, win.lat["kv_get"])) + " ms"},
	}, Charts: kvCharts("kv-total", ivs, "", true)})

	t := &Table{ID: "kv-servers", Head: []string{"server", "state", "keys", "DRAM keys", "DRAM", "disk", "DRAM hits", "disk hits",
		"gets/s", "puts/s", "evict/s", "get p50/p99 ms", "put p99 ms", "exists p99 ms"}, Empty: "no servers"}
	for _, s := range st.Servers {
		k := s.KV
		if k == nil {
			t.Rows = append(t.Rows, []Cell{txt(s.ID), txt(s.State), {Text: "no KV cache", Class: "muted"}})
			continue
		}
		d := perServer[s.ID]
		t.Rows = append(t.Rows, []Cell{txt(s.ID), {Text: s.State, Class: "state-" + s.State}, txt(count(k.Keys)), txt(count(k.MemKeys)),
			txt(usedOf(k.MemUsed, k.MemCap)), txt(usedOf(k.DiskUsed, k.DiskCap)),
			txt(ratio(div(d.memHits, d.gets()))), txt(ratio(div(d.diskHits, d.gets()))),
			txt(rate(div(d.gets(), secs))), txt(rate(div(d.puts, secs))), txt(rate(div(d.evicts, secs))),
			txt(millis(quantile(.5, d.lat["kv_get"])) + " / " + millis(quantile(.99, d.lat["kv_get"]))),
			txt(millis(quantile(.99, d.lat["kv_put"]))), txt(millis(quantile(.99, d.lat["kv_exists"])))})
	}
	v.Sections = append(v.Sections, Section{ID: "kv-per-server", Title: "Per server (" + window + ")", Table: t})
	for _, s := range st.Servers {
		if s.KV == nil {
			continue
		}
		v.Sections = append(v.Sections, Section{ID: "kv-" + s.ID, Title: s.ID, Charts: kvCharts("kv-"+s.ID, ivs, s.ID, false)})
	}
}
