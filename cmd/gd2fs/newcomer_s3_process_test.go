package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/testutil"
)

// TestLocalS3Walkthrough runs docs/weights.md's local walkthrough: the
// in-memory S3 of gd2fs-bench s3, a cluster without S3 access (link says
// so at once, a read fails at once with the cause), then one with it (link
// checks it; pull and link are told apart) (issue 25 items 10 and 14).
func TestLocalS3Walkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	bench := filepath.Join(t.TempDir(), "gd2fs-bench")
	if out, err := exec.Command("go", "build", "-o", bench, "../gd2fs-bench").CombinedOutput(); err != nil {
		t.Fatalf("build gd2fs-bench: %v\n%s", err, out)
	}
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny")
	os.MkdirAll(model, 0o755)
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte(`{"layers": 2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(model, "w.bin"), testutil.RandomBytes(3<<20, 3), 0o644); err != nil {
		t.Fatal(err)
	}
	s3addr := freeAddr(t)
	s3 := exec.Command(bench, "s3", "--listen", s3addr, "--upload", model+"=models/org/tiny")
	out, err := s3.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s3.Process.Kill(); s3.Wait() })
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.Contains(sc.Text(), "S3 (in memory) at http://"+s3addr) {
		t.Fatalf("gd2fs-bench s3 said %q", sc.Text())
	}
	awsEnv := []string{"AWS_ENDPOINT_URL=http://" + s3addr, "AWS_ACCESS_KEY_ID=gd2fs", "AWS_SECRET_ACCESS_KEY=gd2fs-secret"}

	cluster := func(name string, withS3 bool) []string {
		maddr := freeAddr(t)
		var env []string
		if withS3 {
			env = awsEnv
		}
		spawnEnv(t, env, bin, "up", "--dir", filepath.Join(dir, name), "--listen", maddr, "--port", "0", "--resp-port", "0",
			"--mem", "16MiB", "--disk", "256MiB", "--kv-disk", "0")
		cenv := append(append(os.Environ(), awsEnv...), "GD2FS_MASTER=http://"+maddr)
		testutil.Eventually(t, 30*time.Second, func() (bool, string) {
			out, code := cliRun(t, bin, cenv, nil, "status")
			return code == 0 && strings.Count(out, " up ") == 3, out
		})
		return cenv
	}

	// Servers without S3: link says so, and a read fails at once with why.
	env := cluster("nos3", false)
	out1, code := cliRun(t, bin, env, nil, "model", "link", "s3://models/org/tiny", "gd2fs://local/models/org/tiny")
	if code != 0 || !strings.Contains(out1, "could not read") || !strings.Contains(out1, "has no S3 configuration") {
		t.Fatalf("link on servers without S3: exit %d\n%s", code, out1)
	}
	start := time.Now()
	out1, code = cliRun(t, bin, env, nil, "cat", "gd2fs://local/models/org/tiny/config.json")
	if code == 0 || !strings.Contains(out1, "cannot fill it from S3: server") {
		t.Fatalf("cat of a linked file without S3: exit %d\n%s", code, out1)
	}
	if d := time.Since(start); d > 20*time.Second { // it waited out the refill (30 s) before
		t.Fatalf("the failure took %s", d)
	}

	// Servers with S3: link checks it; inspect tells linked from pulled.
	env = cluster("s3", true)
	if out, code := cliRun(t, bin, env, nil, "model", "link", "s3://models/org/tiny", "gd2fs://local/models/org/tiny"); code != 0 || !strings.Contains(out, "checked: the servers read") {
		t.Fatalf("link: exit %d\n%s", code, out)
	}
	if out, code := cliRun(t, bin, env, nil, "model", "pull", "s3://models/org/tiny", "gd2fs://local/models/org/pulled"); code != 0 {
		t.Fatalf("pull: exit %d\n%s", code, out)
	}
	out2, code := cliRun(t, bin, env, nil, "model", "inspect", "gd2fs://local/models/org")
	if code != 0 || !strings.Contains(out2, "tiny/w.bin") || !strings.Contains(out2, "linked to s3://models/org/tiny/w.bin") || !strings.Contains(out2, "pulled, sha256") {
		t.Fatalf("inspect:\n%s", out2)
	}
	if out, code := cliRun(t, bin, env, nil, "cat", "gd2fs://local/models/org/tiny/config.json"); code != 0 || out != `{"layers": 2}` {
		t.Fatalf("cat of the linked file: exit %d %q", code, out)
	}
}
