package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
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
	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/gd2fs/gd2fs/internal/testutil"
)

// spawnEnv is spawn with extra environment variables.
func spawnEnv(t *testing.T, env []string, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var logb testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logb, &logb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), logb.String())
		}
	})
	return cmd
}

// metricValue reads one sample from a Prometheus text endpoint (0 when absent).
func metricValue(t *testing.T, url, sample string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// TestLinkedSurvivesSIGKILL (issue 14.1): a model linked from S3 is loaded by
// 8 processes at once (4 `gd2fs cat`, 4 `gd2fs warmup`, the warm tier of a
// hot cache); the server holding most of its chunks is SIGKILLed while the
// servers are filling them from S3. Every loader finishes with the S3
// object's bytes: readers ask the master to re-place the dead server's
// chunks, the new servers fill them from S3, and each chunk costs at most one
// more fill (S3 bytes <= model + the dead server's chunks).
func TestLinkedSurvivesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	s3 := s3test.Start("AKID", "secret")
	defer s3.Close()
	s3.CreateBucket("models")
	const size = 24<<20 + 12345
	model := testutil.RandomBytes(size, 14)
	s3.Put("models", "org/m/model.safetensors", model)
	env := []string{"AWS_ENDPOINT_URL=" + s3.URL, "AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=secret", "AWS_REGION=us-east-1"}

	dir := t.TempDir()
	maddr := freeAddr(t)
	murl := "http://" + maddr
	const token = "tok"
	spawnEnv(t, env, bin, "master", "--listen", maddr, "--meta", "sqlite://"+filepath.Join(dir, "meta.db"),
		"--token", token, "--down-after", "2s", "--repair-after", "-1s")
	servers := map[string]*exec.Cmd{}
	for i := range 3 {
		id := fmt.Sprintf("s%d", i)
		servers[id] = spawnEnv(t, env, bin, "server", "--master", murl, "--token", token, "--listen", freeAddr(t),
			"--mem", "64MiB", "--disk", filepath.Join(dir, id)+":1GiB", "--id", id, "--heartbeat", "200ms")
	}
	cl, err := client.New(client.Config{Master: murl, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitUp(t, cl, 3)
	remote := "gd2fs://local/linked/org/m"
	cliEnv := append(env, "GD2FS_MASTER="+murl, "GD2FS_TOKEN="+token)
	link := exec.Command(bin, "model", "link", "--chunk-size", "1MiB", "s3://models/org/m", remote)
	link.Env = append(os.Environ(), cliEnv...)
	if out, err := link.CombinedOutput(); err != nil {
		t.Fatalf("model link: %v\n%s", err, out)
	}
	st, err := cl.Stat(context.Background(), "/linked/org/m/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int64{}
	for _, c := range st.Chunks {
		held[c.Replicas[0].Server] += c.Length
	}
	victim := "s0"
	for id, n := range held {
		if n > held[victim] {
			victim = id
		}
	}
	t.Logf("chunk bytes per server %v; SIGKILL %s", held, victim)

	// Fills wait in S3 while the victim dies: loaders are mid-load.
	s3.SetDelay(500 * time.Millisecond)
	type loader struct {
		cmd *exec.Cmd
		out string // cat output file, or warmup cache folder
		log testutil.SyncBuffer
	}
	var loaders []*loader
	for i := range 8 {
		l := &loader{}
		if i%2 == 0 {
			l.out = filepath.Join(dir, fmt.Sprintf("cat-%d", i))
			l.cmd = exec.Command(bin, "cat", remote+"/model.safetensors")
			f, err := os.Create(l.out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			l.cmd.Stdout, l.cmd.Stderr = f, &l.log
		} else {
			l.out = filepath.Join(dir, fmt.Sprintf("hf-%d", i))
			l.cmd = exec.Command(bin, "warmup", "-q", remote, "--cache", l.out)
			l.cmd.Stdout, l.cmd.Stderr = &l.log, &l.log
		}
		l.cmd.Env = append(os.Environ(), cliEnv...)
		if err := l.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer l.cmd.Process.Kill()
		loaders = append(loaders, l)
	}
	testutil.Eventually(t, 60*time.Second, func() (bool, string) {
		return s3.GETs() > 0, "no fill reached S3"
	})
	if err := servers[victim].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	servers[victim].Wait()
	s3.SetDelay(0)

	for i, l := range loaders {
		if err := l.cmd.Wait(); err != nil {
			t.Fatalf("loader %d (%v) failed after the SIGKILL: %v\n%s", i, l.cmd.Args[1:], err, l.log.String())
		}
		got, err := os.ReadFile(l.out)
		if i%2 == 1 {
			snaps, _ := filepath.Glob(filepath.Join(l.out, "models--org--m", "snapshots", "*", "model.safetensors"))
			if len(snaps) != 1 {
				t.Fatalf("loader %d: snapshot files %v\n%s", i, snaps, l.log.String())
			}
			got, err = os.ReadFile(snaps[0])
		}
		if err != nil || !bytes.Equal(got, model) {
			t.Fatalf("loader %d: %d bytes, equal to the S3 object: %v (%v)", i, len(got), bytes.Equal(got, model), err)
		}
	}
	sent := s3.BytesSent()
	refills := metricValue(t, murl+"/metrics", `gd2fs_master_refills_after_failure_total{outcome="ok"}`)
	t.Logf("8 loaders byte-identical; S3 sent %d bytes for a %d-byte model (%.2fx; the dead server held %d); %v chunks re-placed",
		sent, size, float64(sent)/size, held[victim], refills)
	if sent > size+held[victim] {
		t.Fatalf("S3 sent %d bytes: more than the model (%d) plus one refill of the dead server's chunks (%d)", sent, size, held[victim])
	}
	if refills < 1 {
		t.Fatalf("no chunk was re-placed: the SIGKILL did not land mid-load")
	}
}
