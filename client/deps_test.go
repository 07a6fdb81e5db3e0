package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoServerDeps keeps the SDK lean: a program that imports client must
// link neither a database driver nor the master's metadata engine, nor the
// benchmark harness's Redis client and S3 fake.
func TestNoServerDeps(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/gd2fs/gd2fs/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"jackc/pgx", "sqlite", "gd2fs/internal/meta", "go-redis", "gofakes3"} {
			if strings.Contains(dep, bad) {
				t.Errorf("client depends on %s (matches %q)", dep, bad)
			}
		}
	}
}
