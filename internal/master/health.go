package master

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/version"
	"github.com/prometheus/client_golang/prometheus"
)

// Health endpoints and the metrics alerts are written against
// (deploy/prometheus/gd2fs-alerts.yml). Neither needs the cluster token:
// they say nothing a port scan would not, and probes carry no credentials.
//
//   - GET /healthz (liveness): 200 "ok" while the process serves HTTP, leader
//     or standby. A master whose metadata store is unreachable still
//     answers: restarting it would not bring the database back.
//   - GET /readyz (readiness): 200 when this master leads (during its
//     warm-up too: it must take the servers' heartbeats to end it), or when
//     it is a standby whose metadata store answers, ready to take over. 503
//     when it can reach neither: a standby that cannot read the store could
//     not take over either. The JSON body says the role, the leader's URL
//     and the version. Standbys are ready on purpose: a Deployment's rolling
//     update waits for new pods to be ready, and a new master stays a
//     standby while the old leader holds the lock.
type masterHealth struct {
	changes prometheus.Counter // leadership gained or lost

	mu         sync.Mutex
	degraded   float64   // cached gd2fs_master_ha_replicas_missing
	degradedAt time.Time // when it was counted
	degradedOf string    // of which servers (a change counts again at once)
}

// degradedEvery bounds how often the scrape-time count of missing HA
// replicas reads the metadata store (one query per server not serving).
const degradedEvery = 15 * time.Second

// leadershipChanged is called by tryLead when this master gains or loses
// leadership.
func (m *Master) leadershipChanged() {
	if m.health.changes != nil {
		m.health.changes.Inc()
	}
}

type masterReadiness struct {
	Ready   bool   `json:"ready"`
	Role    string `json:"role"` // leader or standby
	Warming bool   `json:"warming,omitempty"`
	URL     string `json:"url"`
	Leader  string `json:"leader,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Version string `json:"version"`
}

func (m *Master) readiness(ctx context.Context) masterReadiness {
	r := masterReadiness{Ready: true, Role: "leader", URL: m.url, Leader: m.url, Version: version.Get().Version}
	if m.leader.Load() {
		m.mu.Lock()
		r.Warming = !m.warmUntil.IsZero()
		m.mu.Unlock()
		return r
	}
	r.Role = "standby"
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	leader, err := m.meta.Leader(ctx)
	r.Leader = leader
	if err != nil {
		r.Ready, r.Reason = false, "standby cannot read the metadata store: "+err.Error()
	}
	return r
}

func (m *Master) healthRoutes(mux *http.ServeMux) {
	api.HealthRoutes(mux, func(r *http.Request) (any, bool) {
		rd := m.readiness(r.Context())
		return rd, rd.Ready
	})
}

var (
	descServerUp = prometheus.NewDesc("gd2fs_master_server_up",
		"1 for a known data server that heartbeats and accepts connections, 0 for one down or unhealthy; by the leader only.", []string{"server", "addr"}, nil)
	descMissing = prometheus.NewDesc("gd2fs_master_ha_replicas_missing",
		"Replicas of HA-pool chunks held by servers that are not serving (repair copies them after --repair-after); by the leader only, counted at most every 15s.", nil, nil)
)

// healthCollector: the leadership gauge, and the leader's view of the
// servers. A standby reports no servers: its view is stale.
type healthCollector struct{ m *Master }

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descServerUp
	ch <- descMissing
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	if !m.leader.Load() {
		return
	}
	type srv struct{ id, addr string }
	var down []string
	var all []srv
	var up []bool
	m.mu.Lock()
	for id, s := range m.servers {
		all = append(all, srv{id, s.info.Addr})
		up = append(up, s.serving())
		if !s.serving() {
			down = append(down, id)
		}
	}
	m.mu.Unlock()
	for i, s := range all {
		v := 0.0
		if up[i] {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descServerUp, prometheus.GaugeValue, v, s.id, s.addr)
	}
	ch <- prometheus.MustNewConstMetric(descMissing, prometheus.GaugeValue, m.missingReplicas(down))
}

// missingReplicas counts the HA chunk replicas on the given servers (those
// not serving), from a cache at most degradedEvery old and of the same
// servers.
func (m *Master) missingReplicas(down []string) float64 {
	h := &m.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(down) == 0 {
		h.degraded, h.degradedOf = 0, ""
		return 0
	}
	slices.Sort(down)
	of := strings.Join(down, ",")
	if of == h.degradedOf && time.Since(h.degradedAt) < degradedEvery {
		return h.degraded
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := 0.0
	for _, id := range down {
		cs, err := m.meta.ChunksOn(ctx, id)
		if err != nil {
			return h.degraded // keep the last count; try again next scrape
		}
		for _, c := range cs {
			if p, err := m.pool(ctx, c.Pool); err == nil && p.Replicas >= 2 {
				n++
			}
		}
	}
	h.degraded, h.degradedAt, h.degradedOf = n, time.Now(), of
	return n
}

// registerHealthMetrics adds the build, leadership and health metrics to
// the master's registry.
func (m *Master) registerHealthMetrics() {
	m.health.changes = prometheus.NewCounter(prometheus.CounterOpts{Name: "gd2fs_master_leadership_changes_total",
		Help: "Times this master gained or lost leadership (alert on a fast rate: leader flapping)."})
	leader := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gd2fs_master_leader",
		Help: "1 while this master leads, 0 while it is a standby."}, func() float64 {
		if m.leader.Load() {
			return 1
		}
		return 0
	})
	m.metrics.reg.MustRegister(version.Collector(), m.health.changes, leader, healthCollector{m})
}
