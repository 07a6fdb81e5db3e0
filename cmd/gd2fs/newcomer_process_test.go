package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/safetensors"
)

// cliRun runs the gd2fs binary with env and returns its combined output and
// exit status (-1 when it could not start).
func cliRun(t *testing.T, bin string, env []string, stdin []byte, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("gd2fs %v: %v", args, err)
	return "", -1
}

// TestNewcomer walks what a new user does (issue 25) on a real cluster of
// processes: each step checks the output and the exit status a script sees.
func TestNewcomer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	maddr := freeAddr(t)
	data := filepath.Join(dir, "data")
	up := spawn(t, bin, "up", "--dir", data, "--listen", maddr, "--port", "0", "--servers", "3",
		"--mem", "32MiB", "--disk", "2GiB", "--kv-mem", "16MiB", "--kv-disk", "256MiB", "--resp-port", "0")
	env := append(os.Environ(), "GD2FS_MASTER=http://"+maddr)
	run := func(args ...string) (string, int) { return cliRun(t, bin, env, nil, args...) }
	must := func(want string, args ...string) string {
		t.Helper()
		out, code := run(args...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("gd2fs %v: exit %d, want 0 and %q in\n%s", args, code, want, out)
		}
		return out
	}
	fails := func(code int, want string, args ...string) {
		t.Helper()
		out, got := run(args...)
		if got != code || !strings.Contains(out, want) {
			t.Fatalf("gd2fs %v: exit %d, want %d and %q in\n%s", args, got, code, want, out)
		}
	}
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		out, code := run("status")
		return code == 0 && strings.Count(out, " up ") == 3, out
	})
	cl, err := client.New(client.Config{Master: "http://" + maddr})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()

	// Item 8: a second up in the same folder is refused at once, naming the PID.
	fails(1, fmt.Sprintf("held by process %d", up.Process.Pid), "up", "--dir", data, "--listen", freeAddr(t), "--port", "0", "--resp-port", "0")
	// ... and a server given one of its servers' tiers by hand.
	fails(1, fmt.Sprintf("held by process %d", up.Process.Pid), "server", "--master", "http://"+maddr, "--listen", freeAddr(t),
		"--disk", filepath.Join(data, "server-1")+":256MiB", "--kv-disk", filepath.Join(data, "server-1", "kv")+":256MiB")
	// ... and so is a server on a disk tier in use.
	srvDir := filepath.Join(dir, "srv")
	srv := spawn(t, bin, "server", "--master", "http://"+maddr, "--listen", freeAddr(t), "--mem", "8MiB", "--disk", srvDir+":256MiB", "--id", "extra")
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		st, err := cl.Status(ctx)
		return err == nil && testutil.UpServers(st) == 4, fmt.Sprint(err)
	})
	fails(1, fmt.Sprintf("held by process %d", srv.Process.Pid), "server", "--master", "http://"+maddr, "--listen", freeAddr(t), "--disk", srvDir+":256MiB")
	srv.Process.Kill()
	srv.Wait()
	// Until the master marks it down, placement may still pick it.
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		st, err := cl.Status(ctx)
		return err == nil && testutil.UpServers(st) == 3, fmt.Sprint(err)
	})

	// Item 4 and 6: sizes refused at start, with the flag to change.
	fails(2, "at least one data server", "up", "--servers", "0", "--dir", filepath.Join(dir, "x"))
	fails(2, "--kv-disk 8.0 MiB is too small", "up", "--kv-mem", "4MiB", "--kv-disk", "8MiB", "--dir", filepath.Join(dir, "x"))
	fails(2, "--kv-disk", "server", "--kv-disk", filepath.Join(dir, "kv")+":100MiB", "--listen", freeAddr(t))

	// Item 1: --progress shows progress on any stderr (here a file).
	src := filepath.Join(dir, "big.bin")
	blob := testutil.RandomBytes(150<<20+3, 7)
	if err := os.WriteFile(src, blob, 0o644); err != nil {
		t.Fatal(err)
	}
	progFile := filepath.Join(dir, "prog.txt")
	pf, err := os.Create(progFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "cp", "-f", "--progress", src, "gd2fs://local/big/big.bin")
	cmd.Env, cmd.Stderr = env, pf
	err = cmd.Run()
	pf.Close()
	prog, _ := os.ReadFile(progFile)
	if err != nil {
		t.Fatalf("cp --progress: %v\n%s", err, prog)
	}
	if lines := strings.Count(string(prog), "\n"); lines < 2 || !strings.Contains(string(prog), "150.0 MiB / 150.0 MiB  100%") {
		t.Fatalf("cp --progress 2>file wrote %d lines:\n%s", lines, prog)
	}

	// Item 5, 17: --json in snake_case, no internal attributes; ls of a file.
	out := must(`"chunk_size": 16777216`, "stat", "--json", "gd2fs://local/big/big.bin")
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stat --json: %v\n%s", err, out)
	}
	for _, k := range []string{"path", "is_dir", "pool", "size", "sealed", "modified", "chunks"} {
		if _, ok := st[k]; !ok {
			t.Fatalf("stat --json lacks %q:\n%s", k, out)
		}
	}
	if strings.Contains(out, "create_id") || strings.Contains(out, `"Path"`) {
		t.Fatalf("stat --json shows Go names or create_id:\n%s", out)
	}
	must("big.bin", "ls", "-l", "gd2fs://local/big/big.bin")
	out = must(`"path": "/big/big.bin"`, "ls", "--json", "gd2fs://local/big")
	var ls []map[string]any
	if err := json.Unmarshal([]byte(out), &ls); err != nil || len(ls) != 1 {
		t.Fatalf("ls --json: %v\n%s", err, out)
	}

	// Item 9: Ctrl-C during cp removes the partial file and says so.
	cmd = exec.Command(bin, "cp", "--progress", src, "gd2fs://local/big/cut.bin")
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	if !sc.Scan() { // the first progress line: the copy is under way
		t.Fatalf("no progress from cp: %v", sc.Err())
	}
	cmd.Process.Signal(syscall.SIGINT)
	var rest strings.Builder
	for sc.Scan() {
		rest.WriteString(sc.Text() + "\n")
	}
	err = cmd.Wait()
	if err == nil {
		t.Fatalf("cp interrupted exited 0:\n%s", rest.String())
	}
	if !strings.Contains(rest.String(), "interrupted") || !strings.Contains(rest.String(), "removed the partial file") {
		if !strings.Contains(rest.String(), "100%") { // it may have finished first on a fast machine
			t.Fatalf("cp after SIGINT said:\n%s", rest.String())
		}
	}
	fails(1, "no such", "stat", "gd2fs://local/big/cut.bin")

	// An unsealed file: cat refuses it unless --partial; cp over it names -f.
	f, err := cl.Create(ctx, "/big/open.bin", client.CreateOptions{Pool: "perf"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("half")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	fails(1, "not sealed", "cat", "gd2fs://local/big/open.bin")
	must("half", "cat", "--partial", "gd2fs://local/big/open.bin")
	fails(1, "partial copy", "cp", src, "gd2fs://local/big/open.bin")
	fails(1, "rerun with -f", "cp", src, "gd2fs://local/big/big.bin")

	// Item 13: cp to a directory without the slash copies into it.
	small := filepath.Join(dir, "w.bin")
	if err := os.WriteFile(small, []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	must("", "mkdir", "gd2fs://local/models/m")
	must("", "cp", small, "gd2fs://local/models/m")
	must("weights", "cat", "gd2fs://local/models/m/w.bin")

	// Item 17: rm of a full directory names -r; rm -r removes it all.
	fails(1, "rm -r", "rm", "gd2fs://local/big")
	must("", "rm", "-r", "gd2fs://local/big")
	fails(1, "no such", "ls", "gd2fs://local/big")

	// Item 17: exit statuses and --json of kv.
	must("", "kv", "put", "k/1", small)
	must("true\tk/1", "kv", "exists", "k/1")
	fails(1, "false\tk/2", "kv", "exists", "k/1", "k/2")
	if out, code := run("kv", "exists", "-q", "k/2"); code != 1 || out != "" {
		t.Fatalf("kv exists -q of a miss: exit %d %q", code, out)
	}
	fails(1, `"stored": false`, "kv", "exists", "--json", "k/1", "k/2")
	must(`"prefix": 1`, "kv", "exists", "--json", "k/1")
	must(`"tier": "dram"`, "kv", "stat", "--json", "k/1")
	fails(2, "accepts 1 arg", "stat", "a", "b")
	fails(2, "unknown flag", "ls", "--bogus", "gd2fs://local/")
	fails(1, "no such", "cat", "gd2fs://local/nope")

	// Item 7: a whole explicit-mode turn from the shell.
	must(`"token_bytes"`, "model", "layout", "set", "tiny", "--layers", "2", "--kv-heads", "2", "--head-dim", "4", "--dtype", "bf16", "--page-tokens", "16")
	idsFile := filepath.Join(dir, "ids.txt") // the prompt's token ids: a plan checks content
	var ids []string
	for i := 1; i <= 40; i++ {
		ids = append(ids, strconv.Itoa(i))
	}
	if err := os.WriteFile(idsFile, []byte(strings.Join(ids, " ")), 0o644); err != nil {
		t.Fatal(err)
	}
	out = must(`"plan_id"`, "session", "plan", "chat-1", "--model", "tiny", "--tokens", idsFile)
	var plan client.Plan
	if err := json.Unmarshal([]byte(out), &plan); err != nil || len(plan.Fresh) != 1 {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	id := strconv.FormatInt(plan.PlanID, 10)
	fails(1, "gd2fs session write chat-1 --plan "+id, "session", "commit", "chat-1", "--plan", id)
	kv := testutil.RandomBytes(int(plan.Fresh[0].KVLength), 9)
	kvFile := filepath.Join(dir, "fresh.bin")
	if err := os.WriteFile(kvFile, kv[:len(kv)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	fails(1, "takes exactly", "session", "write", "chat-1", "--plan", id, kvFile)
	if out, code := cliRun(t, bin, env, kv, "session", "write", "chat-1", "--plan", id, "-"); code != 0 {
		t.Fatalf("session write from stdin: exit %d\n%s", code, out)
	}
	must("40 tokens stored", "session", "commit", "chat-1", "--plan", id)
	fails(1, "no outstanding plan", "session", "write", "chat-1", "--plan", id, kvFile)
	got := make([]byte, len(kv))
	u, _ := client.ParseURI(plan.Fresh[0].KVURI)
	sf, err := cl.Open(ctx, u.Path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sf.ReadAt(got, plan.Fresh[0].KVStart); err != nil || !bytes.Equal(got, kv) {
		t.Fatalf("the session file after session write: %v, equal=%v", err, bytes.Equal(got, kv))
	}
	must(`"id": "chat-1"`, "session", "ls", "--json")
	// Item 13: errors name the CLI's flags, not the API's fields.
	fails(1, "give --model", "session", "plan", "chat-2", "--unsafe-count-only", "--prompt-tokens", "4")
	fails(1, "--prompt-tokens must be", "session", "plan", "chat-2", "--model", "tiny", "--unsafe-count-only")

	// Item 5: model inspect prints dtypes, not a Go map; --json too.
	st1, err := safetensors.Build([]safetensors.Tensor{{Name: "w", DType: "F16", Shape: []int64{4, 4}}}, [][]byte{make([]byte, 32)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stFile := filepath.Join(dir, "model.safetensors")
	if err := os.WriteFile(stFile, st1, 0o644); err != nil {
		t.Fatal(err)
	}
	must("", "cp", stFile, "gd2fs://local/models/m/")
	out = must("F16 32 B", "model", "inspect", "gd2fs://local/models/m")
	if strings.Contains(out, "map[") {
		t.Fatalf("model inspect prints a Go map:\n%s", out)
	}
	must(`"dtype_bytes"`, "model", "inspect", "--json", "gd2fs://local/models/m")

	// Item 17: cache ls names its folder; --json.
	hf := filepath.Join(dir, "hf")
	must("cache "+hf, "cache", "ls", "--cache", hf)
	must(`"dir": "`+hf, "cache", "ls", "--json", "--cache", hf)

	// Item 11: the gd2fs:// form of --master; a URL that is no master.
	if out, code := cliRun(t, bin, os.Environ(), nil, "--master", "gd2fs://"+maddr, "ls", "gd2fs://local/models/m"); code != 0 || !strings.Contains(out, "w.bin") {
		t.Fatalf("--master gd2fs://: exit %d\n%s", code, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	other := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok": true}`))
	})}
	go other.Serve(ln)
	defer other.Close()
	if out, code := cliRun(t, bin, os.Environ(), nil, "--master", "http://"+ln.Addr().String(), "ls", "gd2fs://local/"); code != 1 || !strings.Contains(out, "not a gd2fs master") {
		t.Fatalf("a non-gd2fs server as --master: exit %d\n%s", code, out)
	}

	// Item 17: completion of gd2fs:// paths, asking the master.
	out = must("gd2fs://local/models/", "__complete", "ls", "gd2fs://local/mo")
	out = must("gd2fs://local/models/m/w.bin", "__complete", "cat", "gd2fs://local/models/m/")
	// ... and in bash itself, as a user's TAB runs it (bash splits the word
	// at the colon; the script hands back what follows it).
	if _, err := os.Stat("/usr/share/bash-completion/bash_completion"); err == nil {
		script := `source /usr/share/bash-completion/bash_completion; source <("$BIN" completion bash)
COMP_LINE="$BIN ls gd2fs://local/models/m/w"; COMP_POINT=${#COMP_LINE}
COMP_WORDS=("$BIN" ls gd2fs : //local/models/m/w); COMP_CWORD=4
__start_gd2fs 2>/dev/null; printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command("bash", "-c", script)
		cmd.Env = append(env, "BIN="+bin)
		got, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(got)) != "//local/models/m/w.bin" {
			t.Fatalf("bash completion: %v %q", err, got)
		}
	} else {
		t.Log("bash-completion not installed: bash's side of completion not checked")
	}
	// Item 17: --help lists the client environment variables; new commands have examples.
	must("GD2FS_TLS_CA", "--help")
	must("Example", "session", "write", "--help")
	must("gd2fs://", "completion", "--help")
}

// TestUpOneServerDefaultPool: with one server, a cp to the default (ha)
// pool fails and leaves no empty open file behind (issue 25 item 13).
func TestUpOneServerDefaultPool(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	maddr := freeAddr(t)
	spawn(t, bin, "up", "--dir", filepath.Join(dir, "data"), "--listen", maddr, "--port", "0", "--servers", "1",
		"--mem", "16MiB", "--disk", "256MiB", "--kv-disk", "0", "--resp-port", "0")
	env := append(os.Environ(), "GD2FS_MASTER=http://"+maddr)
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		out, code := cliRun(t, bin, env, nil, "status")
		return code == 0 && strings.Count(out, " up ") == 1, out
	})
	src := filepath.Join(dir, "f.bin")
	if err := os.WriteFile(src, []byte("bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := cliRun(t, bin, env, nil, "cp", src, "gd2fs://local/f.bin")
	if code == 0 || !strings.Contains(out, "--pool perf") || !strings.Contains(out, "removed the partial file") {
		t.Fatalf("cp to the ha pool on one server: exit %d\n%s", code, out)
	}
	if out, code := cliRun(t, bin, env, nil, "stat", "gd2fs://local/f.bin"); code == 0 {
		t.Fatalf("the failed cp left a file:\n%s", out)
	}
	if out, code := cliRun(t, bin, env, nil, "cp", "--pool", "perf", src, "gd2fs://local/f.bin"); code != 0 {
		t.Fatalf("cp --pool perf after it: exit %d\n%s", code, out)
	}
}
