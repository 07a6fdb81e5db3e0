package console

import (
	"testing"
	"time"
)

// TestLoginsExpire: a log-in ends after cookieLife, and no more than
// maxLogins are kept (issue 22 finding 12).
func TestLoginsExpire(t *testing.T) {
	var l logins
	now := time.Now()
	v := l.start(now)
	if !l.valid(v, now.Add(cookieLife-time.Second)) || l.valid(v, now.Add(cookieLife)) {
		t.Fatal("a log-in does not expire after cookieLife")
	}
	for range maxLogins + 10 {
		l.start(now)
	}
	if len(l.m) > maxLogins {
		t.Fatalf("%d log-ins kept", len(l.m))
	}
}
