package console

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
)

// cum builds cumulative latency buckets from per-bucket counts.
func cum(per map[int]float64) []float64 {
	n := len(api.LatencyBounds)
	out := make([]float64, n+1)
	var acc float64
	for i := 0; i <= n; i++ {
		acc += per[i]
		out[i] = acc
	}
	return out
}

func TestQuantile(t *testing.T) {
	b := api.LatencyBounds
	// 100 ops all in bucket 3 (b[2], b[3]]: the median is its middle.
	got := quantile(.5, cum(map[int]float64{3: 100}))
	if want := b[2] + (b[3]-b[2])*.5; math.Abs(got-want) > 1e-12 {
		t.Errorf("p50 = %g, want %g", got, want)
	}
	// 99 fast, 1 slow: p99 is still in the fast bucket, p100 in the slow one.
	c := cum(map[int]float64{0: 99, 10: 1})
	if got := quantile(.99, c); got > b[0] {
		t.Errorf("p99 = %g, want <= %g", got, b[0])
	}
	if got := quantile(1, c); got <= b[9] || got > b[10] {
		t.Errorf("p100 = %g, want in (%g, %g]", got, b[9], b[10])
	}
	// Beyond the last bound: the last bound. No operations: NaN.
	if got := quantile(.5, cum(map[int]float64{len(b): 5})); got != b[len(b)-1] {
		t.Errorf("overflow p50 = %g", got)
	}
	if !math.IsNaN(quantile(.5, cum(nil))) || !math.IsNaN(quantile(.5, []float64{1, 2})) {
		t.Error("no data or a bad layout should give NaN")
	}
}

func TestDiffKV(t *testing.T) {
	a := &api.KVStats{MemHits: 10, DiskHits: 5, Misses: 1, Latency: map[string][]uint64{"kv_get": make([]uint64, len(api.LatencyBounds)+1)}}
	b := *a
	b.MemHits, b.Misses = 14, 3
	b.Latency = map[string][]uint64{"kv_get": make([]uint64, len(api.LatencyBounds)+1)}
	b.Latency["kv_get"][len(api.LatencyBounds)] = 6
	d, ok := diffKV(a, &b)
	if !ok || d.memHits != 4 || d.diskHits != 0 || d.misses != 2 || d.gets() != 6 || d.lat["kv_get"][len(api.LatencyBounds)] != 6 {
		t.Errorf("delta %+v, %v", d, ok)
	}
	// A restarted server's counters go back: no delta, rather than a huge one.
	b.MemHits = 2
	if _, ok := diffKV(a, &b); ok {
		t.Error("counters that went back gave a delta")
	}
	if _, ok := diffKV(nil, &b); ok {
		t.Error("a server without KV in one sample gave a delta")
	}
}

func TestChartGapsAndDots(t *testing.T) {
	t0 := time.Unix(1000, 0)
	pts := []point{{t0.Add(1 * time.Second), 1}, {t0.Add(2 * time.Second), 2}, {t0.Add(3 * time.Second), math.NaN()}, {t0.Add(4 * time.Second), 4}}
	ch := mkChart("c", "c", "", 0, t0, t0.Add(4*time.Second), []string{"x"}, [][]point{pts}, trimFloat)
	d := ch.Lines[0].D
	if strings.Count(d, "M") != 2 || strings.Count(d, "L") != 1 || !strings.HasSuffix(d, "h0") {
		t.Errorf("path %q: want two runs, the second a lone dot", d)
	}
	if ch.Lines[0].Last != "4" || ch.YMax != "4" || ch.Empty != "" {
		t.Errorf("chart %+v", ch)
	}
	if e := mkChart("c", "c", "", 0, t0, t0, []string{"x"}, [][]point{nil}, trimFloat); e.Empty == "" || e.Lines[0].Last != "–" {
		t.Errorf("empty chart %+v", e)
	}
}
