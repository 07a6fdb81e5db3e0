package authlimit

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLimiter: a burst of failures is allowed, then attempts are refused
// until the budget refills; other addresses are not affected; failures are
// logged once a minute with their count.
func TestLimiter(t *testing.T) {
	var logs bytes.Buffer
	l := New("test", slog.New(slog.NewTextHandler(&logs, nil)))
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for i := range DefaultBurst {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("attempt %d refused within the burst", i)
		}
		l.Fail("a")
	}
	ok, retry := l.Allow("a")
	if ok || retry <= 0 {
		t.Fatalf("past the burst: ok %v retry %v", ok, retry)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another address was held back")
	}
	now = now.Add(retry)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatalf("not allowed again after %v", retry)
	}
	if n := strings.Count(logs.String(), "failed authentication"); n != 1 {
		t.Fatalf("%d log lines for %d failures in a second:\n%s", n, DefaultBurst, logs.String())
	}
	now = now.Add(time.Minute)
	l.Fail("a")
	if !strings.Contains(logs.String(), "failures=1") || strings.Count(logs.String(), "failed authentication") != 2 {
		t.Fatalf("the next minute's line:\n%s", logs.String())
	}
	if Host("1.2.3.4:5") != "1.2.3.4" || Host("[::1]:7") != "::1" {
		t.Fatal("Host")
	}
}
