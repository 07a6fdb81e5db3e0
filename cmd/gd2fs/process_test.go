package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/gd2fs/gd2fs/internal/testutil"
	"github.com/gd2fs/gd2fs/safetensors"
)

// buildBinary builds gd2fs once for the process tests.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gd2fs")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// freeAddr is a loopback address with a port free now, never one it gave
// before in this process: a port is free again once its probe closes, and
// the kernel handed the same one to a master and then to a server spawned
// before the master had bound it (TestLinkedSurvivesSIGKILL failed so).
func freeAddr(t *testing.T) string {
	t.Helper()
	givenAddrs.Lock()
	defer givenAddrs.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a := l.Addr().String()
		l.Close()
		if !givenAddrs.m[a] {
			givenAddrs.m[a] = true
			return a
		}
	}
	t.Fatal("no free port that this test process has not handed out before")
	return ""
}

var givenAddrs = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

func spawn(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	return spawnEnv(t, nil, bin, args...)
}

// upCLI spawns `gd2fs up` with servers data servers in dir/data (a RESP
// port too; env: more environment for it and the CLI, extra: more flags)
// and waits until `gd2fs status` lists them up. It returns the environment
// that points the CLI at that master and a run of the CLI with it
// (combined output). spawnEnv logs up's output if the test fails.
func upCLI(t *testing.T, bin, dir string, servers int, env []string, extra ...string) ([]string, func(args ...string) (string, error)) {
	t.Helper()
	maddr := freeAddr(t)
	spawnEnv(t, env, bin, append([]string{"up", "--dir", filepath.Join(dir, "data"), "--listen", maddr, "--port", "0",
		"--servers", fmt.Sprint(servers), "--resp-port", "0"}, extra...)...)
	cliEnv := append(append(os.Environ(), env...), "GD2FS_MASTER=http://"+maddr)
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = cliEnv
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		out, err := run("status")
		return err == nil && strings.Count(out, " up ") == servers, fmt.Sprintf("status: %v\n%s", err, out)
	})
	return cliEnv, run
}

// TestSIGKILLServer runs the master and three servers as separate processes,
// kills one server with SIGKILL, and checks that every HA file reads back
// byte-identical while a perf file on the dead server fails with a clear
// "unavailable" error — never wrong bytes. The server then restarts from its
// disk tier and the perf file is readable again.
func TestSIGKILLServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	maddr := freeAddr(t)
	murl := "http://" + maddr
	const token = "tok"
	spawn(t, bin, "master", "--listen", maddr, "--meta", "sqlite://"+filepath.Join(dir, "meta.db"),
		"--token", token, "--down-after", "1s", "--repair-after", "-1s")
	servers := make([]*exec.Cmd, 3)
	saddrs := make([]string, 3)
	startServer := func(i int) {
		servers[i] = spawn(t, bin, "server", "--master", murl, "--token", token, "--listen", saddrs[i],
			"--mem", "16MiB", "--disk", filepath.Join(dir, fmt.Sprintf("s%d", i))+":1GiB", "--id", fmt.Sprintf("s%d", i),
			"--heartbeat", "200ms")
	}
	for i := range servers {
		saddrs[i] = freeAddr(t)
		startServer(i)
	}
	cl, err := client.New(client.Config{Master: murl, Token: token, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	waitUp(t, cl, 3)

	r := rand.New(rand.NewPCG(5, 5))
	files := map[string][]byte{}
	for i, pool := range []string{"ha", "ha", "perf", "perf", "perf"} {
		data := make([]byte, 3<<20+r.IntN(1<<20))
		for k := range data {
			data[k] = byte(r.Uint32())
		}
		p := fmt.Sprintf("/f/%s-%d", pool, i)
		f, err := cl.Create(ctx, p, client.CreateOptions{Pool: pool, ChunkSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		files[p] = data
	}

	victim := 1
	if err := servers[victim].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	servers[victim].Wait()
	waitUp(t, cl, 2) // the master notices the silence and marks it down
	victimID := fmt.Sprintf("s%d", victim)

	lost := 0
	for p, data := range files {
		st, err := cl.Stat(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		onVictim := false
		for _, ch := range st.Chunks {
			for _, rp := range ch.Replicas {
				onVictim = onVictim || rp.Server == victimID
			}
		}
		got, err := readAll(cl, p)
		switch {
		case st.Pool == "ha":
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("HA file %s after SIGKILL: %v (equal=%v)", p, err, bytes.Equal(got, data))
			}
		case onVictim:
			lost++
			if !errors.Is(err, errs.ErrUnavailable) {
				t.Fatalf("perf file %s on the killed server: got %v, want unavailable", p, err)
			}
			if !strings.Contains(err.Error(), "unavailable") {
				t.Fatalf("error does not say unavailable: %v", err)
			}
		default:
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("perf file %s not on the killed server: %v", p, err)
			}
		}
	}
	if lost == 0 {
		t.Fatalf("no perf file had a chunk on %s: placement did not spread", victimID)
	}

	// Restart: the server comes back from its disk tier with checksums intact.
	startServer(victim)
	waitUp(t, cl, 3)
	for p, data := range files {
		got, err := readAll(cl, p)
		if err != nil || sha256.Sum256(got) != sha256.Sum256(data) {
			t.Fatalf("%s after restart: %v", p, err)
		}
	}
}

func readAll(cl *client.Client, p string) ([]byte, error) {
	f, err := cl.Open(context.Background(), p)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	_, err = f.WriteTo(&b)
	return b.Bytes(), err
}

func waitUp(t *testing.T, cl *client.Client, n int) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() (bool, string) {
		st, err := cl.Status(context.Background())
		return err == nil && testutil.UpServers(st) == n, fmt.Sprintf("%d of %d servers up (%v)", testutil.UpServers(st), n, err)
	})
}

func TestCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	env, run := upCLI(t, bin, dir, 3, nil, "--mem", "32MiB", "--disk", "1GiB")
	src := filepath.Join(dir, "model.bin")
	data := make([]byte, 20<<20+17)
	for i := range data {
		data[i] = byte(i * 31)
	}
	os.WriteFile(src, data, 0o644)
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"cp", src, "gd2fs://local/models/m/model.bin"}, ""},
		{[]string{"ls", "-l", "gd2fs://local/models/m"}, "model.bin"},
		{[]string{"stat", "gd2fs://local/models/m/model.bin"}, "sealed:     true"},
		{[]string{"cp", "gd2fs://local/models/m/model.bin", filepath.Join(dir, "back.bin")}, ""},
	}
	for _, s := range steps {
		out, err := run(s.args...)
		if err != nil || !strings.Contains(out, s.want) {
			t.Fatalf("gd2fs %v: %v\n%s", s.args, err, out)
		}
	}
	back, _ := os.ReadFile(filepath.Join(dir, "back.bin"))
	if !bytes.Equal(back, data) {
		t.Fatal("cp round trip differs")
	}
	cmd := exec.Command(bin, "cat", "gd2fs://local/models/m/model.bin")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("cat: %v", err)
	}
	// Errors are readable and say what is wrong.
	for _, s := range []struct {
		args []string
		want string
	}{
		{[]string{"cat", "gd2fs://local/nope"}, "no such file"},
		{[]string{"cp", src, "gd2fs://local/models/m/model.bin"}, "already exists"},
		{[]string{"ls", "/not-a-uri"}, "not a gd2fs URI"},
		{[]string{"ls", "gd2fs://prod/models"}, `serves cluster "local"`},
		{[]string{"rm", "gd2fs://local/models"}, "not empty"},
	} {
		out, err := run(s.args...)
		if err == nil || !strings.Contains(out, s.want) {
			t.Fatalf("gd2fs %v: want error containing %q, got %v\n%s", s.args, s.want, err, out)
		}
	}
	// mv: a rename, a move into a directory, -n, a refusal that says why.
	for _, s := range []struct {
		args []string
		want string
		fail bool
	}{
		{[]string{"mv", "gd2fs://local/models/m/model.bin", "gd2fs://local/models/m/renamed.bin"}, "", false},
		{[]string{"cp", src, "gd2fs://local/models/other.bin"}, "", false},
		{[]string{"mv", "-n", "gd2fs://local/models/other.bin", "gd2fs://local/models/m/renamed.bin"}, "already exists", true},
		{[]string{"mv", "gd2fs://local/models/other.bin", "gd2fs://local/models/m/renamed.bin", "gd2fs://local/nowhere"}, "not a directory", true},
		{[]string{"mkdir", "gd2fs://local/archive"}, "", false},
		{[]string{"mv", "gd2fs://local/models/m", "gd2fs://local/archive"}, "", false},
		{[]string{"ls", "gd2fs://local/archive/m"}, "renamed.bin", false},
		{[]string{"mv", "gd2fs://local/archive/m/renamed.bin", "gd2fs://local/models/m/model.bin"}, "", false},
		{[]string{"rm", "gd2fs://local/models/other.bin"}, "", false},
	} {
		out, err := run(s.args...)
		if (err != nil) != s.fail || !strings.Contains(out, s.want) {
			t.Fatalf("gd2fs %v: %v (want failure: %v)\n%s", s.args, err, s.fail, out)
		}
	}
	cmd = exec.Command(bin, "cat", "gd2fs://local/models/m/model.bin")
	cmd.Env = env
	if out, err := cmd.Output(); err != nil || !bytes.Equal(out, data) {
		t.Fatalf("cat after two moves: %v", err)
	}
	if out, err := run("rm", "gd2fs://local/models/m/model.bin"); err != nil {
		t.Fatalf("rm: %v %s", err, out)
	}
	// KV from the shell.
	small := filepath.Join(dir, "small.bin")
	if err := os.WriteFile(small, data[:1000], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		args []string
		want string
	}{
		{[]string{"kv", "put", "llama/0/a", src}, ""},
		{[]string{"kv", "put", "llama/0/a", src}, "key exists"},
		{[]string{"kv", "exists", "llama/0/a"}, "prefix\t1 of 1"}, // a miss exits 1: TestNewcomer
		{[]string{"kv", "stat", "llama/0/a"}, "tier:"},
		{[]string{"kv", "put", "--pin", "dram", "--priority", "3", "--ttl", "1h", "sys/0", small}, ""},
		{[]string{"kv", "stat", "sys/0"}, "pin:      dram\npriority: 3\nttl:      59m"},
		{[]string{"kv", "stat", "--json", "sys/0"}, `"pin": "dram"`},
		{[]string{"kv", "ttl", "--persist", "sys/0"}, "none"},
		{[]string{"kv", "unpin", "--prefix", "sys/"}, "changed 1 blocks"},
		{[]string{"kv", "ttl", "sys/0", "0"}, "expired: deleted"},
		{[]string{"kv", "rm", "--prefix", "llama/"}, "deleted 1 blocks"},
	} {
		out, err := run(s.args...)
		if err != nil || !strings.Contains(out, s.want) {
			t.Fatalf("gd2fs %v: %v\n%s", s.args, err, out)
		}
	}
	// Explicit-mode sessions from the shell.
	savedFile := filepath.Join(t.TempDir(), "saved.json")
	if err := os.WriteFile(savedFile, []byte(`{"kvcache_params": {"id": "chat-3", "fresh_kvcache": []}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	idsFile := filepath.Join(t.TempDir(), "ids.json") // an engine's /tokenize answer
	if err := os.WriteFile(idsFile, []byte(`{"count": 40, "max_model_len": 4096, "tokens": [`+strings.TrimSuffix(strings.Repeat("7, ", 40), ", ")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		args []string
		want string
		fail bool
	}{
		{[]string{"model", "layout", "set", "llama-3-8b", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "bf16", "--page-tokens", "16", "--layout", "layer_first"}, `"token_bytes": 131072`, false},
		{[]string{"model", "layout", "get", "llama-3-8b"}, `"page_tokens": 16`, false},
		{[]string{"session", "plan", "chat-1", "--model", "llama-3-8b", "--prompt-tokens", "8192", "--unsafe-count-only"}, `"kv_length": 1073741824`, false},
		{[]string{"session", "plan", "chat-1", "--model", "llama-3-8b", "--prompt-tokens", "8192"}, "--tokens FILE", true},
		{[]string{"session", "hashes", "--page-tokens", "16", "--tokens", idsFile}, "\n", false},
		{[]string{"session", "commit", "chat-1", "--plan", "999999"}, "no outstanding plan", true},
		{[]string{"session", "plan", "chat-1", "--model", "nope", "--tokens", idsFile}, "no KV layout for model", true},
		{[]string{"session", "ls"}, "chat-1", false},
		{[]string{"session", "show", "chat-1"}, `"id": "chat-1"`, false},
		{[]string{"session", "fork", "chat-1", "chat-2"}, "shared with chat-1", false},
		{[]string{"session", "rm", "chat-1", "chat-2"}, "", false},
		{[]string{"session", "show", "chat-1"}, "no session", true},
		{[]string{"model", "layout", "set", "tp2", "--layers", "2", "--kv-heads", "4", "--head-dim", "8", "--dtype", "bf16", "--page-tokens", "16", "--layout", "kv_first", "--tp-size", "2"}, `"rank_token_bytes": 128`, false},
		{[]string{"session", "plan", "chat-3", "--model", "tp2", "--tokens", idsFile, "--decode-tokens", "10", "--format", "vllm"}, `?cluster=local"`, false},
		{[]string{"session", "commit", "chat-3", "--saved", savedFile}, "nothing to commit", true},
		{[]string{"session", "commit", "chat-3", "--saved", src}, "not JSON", true},
	} {
		out, err := run(s.args...)
		if (err != nil) != s.fail || !strings.Contains(out, s.want) {
			t.Fatalf("gd2fs %v: err=%v, want failure=%v and %q in\n%s", s.args, err, s.fail, s.want, out)
		}
	}
	if out, err := run("kv", "get", "llama/0/a"); err == nil || !strings.Contains(out, "no block") {
		t.Fatalf("kv get of a deleted key: %v %s", err, out)
	}
	for _, sub := range []string{"up", "master", "server", "cp", "ls", "stat", "cat", "rm", "mkdir", "status", "kv", "kv put", "kv get", "model", "model layout set", "session", "session plan", "session commit", "session hashes", "router", "resp",
		"model pull", "model link", "model inspect", "warmup", "cache", "cache gc"} {
		out, err := run(append(strings.Fields(sub), "--help")...)
		if err != nil || !strings.Contains(out, "Example") {
			t.Fatalf("%s --help lacks an example: %v\n%s", sub, err, out)
		}
	}
}

// TestKVRestartAfterSIGKILL: blocks demoted to a server's disk tier survive a
// SIGKILL and restart; a record damaged on disk becomes a miss, never data.
func TestKVRestartAfterSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	maddr := freeAddr(t)
	murl := "http://" + maddr
	spawn(t, bin, "master", "--listen", maddr, "--meta", "sqlite://"+filepath.Join(dir, "meta.db"), "--down-after", "1s")
	servers := make([]*exec.Cmd, 3)
	saddrs := make([]string, 3)
	startServer := func(i int) {
		servers[i] = spawn(t, bin, "server", "--master", murl, "--listen", saddrs[i], "--id", fmt.Sprintf("s%d", i),
			"--mem", "0", "--disk", filepath.Join(dir, fmt.Sprintf("s%d", i))+":64MiB",
			"--kv-mem", "1MiB", "--kv-disk", filepath.Join(dir, fmt.Sprintf("kv%d", i))+":256MiB", "--heartbeat", "200ms")
	}
	for i := range servers {
		saddrs[i] = freeAddr(t)
		startServer(i)
	}
	cl, err := client.New(client.Config{Master: murl, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitUp(t, cl, 3)
	ctx := context.Background()
	kv := cl.KV("perf")
	value := func(k string) []byte {
		b := bytes.Repeat([]byte(k), 100<<10/len(k)+1)
		return b[:100<<10]
	}
	keys := make([]string, 120)
	for i := range keys {
		keys[i] = fmt.Sprintf("m/0/%04d", i)
		if err := kv.Put(ctx, keys[i], value(keys[i])); err != nil {
			t.Fatal(err)
		}
	}
	servers[1].Process.Signal(syscall.SIGKILL)
	servers[1].Wait()
	waitUp(t, cl, 2) // the master notices the silence
	// Damage one byte inside the first value of the killed server's first segment.
	segs, _ := filepath.Glob(filepath.Join(dir, "kv1", "seg-*.kv"))
	if len(segs) == 0 {
		t.Fatal("no KV segment on disk: nothing was demoted")
	}
	f, _ := os.OpenFile(segs[0], os.O_RDWR, 0)
	const at int64 = 24 + int64(len("perf\x00m/0/0000")) + 500 // header, store key, into the value
	b := make([]byte, 1)
	f.ReadAt(b, at)
	f.WriteAt([]byte{^b[0]}, at)
	f.Close()
	startServer(1)
	waitUp(t, cl, 3)
	hits, misses := 0, 0
	for _, k := range keys {
		info, err := kv.Stat(ctx, k)
		if err != nil {
			continue
		}
		got, err := kv.Get(ctx, k)
		switch {
		case errors.Is(err, errs.ErrNotFound):
			misses++
		case err != nil:
			t.Fatalf("get %s: %v", k, err)
		case !bytes.Equal(got, value(k)):
			t.Fatalf("%s: wrong bytes after restart", k)
		default:
			if info.Server == "s1" {
				hits++
			}
		}
	}
	if hits < 10 || misses != 1 {
		t.Fatalf("after SIGKILL+restart the killed server served %d blocks from disk, %d damaged misses (want >= 10 and exactly 1)", hits, misses)
	}
}

func TestWeightsCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	s3 := s3test.Start("AKID", "secret")
	defer s3.Close()
	s3.CreateBucket("models")
	st, _ := safetensors.Build([]safetensors.Tensor{{Name: "embed", DType: "BF16", Shape: []int64{512, 333}}}, [][]byte{bytes.Repeat([]byte{7}, 512*333*2)}, nil)
	s3.Put("models", "org/m/model.safetensors", st)
	s3.Put("models", "org/m/config.json", []byte(`{}`))
	dir := t.TempDir()
	_, run := upCLI(t, bin, dir, 3, []string{"AWS_ENDPOINT_URL=" + s3.URL, "AWS_ACCESS_KEY_ID=AKID",
		"AWS_SECRET_ACCESS_KEY=secret", "AWS_REGION=us-east-1"}, "--mem", "32MiB", "--disk", "1GiB")
	cache := filepath.Join(dir, "hf")
	for _, s := range []struct {
		args []string
		want string
	}{
		{[]string{"model", "pull", "s3://models/org/m", "gd2fs://local/models/org/m"}, "model.safetensors"},
		{[]string{"model", "pull", "s3://models/org/m", "gd2fs://local/models/org/m"}, "already complete"},
		{[]string{"model", "link", "s3://models/org/m", "gd2fs://local/linked/org/m"}, "<- s3://models/org/m/model.safetensors"},
		{[]string{"model", "inspect", "--tensors", "gd2fs://local/models/org/m"}, "embed"},
		{[]string{"warmup", "gd2fs://local/linked/org/m", "--cache", cache}, "models--org--m/snapshots/"},
		{[]string{"cache", "ls", "--cache", cache}, "models--org--m"},
		{[]string{"status", "--cache", cache}, "warm hit ratio"},
	} {
		out, err := run(s.args...)
		for i := 0; i < 50 && s.args[0] == "status" && !strings.Contains(out, s.want); i++ {
			time.Sleep(100 * time.Millisecond) // served bytes arrive with the next heartbeat
			out, err = run(s.args...)
		}
		if err != nil || !strings.Contains(out, s.want) {
			t.Fatalf("gd2fs %v: %v\n%s", s.args, err, out) // spawnEnv logs gd2fs up's output
		}
	}
	for _, s := range []struct {
		args []string
		want string
	}{
		{[]string{"model", "pull", "s3://nope/x", "gd2fs://local/x"}, "no such bucket"},
		{[]string{"model", "pull", "--s3-access-key", "WRONG", "s3://models/org/m", "gd2fs://local/y"}, "refused the credentials"},
	} {
		out, err := run(s.args...)
		if err == nil || !strings.Contains(out, s.want) {
			t.Fatalf("gd2fs %v: want error %q, got %v\n%s", s.args, s.want, err, out)
		}
	}
	snaps, _ := filepath.Glob(filepath.Join(cache, "models--org--m", "snapshots", "*", "model.safetensors"))
	if len(snaps) != 1 {
		t.Fatalf("snapshot files %v", snaps)
	}
	if got, err := os.ReadFile(snaps[0]); err != nil || !bytes.Equal(got, st) {
		t.Fatalf("warmed model.safetensors differs: %v", err)
	}
}
