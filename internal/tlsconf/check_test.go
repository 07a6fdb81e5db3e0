package tlsconf

import (
	"strings"
	"testing"
	"time"
)

// TestProblems: an expired, a not yet valid and an expiring certificate are
// each named; a good one is not.
func TestProblems(t *testing.T) {
	fs, err := TestCA(t.TempDir(), "node")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := fs["node"].Server()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if p := Problems(cfg, now); len(p) != 1 || !strings.Contains(p[0], "expires on") { // TestCA's last a day
		t.Fatalf("a day-long certificate: %v", p)
	}
	if p := Problems(cfg, now.Add(48*time.Hour)); len(p) != 1 || !strings.Contains(p[0], "expired") {
		t.Fatalf("expired: %v", p)
	}
	if p := Problems(cfg, now.Add(-48*time.Hour)); len(p) != 1 || !strings.Contains(p[0], "not valid before") {
		t.Fatalf("not yet valid: %v", p)
	}
	if p := Problems(nil, now); p != nil {
		t.Fatal(p)
	}
}
