// Package testutil holds the helpers the tests of several packages share:
// waiting for a condition instead of hand-written sleep loops, and
// deterministic test data.
package testutil

import (
	"bytes"
	"math/rand/v2"
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
