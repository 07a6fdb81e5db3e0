package master

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/gd2fs/gd2fs/internal/api"
)

// deadAddr is a loopback address nothing listens on (a port just closed).
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func heartbeatAs(t *testing.T, m *Master, id, addr string) {
	t.Helper()
	hb, _ := json.Marshal(api.Heartbeat{ServerInfo: api.ServerInfo{ID: id, Addr: addr, MemCap: 1 << 40, DiskCap: 1 << 40}})
	want(t, m, 200, "POST", "/v1/servers/heartbeat", string(hb))
}

// TestRefillRoute: POST /v1/refill re-places a linked chunk whose server does
// not answer onto a live server, once, whoever asks and however many ask at
// once; it refuses files that are not linked, and says what to do when no
// server can take the chunk.
func TestRefillRoute(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	heartbeatAs(t, m, "s1", deadAddr(t)) // "up" by heartbeat, but its port is closed: as if SIGKILLed a moment ago
	want(t, m, 200, "POST", "/v1/link/m/w", `{"source":"s3://b/w","etag":"e","size":3145728,"chunk_size":1048576}`)
	want(t, m, 200, "PUT", "/v1/files/plain", `{"pool":"perf"}`)

	code, ans := call(t, m, "POST", "/v1/refill/plain", `{"index":0,"failed":["s1"]}`)
	if code != 400 || !strings.Contains(ans, "not a complete linked") {
		t.Fatalf("refill of a file that is not linked: %d %s", code, ans)
	}
	want(t, m, 400, "POST", "/v1/refill/m/w", `{"index":0,"failed":["s1"],"extra":1}`)
	if code, ans := call(t, m, "POST", "/v1/refill/m/w", `{"index":7,"failed":["s1"]}`); code < 400 || code >= 500 || !strings.Contains(ans, "no chunk 7") {
		t.Fatalf("refill of a chunk past the end: %d %s", code, ans)
	}
	// s1 is the only server: nowhere to go, and the answer says what to do.
	code, ans = call(t, m, "POST", "/v1/refill/m/w", `{"index":0,"failed":["s1"]}`)
	if code != 503 || !strings.Contains(ans, `"unavailable"`) || !strings.Contains(ans, "start a data server") {
		t.Fatalf("refill with no live server: %d %s", code, ans)
	}

	heartbeatAs(t, m, "s2", deadAddr(t))
	heartbeatAs(t, m, "s3", deadAddr(t))
	// 16 readers ask at once: one move, one answer for all.
	var wg sync.WaitGroup
	answers := make([]string, 16)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, ans := call(t, m, "POST", "/v1/refill/m/w", `{"index":1,"failed":["s1"]}`)
			if code != 200 {
				t.Errorf("refill: %d %s", code, ans)
				return
			}
			var cs api.Chunks
			if err := json.Unmarshal([]byte(ans), &cs); err != nil || len(cs.Chunks) != 1 || len(cs.Chunks[0].Replicas) != 1 {
				t.Errorf("refill answer %s: %v", ans, err)
				return
			}
			answers[i] = cs.Chunks[0].Replicas[0].Server
		}()
	}
	wg.Wait()
	for _, a := range answers {
		if a != answers[0] || a == "s1" || a == "" {
			t.Fatalf("readers were answered different or dead servers: %v", answers)
		}
	}
	if n := refillsOK(t, m); n != "1" {
		t.Fatalf("%s re-placements for one chunk, want 1", n)
	}
	// Asked again (a reader with the old map): the same answer, no new move.
	_, ans = call(t, m, "POST", "/v1/refill/m/w", `{"index":1,"failed":["s1"]}`)
	if !strings.Contains(ans, `"server":"`+answers[0]+`"`) {
		t.Fatalf("second refill moved the chunk again: %s (first went to %s)", ans, answers[0])
	}
	if n := refillsOK(t, m); n != "1" {
		t.Fatalf("%s re-placements after asking twice, want 1", n)
	}
	// The meta map says so, and s1 owes a delete of its stale copy.
	_, ans = call(t, m, "GET", "/v1/files/m/w", "")
	var f api.File
	if err := json.Unmarshal([]byte(ans), &f); err != nil {
		t.Fatal(err)
	}
	if f.Chunks[1].Replicas[0].Server != answers[0] || f.Chunks[0].Replicas[0].Server != "s1" {
		t.Fatalf("file map after the refill: %+v", f.Chunks)
	}
	tomb, err := m.meta.Tombstones(context.Background(), "s1", 100)
	if err != nil || len(tomb) != 1 || tomb[0] != f.Chunks[1].ID {
		t.Fatalf("tombstones of s1: %v %v, want [%d]", tomb, err, f.Chunks[1].ID)
	}
}

// refillsOK reads gd2fs_master_refills_after_failure_total{outcome="ok"} from /metrics.
func refillsOK(t *testing.T, m *Master) string {
	t.Helper()
	_, body := call(t, m, "GET", "/metrics", "")
	const name = `gd2fs_master_refills_after_failure_total{outcome="ok"} `
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name); ok {
			return v
		}
	}
	return "0"
}
