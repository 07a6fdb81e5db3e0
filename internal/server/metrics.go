package server

import (
	"net/http"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/version"
	"github.com/gd2fs/gd2fs/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

type metrics struct {
	reg       *prometheus.Registry
	ops       *prometheus.CounterVec
	errors    *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	bytesIn   prometheus.Counter
	bytesOut  prometheus.Counter
	conns     prometheus.Gauge
	coldBytes prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_server_ops_total",
			Help: "Data-plane operations by opcode and outcome."}, []string{"op", "status"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gd2fs_server_errors_total",
			Help: "Failed data-plane operations by opcode and status."}, []string{"op", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gd2fs_server_op_seconds",
			Help:    "Data-plane operation latency, from frame header to response.",
			Buckets: prometheus.ExponentialBuckets(20e-6, 2, 18)}, []string{"op"}),
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_server_bytes_in_total",
			Help: "Payload bytes received."}),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_server_bytes_out_total",
			Help: "Payload bytes sent."}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gd2fs_server_connections",
			Help: "Open data-plane connections."}),
		coldBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_server_cold_bytes_total",
			Help: "Bytes fetched from the cold tier (S3) to fill chunks of linked files."}),
	}
	m.reg.MustRegister(m.ops, m.errors, m.latency, m.bytesIn, m.bytesOut, m.conns, m.coldBytes,
		&storeCollector{s: s}, &kvCollector{s: s}, version.Collector(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gd2fs_bufpool_held_bytes",
			Help: "Bytes of free payload buffers the process keeps for reuse (internal/bufpool; up to about 3.2 GiB)."},
			func() float64 { return float64(bufpool.Held()) }),
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC, collectors.MetricsScheduler)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// kvStats is the KV figures a heartbeat carries: the store's counters and
// the cumulative latency buckets of KV gets, puts and exists (api.KVStats).
func (s *Server) kvStats() *api.KVStats {
	if s.kv == nil {
		return nil
	}
	st := s.kv.Stats()
	out := &api.KVStats{Keys: int64(st.Keys), MemKeys: int64(st.MemKeys), MemCap: st.MemCap, MemUsed: st.MemUsed,
		DiskCap: st.DiskCap, DiskUsed: st.DiskUsed, MemHits: st.MemHits, DiskHits: st.DiskHits, Misses: st.Misses,
		Puts: st.Puts, Demotions: st.Demotions, Promotions: st.Promotions, Evictions: st.Evictions,
		PinnedKeys: int64(st.PinnedKeys), PinnedMem: st.PinnedMem, PinnedDisk: st.PinnedDisk, PinQuotaMem: st.PinQuotaMem,
		PinQuotaDisk: st.PinQuotaDisk, ExpiringKeys: int64(st.ExpiringKeys), Expired: st.Expired,
		Latency: map[string][]uint64{}}
	for _, op := range []wire.Op{wire.OpKVGet, wire.OpKVPut, wire.OpKVExists} {
		h, ok := s.metrics.latency.WithLabelValues(op.String()).(prometheus.Metric)
		var d dto.Metric
		if !ok || h.Write(&d) != nil || d.Histogram == nil {
			continue
		}
		b := make([]uint64, 0, len(d.Histogram.Bucket)+1)
		for _, x := range d.Histogram.Bucket {
			b = append(b, x.GetCumulativeCount())
		}
		out.Latency[op.String()] = append(b, d.Histogram.GetSampleCount())
	}
	return out
}

func (m *metrics) observe(op wire.Op, start time.Time, err error) {
	st := wire.StatusOf(err)
	m.ops.WithLabelValues(op.String(), st.String()).Inc()
	if err != nil {
		m.errors.WithLabelValues(op.String(), st.String()).Inc()
	}
	m.latency.WithLabelValues(op.String()).Observe(time.Since(start).Seconds())
}

// storeCollector reads tier figures from the store at scrape time.
type storeCollector struct{ s *Server }

var (
	descTier  = prometheus.NewDesc("gd2fs_server_tier_bytes", "Tier capacity and use in bytes.", []string{"tier", "kind"}, nil)
	descReads = prometheus.NewDesc("gd2fs_server_tier_reads_total", "Chunk reads served per tier.", []string{"tier"}, nil)
	descEvict = prometheus.NewDesc("gd2fs_server_evictions_total", "Chunks dropped from DRAM to make room.", nil, nil)
	descBad   = prometheus.NewDesc("gd2fs_server_corrupt_total", "Blocks or chunk files that failed their checksum.", nil, nil)
	descChk   = prometheus.NewDesc("gd2fs_server_chunks", "Chunks held.", nil, nil)
	descSync  = prometheus.NewDesc("gd2fs_server_syncs_total", "fdatasyncs of chunk files (durable writes, group-committed).", nil, nil)
)

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descTier
	ch <- descReads
	ch <- descEvict
	ch <- descBad
	ch <- descChk
	ch <- descSync
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	u, st := c.s.store.Usage(), c.s.store.Stats()
	g, k := prometheus.GaugeValue, prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(descTier, g, float64(u.MemCap), "dram", "capacity")
	ch <- prometheus.MustNewConstMetric(descTier, g, float64(u.MemUsed), "dram", "used")
	ch <- prometheus.MustNewConstMetric(descTier, g, float64(u.DiskCap), "disk", "capacity")
	ch <- prometheus.MustNewConstMetric(descTier, g, float64(u.DiskUsed), "disk", "used")
	ch <- prometheus.MustNewConstMetric(descReads, k, float64(st.MemReads), "dram")
	ch <- prometheus.MustNewConstMetric(descReads, k, float64(st.DiskReads), "disk")
	ch <- prometheus.MustNewConstMetric(descEvict, k, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(descBad, k, float64(st.Corrupt))
	ch <- prometheus.MustNewConstMetric(descChk, g, float64(u.Chunks))
	ch <- prometheus.MustNewConstMetric(descSync, k, float64(st.Syncs))
}

// kvCollector reads the KV store's figures at scrape time.
type kvCollector struct{ s *Server }

var (
	descKVBytes = prometheus.NewDesc("gd2fs_kv_tier_bytes", "KV tier capacity and use in bytes.", []string{"tier", "kind"}, nil)
	descKVHits  = prometheus.NewDesc("gd2fs_kv_hits_total", "KV gets served, per tier.", []string{"tier"}, nil)
	descKVMiss  = prometheus.NewDesc("gd2fs_kv_misses_total", "KV gets that found nothing.", nil, nil)
	descKVMoves = prometheus.NewDesc("gd2fs_kv_moves_total", "KV blocks demoted DRAM to disk, promoted back, or evicted from the last tier.", []string{"kind"}, nil)
	descKVKeys  = prometheus.NewDesc("gd2fs_kv_keys", "KV blocks held.", nil, nil)
	descKVPol   = prometheus.NewDesc("gd2fs_kv_policy", "1 for the KV DRAM tier's policy now (s3fifo or lru; --kv-policy auto picks).", []string{"policy"}, nil)
	descKVSw    = prometheus.NewDesc("gd2fs_kv_policy_switches_total", "Times --kv-policy auto changed the KV DRAM tier's policy.", nil, nil)
	descKVBad   = prometheus.NewDesc("gd2fs_kv_corrupt_total", "KV records that failed their checksum.", nil, nil)
	descKVPuts  = prometheus.NewDesc("gd2fs_kv_puts_total", "KV puts by outcome.", []string{"outcome"}, nil)
	descKVMoved = prometheus.NewDesc("gd2fs_kv_membership_blocks_total", "KV blocks after membership changes: moved here from an earlier owner, reads and probes answered through an earlier owner (fallback_hit), misses of keys whose earlier owner is down (lost).", []string{"kind"}, nil)
)

func (c *kvCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKVBytes, descKVHits, descKVMiss, descKVMoves, descKVKeys, descKVBad, descKVPuts, descKVPol, descKVSw, descKVMoved} {
		ch <- d
	}
}

func (c *kvCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.kv == nil {
		return
	}
	st := c.s.kv.Stats()
	g, k := prometheus.GaugeValue, prometheus.CounterValue
	ch <- prometheus.MustNewConstMetric(descKVBytes, g, float64(st.MemCap), "dram", "capacity")
	ch <- prometheus.MustNewConstMetric(descKVBytes, g, float64(st.MemUsed), "dram", "used")
	ch <- prometheus.MustNewConstMetric(descKVBytes, g, float64(st.DiskCap), "disk", "capacity")
	ch <- prometheus.MustNewConstMetric(descKVBytes, g, float64(st.DiskUsed), "disk", "used")
	ch <- prometheus.MustNewConstMetric(descKVHits, k, float64(st.MemHits), "dram")
	ch <- prometheus.MustNewConstMetric(descKVHits, k, float64(st.DiskHits), "disk")
	ch <- prometheus.MustNewConstMetric(descKVMiss, k, float64(st.Misses))
	ch <- prometheus.MustNewConstMetric(descKVMoves, k, float64(st.Demotions), "demotion")
	ch <- prometheus.MustNewConstMetric(descKVMoves, k, float64(st.Promotions), "promotion")
	ch <- prometheus.MustNewConstMetric(descKVMoves, k, float64(st.Evictions), "eviction")
	ch <- prometheus.MustNewConstMetric(descKVKeys, g, float64(st.Keys))
	if st.Policy != "" {
		for _, p := range []string{"s3fifo", "lru"} {
			v := 0.0
			if p == st.Policy {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descKVPol, g, v, p)
		}
		ch <- prometheus.MustNewConstMetric(descKVSw, k, float64(st.PolicySwitches))
	}
	ch <- prometheus.MustNewConstMetric(descKVBad, k, float64(st.Corrupt))
	ch <- prometheus.MustNewConstMetric(descKVPuts, k, float64(st.Puts), "stored")
	ch <- prometheus.MustNewConstMetric(descKVPuts, k, float64(st.Existed), "existed")
	mv := c.s.KVMoves()
	ch <- prometheus.MustNewConstMetric(descKVMoved, k, float64(mv.Moved), "moved")
	ch <- prometheus.MustNewConstMetric(descKVMoved, k, float64(mv.FallbackHits), "fallback_hit")
	ch <- prometheus.MustNewConstMetric(descKVMoved, k, float64(mv.Lost), "lost")
}
