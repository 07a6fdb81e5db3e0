package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/cluster"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestHistogramReadings checks the plan-time quantiles and the scheduler
// shares the turns benchmark reads from two scrapes of the master's
// cumulative Prometheus buckets.
func TestHistogramReadings(t *testing.T) {
	const route = "POST /v1/sessions/{id}/plan"
	before := map[string]float64{
		"bucket " + route + " 0.0001": 10, "bucket " + route + " 0.0008": 10, "bucket " + route + " 0.0032": 10, "bucket " + route + " +Inf": 10,
		"bucket sched 8.192e-05": 100, "bucket sched 0.000917504": 100, "bucket sched 0.01048576": 100, "bucket sched +Inf": 100,
	}
	// 1,000 plans between the scrapes: 600 under 100µs, 390 more under
	// 800µs, 9 more under 3.2ms, one above.
	after := map[string]float64{
		"bucket " + route + " 0.0001": 610, "bucket " + route + " 0.0008": 1000, "bucket " + route + " 0.0032": 1009, "bucket " + route + " +Inf": 1010,
		"bucket sched 8.192e-05": 900, "bucket sched 0.000917504": 1000, "bucket sched 0.01048576": 1099, "bucket sched +Inf": 1100,
	}
	p50, p99, ok := handled(before, after, route)
	if !ok || p50 != "100µs" || p99 != "800µs" {
		t.Fatalf("handled = %q, %q, %v; want 100µs, 800µs, true", p50, p99, ok)
	}
	after["bucket "+route+" 0.0008"] = 900 // now the 99th is in the 3.2ms bucket
	if _, p99, _ := handled(before, after, route); p99 != "3.2ms" {
		t.Fatalf("p99 = %q, want 3.2ms", p99)
	}
	if _, _, ok := handled(before, before, route); ok {
		t.Fatal("no plans between the scrapes, but handled says ok")
	}
	after["bucket "+route+" 0.0032"] = 900 // the 99th above the largest finite bound
	if _, p99, _ := handled(before, after, route); p99 != "above the largest bucket" {
		t.Fatalf("p99 = %q, want above the largest bucket", p99)
	}
	got, ok := schedWaits(before, after)
	if !ok || !strings.Contains(got, "10.00% over 917µs") || !strings.Contains(got, "0.10% over 10.5ms") {
		t.Fatalf("schedWaits = %q", got)
	}
}

// TestMasterRequestsReadsHistograms scrapes a registry shaped like the
// master's (its request histogram, Go's scheduler metrics) over HTTP and
// checks the keys the readings above take.
func TestMasterRequestsReadsHistograms(t *testing.T) {
	reg := prometheus.NewRegistry()
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gd2fs_master_request_seconds",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}, []string{"route"})
	reg.MustRegister(lat, collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)))
	const route = "POST /v1/sessions/{id}/plan"
	for i := 0; i < 99; i++ {
		lat.WithLabelValues(route).Observe(80e-6)
	}
	lat.WithLabelValues(route).Observe(5e-3)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got, err := masterRequests(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	p50, p99, ok := handled(map[string]float64{}, got, route)
	if !ok || p50 != "100µs" || p99 != "100µs" {
		t.Fatalf("handled = %q, %q, %v; want 100µs, 100µs, true", p50, p99, ok)
	}
	if _, ok := schedWaits(map[string]float64{}, got); !ok {
		t.Fatalf("no scheduler buckets read from a registry with Go's scheduler metrics: %v", got)
	}
}

// TestProbeMaster checks the turns benchmark's reference call against a
// real master, framed and as HTTP: every call is answered (the empty
// batch refused as expected) and timed, so a probe that stopped being
// answered, or answered otherwise, would leave the figure out.
func TestProbeMaster(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), Servers: 1, MemBytes: 8 << 20, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, plain := range []bool{false, true} {
		got := probeMaster(context.Background(), c.Master.URL(), plain, time.Now().Add(20*probeEvery))
		// Every call but the first (the connection's) is timed; a tick
		// or two may be lost on a busy machine, not most.
		if got.sent < 6 || len(got.times) != got.sent-1 {
			t.Fatalf("plain HTTP %v: %d calls sent in 20 ticks, %d timed; want each timed but the first", plain, got.sent, len(got.times))
		}
		for _, d := range got.times {
			if d <= 0 {
				t.Fatalf("plain HTTP %v: a call timed %s", plain, d)
			}
		}
	}
	// A master that is gone: nothing is timed, and the probe ends at its
	// deadline.
	url := c.Master.URL()
	c.Close()
	if got := probeMaster(context.Background(), url, false, time.Now().Add(3*probeEvery)); len(got.times) != 0 {
		t.Fatalf("%d calls timed against a closed master", len(got.times))
	}
}

// TestTimes: the ratio a benchmark prints beside its reference, and none
// (rather than a division by zero) when no reference was timed.
func TestTimes(t *testing.T) {
	for _, c := range []struct {
		a, b time.Duration
		want string
	}{
		{3 * time.Millisecond, 2 * time.Millisecond, "1.50x"},
		{840 * time.Microsecond, time.Millisecond, "0.84x"},
		{time.Millisecond, 0, "-"},
		{0, 0, "-"},
	} {
		if got := times(c.a, c.b); got != c.want {
			t.Errorf("times(%s, %s) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}
