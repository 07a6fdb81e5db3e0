package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gd2fs/gd2fs/internal/version"
)

// TestVersionFlag: `gd2fs --version` prints the VERSION file's number, the
// commit given by -ldflags -X (as scripts/image.sh and the wheel build set
// it) and the Go version.
func TestVersionFlag(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gd2fs")
	const commit = "0123456789abcdef0123456789abcdef01234567"
	out, err := exec.Command("go", "build", "-ldflags", "-X github.com/gd2fs/gd2fs/internal/version.commit="+commit, "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("gd2fs --version: %v\n%s", err, out)
	}
	v := version.Get()
	want := "gd2fs " + v.Version + " (commit 0123456789ab, " + v.Go + ")\n"
	if string(out) != want {
		t.Fatalf("gd2fs --version printed %q, want %q", out, want)
	}
}
