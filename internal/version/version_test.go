package version

import (
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestVersion(t *testing.T) {
	i := Get()
	if !regexp.MustCompile(`^\d+\.\d+\.\d+([-.+][0-9A-Za-z.-]+)?$`).MatchString(i.Version) {
		t.Fatalf("VERSION %q is not a release number (MAJOR.MINOR.PATCH): the Python wheel takes it as its version", i.Version)
	}
	if i.Commit == "" || !strings.HasPrefix(i.Go, "go") {
		t.Fatalf("info %+v", i)
	}
	if s := i.String(); !strings.HasPrefix(s, i.Version+" (commit ") {
		t.Fatalf("String() = %q", s)
	}
}

func TestShort(t *testing.T) {
	for in, want := range map[string]string{
		"0123456789abcdef0123": "0123456789ab", "0123456789abcdef+dirty": "0123456789ab+dirty", "unknown": "unknown",
	} {
		if got := (Info{Commit: in}).Short(); got != want {
			t.Errorf("Short(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCollector(t *testing.T) {
	r := prometheus.NewRegistry()
	r.MustRegister(Collector())
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "gd2fs_build_info" || len(mfs[0].Metric) != 1 {
		t.Fatalf("gathered %v", mfs)
	}
	m := mfs[0].Metric[0]
	got := map[string]string{}
	for _, l := range m.Label {
		got[l.GetName()] = l.GetValue()
	}
	i := Get()
	if got["version"] != i.Version || got["commit"] != i.Short() || got["goversion"] != i.Go || m.GetGauge().GetValue() != 1 {
		t.Fatalf("gd2fs_build_info %v = %v, want version %s commit %s goversion %s = 1", got, m.GetGauge().GetValue(), i.Version, i.Short(), i.Go)
	}
}
