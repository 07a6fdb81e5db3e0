package master

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/internal/frames"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	repairs   *prometheus.CounterVec
	refills   *prometheus.CounterVec
	evictions prometheus.Counter
	// Explicit-mode plans, the tokens they found cached, and commits refused.
	plans, cachedTokens, commitFailures prometheus.Counter
	// Questions to servers of what they hold (OpExtents) before commits.
	heldAsks prometheus.Counter
	// Requests refused before any handler (guard.go), by reason.
	refusals *prometheus.CounterVec
	// Plans whose stored part was cut short, by reason (server_down).
	shortened *prometheus.CounterVec
}

func newMetrics(m *Master) *metrics {
	x := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_master_requests_total",
			Help: "API requests by route and HTTP status."}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gd2fs_master_request_seconds",
			Help: "API request latency.", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}, []string{"route"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_master_repairs_total",
			Help: "HA chunk re-replications by outcome."}, []string{"outcome"}),
		refills: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_master_refills_after_failure_total",
			Help: "Linked-file chunks re-placed onto a live server (to refill from S3) because readers found their server down, by outcome."}, []string{"outcome"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_master_session_evictions_total",
			Help: "KV sessions evicted to keep session files within the quota."}),
		plans:          prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_master_session_plans_total", Help: "Explicit-mode plans made."}),
		cachedTokens:   prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_master_session_cached_tokens_total", Help: "Tokens plans found stored."}),
		commitFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_master_session_commit_failures_total", Help: "Session commits refused."}),
		heldAsks: prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_master_held_asks_total",
			Help: "Questions to servers of which bytes of a chunk they hold, before commits."}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_master_refused_total",
			Help: "Requests refused before any handler: wrong Host, cross-origin, not JSON, heartbeat without the server role, wrong token."}, []string{"reason"}),
		shortened: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_master_session_plans_shortened_total",
			Help: "Plans whose stored part ends early, by reason (server_down: stored bytes on a server that is down)."}, []string{"reason"}),
	}
	up := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gd2fs_master_servers_up", Help: "Servers heartbeating."}, func() float64 {
		m.mu.Lock()
		defer m.mu.Unlock()
		n := 0
		for _, s := range m.servers {
			if s.up {
				n++
			}
		}
		return float64(n)
	})
	epoch := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gd2fs_master_epoch", Help: "Membership epoch."}, func() float64 {
		m.mu.Lock()
		defer m.mu.Unlock()
		return float64(m.epoch)
	})
	x.reg.MustRegister(x.requests, x.latency, x.repairs, x.refills, x.evictions, x.plans, x.cachedTokens, x.commitFailures, x.heldAsks, x.refusals, x.shortened, up, epoch,
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC, collectors.MetricsScheduler)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Write-behind of the session table (meta/writebehind.go).
	if st, ok := m.sessions.(meta.WriteBehindStatser); ok {
		for _, c := range []struct {
			name, help string
			v          func(meta.WriteBehindStats) int64
		}{
			{"gd2fs_master_session_ops_from_memory_total", "Session plans and commits the leader answered from memory (the rest ran in SQL).", func(s meta.WriteBehindStats) int64 { return s.Fast }},
			{"gd2fs_master_session_flushes_total", "Transactions that wrote session operations answered from memory.", func(s meta.WriteBehindStats) int64 { return s.Flushes }},
			{"gd2fs_master_session_flushed_ops_total", "Session operations answered from memory and written to SQL.", func(s meta.WriteBehindStats) int64 { return s.Flushed }},
			{"gd2fs_master_session_flushed_statements_total", "SQL statements the flushes of session operations wrote.", func(s meta.WriteBehindStats) int64 { return s.Statements }},
			{"gd2fs_master_session_file_syncs_from_memory_total", "Syncs of session files (an engine's saved KV) the leader answered from memory, written with the session operations' flushes.", func(s meta.WriteBehindStats) int64 { return s.Syncs }},
			{"gd2fs_master_session_log_waits_total", "Reads and operations that waited for the leader's log of session operations to be written (a file's stat or chunk list, an allocation, a Sync in SQL); in window mode each forces a flush.", func(s meta.WriteBehindStats) int64 { return s.LogWaits }},
			{"gd2fs_master_session_dropped_statements_total", "Statements of session operations not written because a later one of the same flush overwrote them.", func(s meta.WriteBehindStats) int64 { return s.Dropped }},
		} {
			x.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help}, func() float64 { return float64(c.v(st.WriteBehindStats())) }))
		}
		for op, name := range []string{"plan", "commit"} {
			for r, reason := range meta.SlowReasonNames {
				x.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gd2fs_master_session_ops_in_sql_total",
					Help:        "Session plans and commits the leader ran in SQL instead of answering from memory, by why (docs/kv-cache.md, write-behind).",
					ConstLabels: prometheus.Labels{"op": name, "reason": reason}},
					func() float64 { return float64(st.WriteBehindStats().Slow[op][r]) }))
			}
		}
		x.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gd2fs_master_sessions_shed_total",
			Help: "Sessions the leader dropped from memory to stay within --session-memory (they plan from SQL next, which loads them back)."},
			func() float64 { return float64(st.WriteBehindStats().Shed) }))
		x.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gd2fs_master_session_flushes_failed_total",
			Help: "Logs of session operations answered from memory that the leader could not write (lost in window mode, run again in SQL in flush mode); each drops the leader's memory."},
			func() float64 { return float64(st.WriteBehindStats().FailedFlushes) }))
		x.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gd2fs_master_sessions_in_memory",
			Help: "Sessions the leader holds in memory (after its last batch of operations run in SQL)."},
			func() float64 { return float64(st.WriteBehindStats().Held) }))
		x.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gd2fs_master_session_flush_seconds_total",
			Help: "Time spent in flushes of session operations answered from memory (a crash in window mode loses about two flushes' worth)."},
			func() float64 { return st.WriteBehindStats().FlushTime.Seconds() }))
	}
	return x
}

// registerFrameMetrics counts the framed connections (package frames).
func (x *metrics) registerFrameMetrics(fs *frames.Server) {
	x.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gd2fs_master_framed_connections",
		Help: "Framed connections open (clients' explicit-session calls without HTTP's per-request cost; GET /v1/frames)."},
		func() float64 { return float64(fs.Open()) }))
	x.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gd2fs_master_framed_calls_total",
		Help: "Calls answered on framed connections (also counted by route in gd2fs_master_request_seconds)."},
		func() float64 { return float64(fs.Calls()) }))
}

func (x *metrics) handler() http.Handler { return promhttp.HandlerFor(x.reg, promhttp.HandlerOpts{}) }

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(c int) { w.code = c; w.ResponseWriter.WriteHeader(c) }

func (x *metrics) instrument(route string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: 200}
		next.ServeHTTP(sw, r)
		x.requests.WithLabelValues(route, strconv.Itoa(sw.code)).Inc()
		x.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

func (x *metrics) refused(reason string) { x.refusals.WithLabelValues(reason).Inc() }
