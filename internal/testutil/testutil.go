// Package testutil holds the helpers the tests of several packages share:
// waiting for a condition instead of hand-written sleep loops, and
// deterministic test data.
package testutil

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
)

// Eventually calls cond until it reports true, and fails t with what cond
// last said when timeout passes first. It is for conditions that depend on
// another process or a background loop (a heartbeat, a repair, a
// failover) where there is no event to wait on; it polls with pauses that
// grow from 1 ms to 100 ms, so a condition that is already true costs
// nothing and a slow one does not spin.
func Eventually(t testing.TB, timeout time.Duration, cond func() (ok bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, state)
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// UpServers is how many servers st lists as up.
func UpServers(st api.Status) int {
	up := 0
	for _, s := range st.Servers {
		if s.State == "up" {
			up++
		}
	}
	return up
}

// Get fetches url with no credentials (as probes and scrapers do) and
// returns the status, the whole body and the response (its body closed,
// for the headers). Any transport error fails t.
func Get(t testing.TB, url string) (int, string, *http.Response) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return Do(t, req)
}

// Do sends req with http.DefaultClient and returns what Get returns.
func Do(t testing.TB, req *http.Request) (int, string, *http.Response) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp
}

// MasterRequests is how many requests to route (such as "GET /v1/members")
// the master at masterURL has answered, every status together, from its
// gd2fs_master_requests_total.
func MasterRequests(t testing.TB, masterURL, route string) int {
	t.Helper()
	_, body, _ := Get(t, masterURL+"/metrics")
	re := regexp.MustCompile(`gd2fs_master_requests_total\{code="\d+",route="` + regexp.QuoteMeta(route) + `"\} (\d+)`)
	n := 0
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		k, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatalf("gd2fs_master_requests_total for %s: %v", route, err)
		}
		n += k
	}
	return n
}

// RandomBytes is n pseudo-random bytes, the same for the same seed.
func RandomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// SyncBuffer is a bytes.Buffer safe to read while a child process writes to
// it (as its Stdout and Stderr).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Rounds holds callers in rounds of n: Arrive returns once n callers of the
// current round have arrived, then the next round starts. Tests use it to
// keep n requests in flight at once (each held where it arrives).
type Rounds struct {
	n       int
	mu      sync.Mutex
	arrived int
	gate    chan struct{}
}

// NewRounds returns rounds of n callers.
func NewRounds(n int) *Rounds { return &Rounds{n: n, gate: make(chan struct{})} }

// Arrive counts a caller and waits for the rest of its round.
func (r *Rounds) Arrive() {
	r.mu.Lock()
	r.arrived++
	g := r.gate
	if r.arrived == r.n {
		close(r.gate)
		r.arrived, r.gate = 0, make(chan struct{})
	}
	r.mu.Unlock()
	<-g
}
