package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"time"
)

// Per-connection deadlines of the data plane, one per phase (docs/security.md):
//
//	hello    from accept to the end of the hello frame (route, serveData)
//	idle     waiting for a frame header with no request in flight
//	payload  from a frame header to the end of its payload
//
// While requests are in flight the reader waits for the next header without
// a deadline: a client may pipeline a slow cold read and send nothing else.
// The last request to finish arms the idle deadline.

// Default limits, used where Config leaves them zero.
const (
	DefaultMaxConns       = 8192
	DefaultHelloTimeout   = 10 * time.Second
	DefaultPayloadTimeout = 60 * time.Second
	DefaultIdleTimeout    = 5 * time.Minute
	// DefaultMaxConnsPerIP bounds one address's connections that have not
	// sent a valid hello (HTTP ones never do): netguard.Protect closes the
	// oldest of them first when the port is full.
	DefaultMaxConnsPerIP = 512
)

func (c *Config) fillLimits() {
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.HelloTimeout <= 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = DefaultMaxConnsPerIP
	}
	if c.PayloadTimeout <= 0 {
		c.PayloadTimeout = DefaultPayloadTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
}

// awaitHeader arms the idle deadline when nothing is in flight.
func (dc *dataConn) awaitHeader() {
	dc.dmu.Lock()
	defer dc.dmu.Unlock()
	dc.waiting = true
	if len(dc.sem) == 0 {
		dc.nc.SetReadDeadline(time.Now().Add(dc.s.cfg.IdleTimeout))
	} else {
		dc.nc.SetReadDeadline(time.Time{})
	}
}

// awaitPayload arms the payload deadline once a header arrived.
func (dc *dataConn) awaitPayload() {
	dc.dmu.Lock()
	defer dc.dmu.Unlock()
	dc.waiting = false
	dc.nc.SetReadDeadline(time.Now().Add(dc.s.cfg.PayloadTimeout))
}

// finished runs after a request left the in-flight set: the last one arms
// the idle deadline if the reader is waiting for a header.
func (dc *dataConn) finished() {
	dc.dmu.Lock()
	defer dc.dmu.Unlock()
	if dc.waiting && len(dc.sem) == 0 {
		dc.nc.SetReadDeadline(time.Now().Add(dc.s.cfg.IdleTimeout))
	}
}

// unhealthy says why this server cannot serve, for its heartbeat: "" when
// it accepts connections.
func (s *Server) unhealthy() string {
	if err := s.ln.Err(); err != nil {
		return "accept failing: " + err.Error()
	}
	return ""
}

// debugAuth serves next only to a request with the cluster token as a
// bearer token (compared in constant time over digests), when there is one.
func debugAuth(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := sha256.Sum256([]byte("Bearer " + token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			http.Error(w, "debug endpoints need the cluster token: Authorization: Bearer TOKEN", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
