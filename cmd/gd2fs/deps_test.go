package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoBenchDeps: the product binary links none of the benchmark harness
// (cmd/gd2fs-bench) or of the fault harness (cmd/gd2fs-chaos): no Redis
// client, no in-memory S3 server.
func TestNoBenchDeps(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/gd2fs/gd2fs/cmd/gd2fs").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"go-redis", "gofakes3", "gd2fs/internal/bench", "gd2fs/internal/s3test", "gd2fs/internal/chaos"} {
			if strings.Contains(dep, bad) {
				t.Errorf("gd2fs depends on %s (matches %q)", dep, bad)
			}
		}
	}
}
