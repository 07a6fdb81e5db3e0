package master

import (
	"context"
	"fmt"
	stdlog "log"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/authlimit"
)

// Browsers (docs/security.md, "Browsers"). A web page the user opens can
// make the browser send requests to any address it names, 127.0.0.1
// included: "simple" cross-origin POSTs (text/plain, form bodies) without
// asking, and, after its DNS name is re-pointed at 127.0.0.1 (DNS
// rebinding), same-origin reads. A cluster without a token has nothing else
// between such a page and its namespace, so every request passes protect
// first:
//
//   - Host must be an IP address, localhost, or a name this master is known
//     by (Config.AllowedHosts, its advertised and public names, the
//     machine's host name) when the cluster has no token: a rebound name is
//     none of these. With a token, a rebound page holds neither the token
//     nor the console's cookie (it is set for the real name).
//   - State-changing requests from another origin are refused (Go's
//     CrossOriginProtection: Sec-Fetch-Site, else Origin against Host).
//   - POST and PUT to /v1/ must say Content-Type: application/json, which
//     no page can send to another origin without a CORS preflight, and the
//     master grants none.
//   - Connections (netguard.Protect): one authenticates with its first /v1/
//     request that holds the token (any /v1/ request without a token);
//     until then it is the first to be closed when the connection limit
//     is reached, one address holds at most MaxConnsPerIP of them, and
//     none waits more than PreAuthTimeout for a read.
//   - Wrong tokens (authlimit): an address that sent more than a few is
//     answered 429 without its token being checked, and failures are
//     logged once a minute per address.
//   - A heartbeat, which re-points a server's address, must carry the
//     X-GD2FS-Role: server header (api.Client.Role) when the cluster has no
//     token: a header a page cannot add cross-origin without a preflight
//     either. With a token the token authenticates it.

// roleHeader names the kind of caller (api.RoleHeader); servers send "server".
const roleHeader = api.RoleHeader

// allowedHosts is the set of host names (without port, lower case) the
// master answers to besides IP addresses and localhost.
func (m *Master) allowedHosts() map[string]bool {
	set := map[string]bool{"localhost": true}
	add := func(h string) {
		if h = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(h), ".")); h != "" {
			set[h] = true
		}
	}
	for _, h := range m.cfg.AllowedHosts {
		add(h)
	}
	if u, err := url.Parse(m.cfg.Advertise); err == nil {
		add(u.Hostname())
	}
	for _, hp := range m.cfg.PublicMasters {
		if h, _, err := net.SplitHostPort(hp); err == nil {
			add(h)
		} else {
			add(hp)
		}
	}
	if h, err := os.Hostname(); err == nil {
		add(h)
	}
	return set
}

// hostOK: the Host header names this master.
func hostOK(host string, allowed map[string]bool) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
	if net.ParseIP(h) != nil || allowed[h] || strings.HasSuffix(h, ".localhost") {
		return true
	}
	return false
}

// protect wraps the master's handler with the checks above.
func (m *Master) protect(next http.Handler) http.Handler {
	allowed := m.allowedHosts()
	cop := http.NewCrossOriginProtection()
	guesses := authlimit.New("master HTTP", m.log)
	refuse := func(w http.ResponseWriter, status int, kind error, format string, args ...any) {
		writeJSON(w, status, api.Error{Error: fmt.Sprintf(format, args...), Code: errs.Code(kind)})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.cfg.Token == "" && !hostOK(r.Host, allowed) {
			m.metrics.refused("host")
			refuse(w, http.StatusMisdirectedRequest, errs.ErrUnauthorized,
				"Host %.64q is not a name of this master: give its address, or start it with --allow-host NAME (a cluster without a token answers only its own names, against DNS rebinding)", r.Host)
			return
		}
		if err := cop.Check(r); err != nil {
			m.metrics.refused("origin")
			refuse(w, http.StatusForbidden, errs.ErrUnauthorized, "cross-origin request refused (%v): the master takes no requests from web pages of other sites", err)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/v1/") && (r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch) {
			if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
				m.metrics.refused("content_type")
				refuse(w, http.StatusUnsupportedMediaType, errs.ErrBadRequest, "%s %s needs Content-Type: application/json, got %.64q", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
				return
			}
			if m.cfg.Token == "" && r.URL.Path == "/v1/servers/heartbeat" && r.Header.Get(roleHeader) != "server" {
				m.metrics.refused("heartbeat")
				refuse(w, http.StatusForbidden, errs.ErrUnauthorized, "a heartbeat must come from a data server (header %s: server)", roleHeader)
				return
			}
		}
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			authed := m.cfg.Token == ""
			if !authed {
				host := authlimit.Host(r.RemoteAddr)
				if ok, retry := guesses.Allow(host); !ok {
					m.metrics.refused("throttled")
					w.Header().Set("Retry-After", strconv.Itoa(int(retry/time.Second)+1))
					refuse(w, http.StatusTooManyRequests, errs.ErrUnauthorized, "too many requests with a wrong token from %s: wait %s, and pass the right token (--token-file or GD2FS_TOKEN)", host, retry.Round(time.Millisecond))
					return
				}
				if authed = tokenOK(r, m.cfg.Token); !authed {
					m.metrics.refused("token")
					guesses.Fail(host)
				}
			}
			if c, ok := r.Context().Value(connKey{}).(net.Conn); ok && authed && m.guard != nil {
				m.guard.Authenticated(c)
			}
		}
		next.ServeHTTP(w, r)
	})
}

type connKey struct{}

// connContext keeps the connection in its requests' context, for protect
// to mark it authenticated.
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// quietLog is the HTTP server's error log: lines go to log at most once per
// quietEvery per kind (the text before the first ':' after the address),
// with the count of those left out; every failed TLS handshake of a scanner
// was one unthrottled line (issue 22 finding 16).
func quietLog(log *slog.Logger) *stdlog.Logger {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return stdlog.New(&quietWriter{log: log, last: map[string]time.Time{}, held: map[string]int{}}, "", 0)
}

const quietEvery = 10 * time.Second

type quietWriter struct {
	log  *slog.Logger
	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

func (q *quietWriter) Write(b []byte) (int, error) {
	line := strings.TrimSpace(string(b))
	kind := line
	if i := strings.Index(kind, " from "); i > 0 {
		kind = kind[:i] // "http: TLS handshake error"
	}
	if len(kind) > 64 {
		kind = kind[:64]
	}
	now := time.Now()
	q.mu.Lock()
	if len(q.last) > 1024 {
		q.last, q.held = map[string]time.Time{}, map[string]int{}
	}
	if t, ok := q.last[kind]; ok && now.Sub(t) < quietEvery {
		q.held[kind]++
		q.mu.Unlock()
		return len(b), nil
	}
	n := q.held[kind]
	q.last[kind], q.held[kind] = now, 0
	q.mu.Unlock()
	q.log.Warn(line, "similar_lines_left_out", n)
	return len(b), nil
}
