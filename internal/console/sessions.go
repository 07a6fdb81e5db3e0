package console

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"
)

// Console log-in sessions (issue 22 finding 12). A cookie was an HMAC of
// the token: the same for every log-in, valid for as long as the token,
// and still valid after "log out". Now each log-in gets a random id that
// the console keeps (by its hash) until it expires or its owner logs out;
// a master restart logs everyone out.

const (
	// cookieLife is how long a log-in lasts, used or not.
	cookieLife = 12 * time.Hour
	// maxLogins bounds the log-ins kept; past it the one that expires
	// first goes (a script logging in in a loop cannot grow the map).
	maxLogins = 4096
)

type logins struct {
	mu sync.Mutex
	m  map[[32]byte]time.Time // sha256 of the cookie value -> expiry
}

// start records a new log-in and returns its cookie value.
func (l *logins) start(now time.Time) string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	v := hex.EncodeToString(b[:])
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[[32]byte]time.Time{}
	}
	for k, exp := range l.m {
		if !now.Before(exp) {
			delete(l.m, k)
		}
	}
	if len(l.m) >= maxLogins {
		var first [32]byte
		var at time.Time
		for k, exp := range l.m {
			if at.IsZero() || exp.Before(at) {
				first, at = k, exp
			}
		}
		delete(l.m, first)
	}
	l.m[sha256.Sum256([]byte(v))] = now.Add(cookieLife)
	return v
}

// valid says whether v is a live log-in. The map is keyed by a hash, so
// the lookup's timing tells nothing of the values held.
func (l *logins) valid(v string, now time.Time) bool {
	k := sha256.Sum256([]byte(v))
	l.mu.Lock()
	defer l.mu.Unlock()
	exp, ok := l.m[k]
	if ok && !now.Before(exp) {
		delete(l.m, k)
		return false
	}
	return ok
}

// end forgets v (log out).
func (l *logins) end(v string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, sha256.Sum256([]byte(v)))
}
