package deploy

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// metricNames are the gd2fs_* names the Go code registers: string literals
// in the product's packages (a metric vector with no child yet is absent
// from /metrics, so the source is the complete list).
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	lit := regexp.MustCompile(`"(gd2fs_[a-z0-9_]+)"`)
	for _, root := range []string{"../internal", "../cmd", "../client"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
				names[m[1]] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !names["gd2fs_build_info"] || !names["gd2fs_master_server_up"] {
		t.Fatalf("found %d metric names in the source, not the expected ones: the scan is broken", len(names))
	}
	return names
}

var (
	metricRef = regexp.MustCompile(`\b(gd2fs_[a-z0-9_]+)`)
	recordRef = regexp.MustCompile(`\bgd2fs:[a-z0-9_:]+`)
)

// checkRefs fails for every gd2fs_ name in expr the code does not register
// (histogram series may carry _bucket, _sum, _count) and every recording
// rule not defined.
func checkRefs(t *testing.T, where, expr string, names, records map[string]bool) int {
	n := 0
	for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
		name := m[1]
		base := name
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(name, suf) && names[strings.TrimSuffix(name, suf)] {
				base = strings.TrimSuffix(name, suf)
			}
		}
		if !names[base] {
			t.Errorf("%s: %s is not a metric gd2fs exports (in %q)", where, name, expr)
		}
		n++
	}
	for _, r := range recordRef.FindAllString(expr, -1) {
		if !records[r] {
			t.Errorf("%s: recording rule %s is not defined in prometheus/gd2fs-alerts.yml", where, r)
		}
		n++
	}
	return n
}

// recordingRules reads the names the rules file records. (The file is
// checked as Prometheus rules by promtool in scripts/ops-test.sh.)
func recordingRules(t *testing.T) (map[string]bool, string) {
	b, err := os.ReadFile("prometheus/gd2fs-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	recs := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*- record: (\S+)`).FindAllStringSubmatch(string(b), -1) {
		recs[m[1]] = true
	}
	return recs, string(b)
}

// TestAlertRulesUseRealMetrics: every metric an alert or recording rule
// reads is one the code exports.
func TestAlertRulesUseRealMetrics(t *testing.T) {
	names := metricNames(t)
	recs, text := recordingRules(t)
	if len(recs) == 0 {
		t.Fatal("no recording rules found")
	}
	var exprs []string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "expr:") {
			continue
		}
		e := strings.TrimSpace(strings.TrimPrefix(l, "expr:"))
		if e == "|" { // block scalar: the indented lines after it
			e = ""
			for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || strings.HasPrefix(lines[i+1], strings.Repeat(" ", 10))) {
				i++
				e += lines[i] + "\n"
			}
		}
		exprs = append(exprs, e)
	}
	if len(exprs) < 8 {
		t.Fatalf("found %d expressions in the rules file", len(exprs))
	}
	for _, e := range exprs {
		if checkRefs(t, "prometheus/gd2fs-alerts.yml", e, names, recs) == 0 {
			t.Errorf("rule expression %q reads no gd2fs metric", e)
		}
	}
	for _, alert := range []string{"GD2FSServerDown", "GD2FSHAUnderReplicated", "GD2FSDiskTierFull", "GD2FSKVHitRatioCollapse", "GD2FSLeaderFlapping"} {
		if !strings.Contains(text, "alert: "+alert+"\n") {
			t.Errorf("alert %s is missing", alert)
		}
	}
}

// TestDashboard: the Grafana dashboard is JSON Grafana can import (panels
// with unique ids, a Prometheus target each) and reads only metrics the
// code exports.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/gd2fs-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title, UID    string
		SchemaVersion int `json:"schemaVersion"`
		Panels        []struct {
			ID      int
			Title   string
			Type    string
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/gd2fs-dashboard.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion == 0 || len(d.Panels) < 10 {
		t.Fatalf("dashboard title %q uid %q schema %d, %d panels", d.Title, d.UID, d.SchemaVersion, len(d.Panels))
	}
	names := metricNames(t)
	recs, _ := recordingRules(t)
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d repeated or 0", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" || p.Type == "" || len(p.Targets) == 0 {
			t.Errorf("panel %+v: needs a title, a type and a target", p)
		}
		for _, q := range p.Targets {
			if q.RefID == "" || checkRefs(t, "panel "+p.Title, q.Expr, names, recs) == 0 {
				t.Errorf("panel %q: target %q reads no gd2fs metric (or has no refId)", p.Title, q.Expr)
			}
			for _, m := range metricRef.FindAllString(q.Expr, -1) {
				used[m] = true
			}
		}
	}
	var all []string
	for n := range used {
		all = append(all, n)
	}
	sort.Strings(all)
	t.Logf("dashboard reads %d metrics: %s", len(all), strings.Join(all, " "))
}
