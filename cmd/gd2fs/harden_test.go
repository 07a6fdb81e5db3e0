package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/internal/tlsconf"
)

// TestPrintable: ls shows every name on one line, odd ones quoted.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"w.bin":   "w.bin",
		"日本語":     "日本語",
		"a\nb":    `"a\nb"`,
		"\xff":    `"\xff"`,
		"x\x1b[m": `"x\x1b[m"`,
		" lead":   `" lead"`,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestCLIHardening: `gd2fs up` over TLS with the token from a file (never
// on a command line), CLI commands over TLS, and `kv rm --prefix ""`
// refused without --all.
func TestCLIHardening(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	files, err := tlsconf.TestCA(dir, "node")
	if err != nil {
		t.Fatal(err)
	}
	node := files["node"]
	const token = "cli-s3cret-token"
	tokFile := filepath.Join(dir, "token")
	os.WriteFile(tokFile, []byte(token+"\n"), 0o600)
	maddr := freeAddr(t)
	up := exec.Command(bin, "up", "--dir", filepath.Join(dir, "data"), "--listen", maddr, "--port", "0", "--servers", "1",
		"--mem", "32MiB", "--disk", "256MiB", "--kv-mem", "16MiB", "--kv-disk", "0",
		"--token-file", tokFile, "--tls-cert", node.Cert, "--tls-key", node.Key, "--tls-ca", node.CA, "--resp-port", "0")
	var upOut testutil.SyncBuffer
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		up.Process.Kill()
		up.Wait()
		if t.Failed() {
			t.Logf("up:\n%s", upOut.String())
		}
	})
	env := append(os.Environ(), "GD2FS_MASTER=https://"+maddr, "GD2FS_TOKEN_FILE="+tokFile, "GD2FS_TLS_CA="+node.CA)
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := run("status")
		if err == nil && strings.Count(out, " up ") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status over TLS: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if cl, _ := os.ReadFile("/proc/" + strconv.Itoa(up.Process.Pid) + "/cmdline"); strings.Contains(string(cl), token) {
		t.Fatal("the token shows on the command line")
	}
	// Without the CA the CLI does not trust the cluster.
	cmd := exec.Command(bin, "status", "--master", "https://"+maddr, "--token-file", tokFile)
	cmd.Env = []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "TLS failed: check --tls-ca") || strings.Contains(string(out), "is it running") {
		t.Fatalf("status without the CA: %v\n%s", err, out)
	}
	// up's Connect block names what a client needs (issue 25 item 12).
	for _, want := range []string{"GD2FS_TOKEN_FILE=" + tokFile, "GD2FS_TLS_CA=" + node.CA, "log in with the cluster token"} {
		if !strings.Contains(upOut.String(), want) {
			t.Fatalf("up's Connect block lacks %q:\n%s", want, upOut.String())
		}
	}
	// A wrong token: the error names --token-file, the flag to use.
	cmd = exec.Command(bin, "status")
	cmd.Env = append(os.Environ(), "GD2FS_MASTER=https://"+maddr, "GD2FS_TLS_CA="+node.CA, "GD2FS_TOKEN=wrong")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "--token-file or GD2FS_TOKEN_FILE") {
		t.Fatalf("status with a wrong token: %v\n%s", err, out)
	}
	if out, err := run("kv", "put", "a/1", filepath.Join(dir, "token")); err != nil {
		t.Fatalf("kv put: %v\n%s", err, out)
	}
	if out, err := run("kv", "rm", "--prefix", ""); err == nil || !strings.Contains(out, "--all") {
		t.Fatalf("kv rm --prefix \"\": %v\n%s", err, out)
	}
	if out, err := run("kv", "exists", "a/1"); err != nil || !strings.Contains(out, "true") {
		t.Fatalf("the block went: %v\n%s", err, out)
	}
	if out, err := run("kv", "rm", "--all"); err != nil || !strings.Contains(out, "deleted 1") {
		t.Fatalf("kv rm --all: %v\n%s", err, out)
	}
	if out, err := run("cp", tokFile, "gd2fs://local/odd\nname"); err == nil || !strings.Contains(out, "control character") {
		t.Fatalf("cp to a name with a newline: %v\n%s", err, out)
	}
}
