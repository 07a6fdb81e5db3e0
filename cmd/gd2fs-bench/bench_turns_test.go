package main

import (
	"strings"
	"testing"
)

// TestHistogramReadings checks the plan-time quantiles and the scheduler
// shares the turns benchmark reads from two scrapes of the master's
// cumulative Prometheus buckets.
func TestHistogramReadings(t *testing.T) {
	const route = "POST /v1/sessions/{id}/plan"
	before := map[string]float64{
		"bucket " + route + " 0.0001": 10, "bucket " + route + " 0.0008": 10, "bucket " + route + " 0.0032": 10, "bucket " + route + " +Inf": 10,
		"bucket sched 9.2e-05": 100, "bucket sched 0.000917504": 100, "bucket sched 0.01048576": 100, "bucket sched +Inf": 100,
	}
	// 1,000 plans between the scrapes: 600 under 100µs, 390 more under
	// 800µs, 9 more under 3.2ms, one above.
	after := map[string]float64{
		"bucket " + route + " 0.0001": 610, "bucket " + route + " 0.0008": 1000, "bucket " + route + " 0.0032": 1009, "bucket " + route + " +Inf": 1010,
		"bucket sched 9.2e-05": 900, "bucket sched 0.000917504": 1000, "bucket sched 0.01048576": 1099, "bucket sched +Inf": 1100,
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
	got, ok := schedWaits(before, after, 500)
	if !ok || !strings.HasPrefix(got, "2.0 wake-ups a turn; ") || !strings.Contains(got, "10.00% over 917µs") || !strings.Contains(got, "0.10% over 10.5ms") {
		t.Fatalf("schedWaits = %q", got)
	}
}
