package server

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/version"
)

// health is what /healthz and /readyz answer from. They are served on the
// server's one port (HTTP is told from the binary protocol by its first
// bytes, listen.go), like /metrics.
//
//   - /healthz (liveness): 200 "ok" whenever the process answers HTTP. It
//     says nothing of the master: a server cut off from its master must not
//     be restarted for it (its chunks are still there to serve).
//   - /readyz (readiness): 200 when the server is accepting connections
//     (no accept errors, deadline.go) and, with a master configured, its last
//     heartbeat was accepted by a leading master (a standby refuses them)
//     within readyWithin: 3 heartbeat intervals, at least 3s. A standalone
//     server (no --master) is ready once it accepts connections. 503 and
//     the reason otherwise. The body is JSON either way.
type health struct {
	lastBeat atomic.Int64 // unix nanoseconds of the last heartbeat a leader accepted; 0: none yet
}

// beat records a heartbeat the leading master accepted.
func (h *health) beat(now time.Time) { h.lastBeat.Store(now.UnixNano()) }

// readyWithin is how recent the last accepted heartbeat must be.
func (s *Server) readyWithin() time.Duration { return max(3*s.cfg.Heartbeat, 3*time.Second) }

type readiness struct {
	Ready   bool   `json:"ready"`
	Reason  string `json:"reason,omitempty"`
	ID      string `json:"id"`
	Master  string `json:"master,omitempty"`
	Version string `json:"version"`
	// LastHeartbeat: seconds since the leader last accepted a heartbeat
	// (absent before the first).
	LastHeartbeat *float64 `json:"last_heartbeat_seconds,omitempty"`
}

// ready says whether the server is ready, and if not why.
func (s *Server) ready(now time.Time) readiness {
	r := readiness{Ready: true, ID: s.cfg.ID, Master: s.cfg.Master, Version: version.Get().Version}
	if bad := s.unhealthy(); bad != "" {
		r.Ready, r.Reason = false, bad
	}
	if s.master == nil {
		return r
	}
	last := s.health.lastBeat.Load()
	if last == 0 {
		if r.Ready {
			r.Ready, r.Reason = false, "not registered yet: no leading master has accepted a heartbeat (is the master running and leading? check --master)"
		}
		return r
	}
	ago := now.Sub(time.Unix(0, last))
	sec := ago.Seconds()
	r.LastHeartbeat = &sec
	if ago > s.readyWithin() && r.Ready {
		r.Ready, r.Reason = false, "no heartbeat accepted by a leading master for "+ago.Round(time.Millisecond).String()+" (limit "+s.readyWithin().String()+")"
	}
	return r
}

func (s *Server) healthRoutes(mux *http.ServeMux) {
	api.HealthRoutes(mux, func(r *http.Request) (any, bool) {
		rd := s.ready(time.Now())
		return rd, rd.Ready
	})
}
