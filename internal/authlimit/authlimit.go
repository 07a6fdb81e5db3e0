// Package authlimit slows down guessing of the cluster token: each remote
// address may fail authentication Burst times at once and then Rate times a
// second; past that its attempts are refused without being checked, until
// the budget refills. Failures are logged, at most once a minute per
// address with the count since the last line, so a brute-force run shows in
// the logs without flooding them (issue 22 finding 14).
package authlimit

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// Defaults: a client that mistyped its token is not held back; a guesser
// gets 2 guesses a second per address (RESP AUTH made ~300k/s possible).
const (
	DefaultBurst = 10
	DefaultRate  = 2
	maxTracked   = 65536 // addresses remembered; past it the table restarts
)

// Limiter counts failures by address. The zero value is not usable: New.
type Limiter struct {
	burst, rate float64
	what        string
	log         *slog.Logger
	now         func() time.Time

	mu sync.Mutex
	by map[string]*bucket
}

type bucket struct {
	tokens  float64
	at      time.Time // of tokens
	logged  time.Time // last log line
	unsaid  int       // failures since it
	refused int64
}

// New makes a limiter; what names the door in log lines ("master HTTP").
func New(what string, log *slog.Logger) *Limiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Limiter{burst: DefaultBurst, rate: DefaultRate, what: what, log: log, now: time.Now, by: map[string]*bucket{}}
}

// Host is the address part of a remote address ("1.2.3.4:5" -> "1.2.3.4").
func Host(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

func (l *Limiter) get(host string, now time.Time) *bucket {
	b := l.by[host]
	if b == nil {
		if len(l.by) >= maxTracked {
			l.by = map[string]*bucket{}
		}
		b = &bucket{tokens: l.burst, at: now}
		l.by[host] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	return b
}

// Allow says whether host may try to authenticate now; when it may not,
// retry is how long until it may.
func (l *Limiter) Allow(host string) (ok bool, retry time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.by[host]
	if b == nil {
		return true, 0
	}
	b = l.get(host, now)
	if b.tokens >= 1 {
		return true, 0
	}
	b.refused++
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// Fail records a failed authentication of host.
func (l *Limiter) Fail(host string) {
	now := l.now()
	l.mu.Lock()
	b := l.get(host, now)
	b.tokens = max(0, b.tokens-1)
	b.unsaid++
	say := b.logged.IsZero() || now.Sub(b.logged) >= time.Minute
	n, refused := b.unsaid, b.refused
	if say {
		b.logged, b.unsaid, b.refused = now, 0, 0
	}
	l.mu.Unlock()
	if say {
		l.log.Warn("failed authentication (wrong cluster token)", "door", l.what, "from", host, "failures", n, "refused_unchecked", refused)
	}
}
