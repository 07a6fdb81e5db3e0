package master

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/version"
)

// get fetches path without the cluster token (probes and scrapers carry none).
func get(t *testing.T, base, path string) (int, string, *http.Response) {
	return testutil.Get(t, base+path)
}

func readyz(t *testing.T, m *Master) (int, masterReadiness) {
	t.Helper()
	code, body, _ := get(t, m.URL(), "/readyz")
	var r masterReadiness
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("/readyz: %d %q: %v", code, body, err)
	}
	return code, r
}

// metric reads one sample of the master's /metrics ("" labels: the first).
func metric(t *testing.T, m *Master, name, labels string) (float64, bool) {
	t.Helper()
	_, body, _ := get(t, m.URL(), "/metrics")
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, s := range re.FindAllStringSubmatch(body, -1) {
		if labels == "" || strings.Contains(s[1], labels) {
			v, err := strconv.ParseFloat(s[2], 64)
			if err != nil {
				t.Fatalf("%s: %v", s[0], err)
			}
			return v, true
		}
	}
	return 0, false
}

// TestHealthAndReadiness: /healthz and /readyz without the token on a
// leader and a standby on one SQLite file; the standby hands over and its
// 503s close the connection (a Service in front must let the retry reach
// another master); the leadership metrics follow.
func TestHealthAndReadiness(t *testing.T) {
	db := filepath.Join(t.TempDir(), "meta.db")
	m1, stop1 := openMaster(t, db, Config{Token: testToken})
	m2, _ := openMaster(t, db, Config{Token: testToken, DownAfter: 500 * time.Millisecond})
	for _, m := range []*Master{m1, m2} {
		if code, body, _ := get(t, m.URL(), "/healthz"); code != 200 || body != "ok\n" {
			t.Fatalf("/healthz of %s: %d %q", m.URL(), code, body)
		}
	}
	if code, r := readyz(t, m1); code != 200 || !r.Ready || r.Role != "leader" || r.Version != version.Get().Version {
		t.Fatalf("leader /readyz: %d %+v", code, r)
	}
	if code, r := readyz(t, m2); code != 200 || !r.Ready || r.Role != "standby" || r.Leader != m1.URL() {
		t.Fatalf("standby /readyz: %d %+v (want ready, leader %s)", code, r, m1.URL())
	}
	code, _, resp := get(t, m2.URL(), "/v1/status")
	if code != 503 || !resp.Close {
		t.Fatalf("standby /v1/status: %d, Connection: close %v", code, resp.Close)
	}
	for m, want := range map[*Master]float64{m1: 1, m2: 0} {
		if v, ok := metric(t, m, "gd2fs_master_leader", ""); !ok || v != want {
			t.Fatalf("gd2fs_master_leader of %s = %v (present %v), want %v", m.URL(), v, ok, want)
		}
		if v, ok := metric(t, m, "gd2fs_build_info", `version="`+version.Get().Version+`"`); !ok || v != 1 {
			t.Fatalf("gd2fs_build_info of %s = %v (present %v)", m.URL(), v, ok)
		}
	}
	if v, _ := metric(t, m1, "gd2fs_master_leadership_changes_total", ""); v != 1 {
		t.Fatalf("leader's gd2fs_master_leadership_changes_total = %v, want 1", v)
	}
	if _, ok := metric(t, m2, "gd2fs_master_ha_replicas_missing", ""); ok {
		t.Fatal("a standby reports gd2fs_master_ha_replicas_missing: its view of the servers is stale")
	}

	stop1()
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		code, r := readyz(t, m2)
		return code == 200 && r.Role == "leader", r.Role
	})
	if v, _ := metric(t, m2, "gd2fs_master_leadership_changes_total", ""); v != 1 {
		t.Fatalf("new leader's gd2fs_master_leadership_changes_total = %v, want 1", v)
	}
}

// TestMissingReplicasMetric: HA chunks on a server that stopped
// heartbeating show in gd2fs_master_ha_replicas_missing, and the server in
// gd2fs_master_server_up 0; perf chunks do not count.
func TestMissingReplicasMetric(t *testing.T) {
	m := startMaster(t, Config{Token: testToken, DownAfter: 500 * time.Millisecond, RepairAfter: -1})
	want(t, m, 200, "PUT", "/v1/files/h", `{"pool":"ha"}`)
	want(t, m, 200, "PUT", "/v1/files/p", `{"pool":"perf"}`)
	// Beats just before each allocation: on a loaded machine more than
	// DownAfter may pass between two calls.
	for _, a := range []struct{ path, body string }{{"/v1/alloc/h", `{"indexes":[0,1]}`}, {"/v1/alloc/p", `{"indexes":[0,1,2]}`}} {
		testutil.Eventually(t, 30*time.Second, func() (bool, string) {
			for _, id := range []string{"s1", "s2", "s3"} {
				beat(t, m, id)
			}
			code, ans := call(t, m, "POST", a.path, a.body)
			return code == 200, ans
		})
	}
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, id := range []string{"s1", "s2", "s3"} {
			beat(t, m, id)
		}
		v, ok := metric(t, m, "gd2fs_master_ha_replicas_missing", "")
		return ok && v == 0, "replicas missing with every server up"
	})
	// s1 and s2 keep beating; s3 falls silent. Two HA chunks of 3 replicas
	// on 3 servers: s3 holds one of each.
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		beat(t, m, "s1")
		beat(t, m, "s2")
		up1, _ := metric(t, m, "gd2fs_master_server_up", `server="s1"`)
		up2, _ := metric(t, m, "gd2fs_master_server_up", `server="s2"`)
		up3, _ := metric(t, m, "gd2fs_master_server_up", `server="s3"`)
		missing, _ := metric(t, m, "gd2fs_master_ha_replicas_missing", "")
		return up1 == 1 && up2 == 1 && up3 == 0 && missing == 2,
			fmt.Sprintf("server_up s1 %v s2 %v s3 %v, ha_replicas_missing %v (want 1 1 0, 2)", up1, up2, up3, missing)
	})
}
