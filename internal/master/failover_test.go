package master

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/meta"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// openMaster runs a master on the SQLite file db until the returned stop
// is called (which also closes its store, releasing leadership).
func openMaster(t *testing.T, db string, cfg Config) (*Master, func()) {
	t.Helper()
	ctx := context.Background()
	ms, err := meta.Open(ctx, "sqlite://"+db)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Meta = "127.0.0.1:0", ms
	m, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.Run(rctx); close(done) }()
	var stopped bool
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			m.Close()
			<-done
			ms.Close()
		}
	}
	t.Cleanup(stop)
	return m, stop
}

func beat(t *testing.T, m *Master, id string) {
	t.Helper()
	hb := `{"id":"` + id + `","addr":"127.0.0.1:1` + id[1:] + `","mem_cap":1073741824}`
	if code, ans := call(t, m, "POST", "/v1/servers/heartbeat", hb); code != 200 {
		t.Fatalf("heartbeat %s: %d %s", id, code, ans)
	}
}

// A master that takes over knows the servers only from the store: until
// they report (or the warm-up ends) it places nothing and says "retry"
// rather than "start more servers", and it keeps them in the membership.
func TestLeadWarmup(t *testing.T) {
	db := filepath.Join(t.TempDir(), "meta.db")
	m1, stop1 := openMaster(t, db, Config{})
	for _, id := range []string{"s1", "s2", "s3"} {
		beat(t, m1, id)
	}
	want(t, m1, 200, "PUT", "/v1/files/a", `{"pool":"ha"}`)
	stop1()

	m2, _ := openMaster(t, db, Config{LeadWarmup: time.Hour})
	want(t, m2, 200, "PUT", "/v1/files/b", `{"pool":"ha"}`) // no placement: fine
	req, _ := http.NewRequest("POST", m2.URL()+"/v1/alloc/b", strings.NewReader(`{"indexes":[0]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e api.Error
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(e.Error, "0 of 3 reported") || strings.Contains(e.Error, "start more servers") {
		t.Fatalf("alloc during the warm-up: %d %q %+v", resp.StatusCode, resp.Header.Get("Retry-After"), e)
	}
	var ms api.Membership
	_, body := call(t, m2, "GET", "/v1/members", "")
	if json.Unmarshal([]byte(body), &ms); len(ms.Members) != 3 {
		t.Fatalf("members during the warm-up: %s", body)
	}
	beat(t, m2, "s1")
	beat(t, m2, "s2")
	if code, _ := call(t, m2, "POST", "/v1/alloc/b", `{"indexes":[0]}`); code != 503 {
		t.Fatalf("alloc with 2 of 3 reported: %d", code)
	}
	beat(t, m2, "s3") // all known servers reported: the warm-up ends at once
	want(t, m2, 200, "POST", "/v1/alloc/b", `{"indexes":[0]}`)
}

// A server that never reports is declared down when the warm-up ends.
func TestLeadWarmupEnds(t *testing.T) {
	db := filepath.Join(t.TempDir(), "meta.db")
	m1, stop1 := openMaster(t, db, Config{})
	for _, id := range []string{"s1", "s2", "s3", "s4"} {
		beat(t, m1, id)
	}
	stop1()
	m2, _ := openMaster(t, db, Config{LeadWarmup: 200 * time.Millisecond})
	for _, id := range []string{"s1", "s2", "s3"} {
		beat(t, m2, id)
	}
	want(t, m2, 200, "PUT", "/v1/files/c", `{"pool":"ha"}`)
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		code, ans := call(t, m2, "POST", "/v1/alloc/c", `{"indexes":[0]}`)
		return code == 200, ans
	})
	_, body := call(t, m2, "GET", "/v1/status", "")
	var st api.Status
	json.Unmarshal([]byte(body), &st)
	for _, s := range st.Servers {
		if (s.ID == "s4") != (s.State == "down") {
			t.Fatalf("after the warm-up: %s is %s", s.ID, s.State)
		}
	}
}

// A create or a sealing commit repeated after its answer was lost (a
// client retrying across a failover) succeeds; another create of the same
// name still finds it exists.
func TestRepeatedCreateAndSeal(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	want(t, m, 200, "PUT", "/v1/files/f", `{"pool":"perf","request_id":"r1"}`)
	want(t, m, 200, "PUT", "/v1/files/f", `{"pool":"perf","request_id":"r1"}`)
	want(t, m, 409, "PUT", "/v1/files/f", `{"pool":"perf","request_id":"r2"}`)
	want(t, m, 409, "PUT", "/v1/files/f", `{"pool":"perf"}`)
	want(t, m, 200, "POST", "/v1/commit/f", `{"size":0,"seal":true}`)
	want(t, m, 200, "POST", "/v1/commit/f", `{"size":0,"seal":true}`)
	want(t, m, 409, "POST", "/v1/commit/f", `{"size":10,"seal":true}`)
}

// A rename repeated with its request id after its answer was lost
// succeeds; another request id is another rename, of a name now gone. A
// file being written is busy (409); bad bodies are bad requests.
func TestRepeatedRename(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	want(t, m, 200, "PUT", "/v1/files/d/f.incomplete", `{"pool":"perf"}`)
	want(t, m, 409, "POST", "/v1/rename/d/f.incomplete", `{"to":"/d/f"}`) // not sealed yet
	want(t, m, 200, "POST", "/v1/commit/d/f.incomplete", `{"size":0,"seal":true}`)
	want(t, m, 200, "POST", "/v1/rename/d/f.incomplete", `{"to":"/d/f","request_id":"r1"}`)
	want(t, m, 200, "POST", "/v1/rename/d/f.incomplete", `{"to":"/d/f","request_id":"r1"}`)
	want(t, m, 404, "POST", "/v1/rename/d/f.incomplete", `{"to":"/d/f","request_id":"r2"}`)
	want(t, m, 404, "POST", "/v1/rename/d/f.incomplete", `{"to":"/d/f"}`)
	want(t, m, 200, "POST", "/v1/rename/d", `{"to":"/e"}`)
	want(t, m, 200, "GET", "/v1/files/e/f", ``)
	want(t, m, 400, "POST", "/v1/rename/e/f", `{"to":"/e/../x"}`)
	want(t, m, 400, "POST", "/v1/rename/e/f", `{"to":"/x","nope":1}`)
	want(t, m, 400, "POST", "/v1/rename/e", `{"to":"/e/f/g"}`) // into itself
}

// A plan or a fork repeated with its request id (a client retrying across a
// failover, the first answer lost) gets the first answer: the same plan id
// and fresh bytes, the fork as done; another request id is another request.
func TestRepeatedPlanAndFork(t *testing.T) {
	m := startMaster(t, Config{Token: testToken})
	want(t, m, 200, "PUT", "/v1/models/m/layout", `{"layers":2,"kv_heads":1,"head_dim":4,"dtype":"fp16","page_tokens":4,"layout":"layer_first"}`)
	plan := func(rid string) api.Plan {
		t.Helper()
		code, body := call(t, m, "POST", "/v1/sessions/s/plan?request_id="+rid, `{"model":"m","token_ids":[1,2,3,4,5,6]}`)
		var p api.Plan
		if code != 200 || json.Unmarshal([]byte(body), &p) != nil {
			t.Fatalf("plan %s: %d %s", rid, code, body)
		}
		return p
	}
	a, b, c := plan("r1"), plan("r1"), plan("r2")
	if a.PlanID != b.PlanID || a.Fresh[0] != b.Fresh[0] || c.PlanID == a.PlanID || c.Fresh[0].KVStart == a.Fresh[0].KVStart {
		t.Fatalf("plans %+v %+v %+v", a, b, c)
	}
	want(t, m, 400, "POST", "/v1/sessions/s/plan?request_id="+strings.Repeat("x", 200), `{"model":"m","token_ids":[1]}`)
	want(t, m, 200, "POST", "/v1/sessions/s/fork?request_id=f1", `{"new_id":"s2"}`)
	want(t, m, 200, "POST", "/v1/sessions/s/fork?request_id=f1", `{"new_id":"s2"}`)
	want(t, m, 409, "POST", "/v1/sessions/s/fork?request_id=f2", `{"new_id":"s2"}`)
	want(t, m, 409, "POST", "/v1/sessions/s/fork", `{"new_id":"s2"}`)
}
