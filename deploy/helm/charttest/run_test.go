package charttest

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestRenderedPodsRun runs what the chart renders: the master's and a
// server's container args and env, as processes of a gd2fs built from this
// checkout, with only what Kubernetes would supply replaced (the pod IP and
// DNS names by 127.0.0.1, mounted paths by temporary directories, wildcard
// listens by loopback ones). Both must become ready on the probe paths and
// ports the chart gives the kubelet: a misspelt flag, a bad size or a probe
// on the wrong port fails here, not on a cluster.
func TestRenderedPodsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs gd2fs")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "gd2fs")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gd2fs")
	build.Dir = "../../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	mp, sp := freePort(t), freePort(t)
	values := `
token: {secretName: tok}
masters: {port: ` + strconv.Itoa(mp) + `}
servers: {port: ` + strconv.Itoa(sp) + `, memory: 64MiB, disk: 256MiB, kvMem: 16MiB, kvDisk: 256MiB}
`
	o, err := render(t, load(t), values)
	if err != nil {
		t.Fatal(err)
	}
	tokenDir := filepath.Join(dir, "token")
	if err := os.MkdirAll(tokenDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tokenDir, "token"), []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// What Kubernetes supplies, and the rewrite of each for loopback.
	kube := func(role string) *strings.Replacer {
		data := filepath.Join(dir, role)
		if err := os.MkdirAll(data, 0o700); err != nil {
			t.Fatal(err)
		}
		return strings.NewReplacer(
			"$(POD_IP)", "127.0.0.1",
			"$(POD_NAME).rel-gd2fs-server.ns.svc.cluster.local", "127.0.0.1",
			"rel-gd2fs-master.ns.svc", "127.0.0.1",
			"/var/lib/gd2fs", data,
			"/etc/gd2fs/token", tokenDir,
			"--listen=:", "--listen=127.0.0.1:",
		)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// exited is closed when the process ends; err is then its Wait's.
	type proc struct {
		exited chan struct{}
		err    error
	}
	start := func(role string, c corev1.Container) (readyURL string, p *proc) {
		r := kube(role)
		var args []string
		for _, a := range c.Args {
			args = append(args, r.Replace(a))
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH")}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				cmd.Env = append(cmd.Env, e.Name+"="+r.Replace(e.Value))
			}
		}
		log, err := os.Create(filepath.Join(dir, role+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p = &proc{exited: make(chan struct{})}
		go func() { p.err = cmd.Wait(); log.Close(); close(p.exited) }()
		t.Cleanup(func() { cancel(); <-p.exited })
		probe := c.ReadinessProbe.HTTPGet
		port := 0
		for _, cp := range c.Ports {
			if cp.Name == probe.Port.String() {
				port = int(cp.ContainerPort)
			}
		}
		return "http://127.0.0.1:" + strconv.Itoa(port) + probe.Path, p
	}
	m := o.deployment(t).Spec.Template.Spec.Containers[0]
	s := o.statefulSet(t).Spec.Template.Spec.Containers[0]
	mReady, mDone := start("master", m)
	sReady, sDone := start("server", s)
	deadline := time.Now().Add(60 * time.Second)
	for _, u := range []string{mReady, sReady} {
		for {
			resp, err := http.Get(u)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			select {
			case <-mDone.exited:
				b, _ := os.ReadFile(filepath.Join(dir, "master.log"))
				t.Fatalf("the rendered master exited: %v\n%s", mDone.err, b)
			case <-sDone.exited:
				b, _ := os.ReadFile(filepath.Join(dir, "server.log"))
				t.Fatalf("the rendered server exited: %v\n%s", sDone.err, b)
			case <-time.After(100 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				mb, _ := os.ReadFile(filepath.Join(dir, "master.log"))
				sb, _ := os.ReadFile(filepath.Join(dir, "server.log"))
				t.Fatalf("%s not ready within 60s (last: %v)\nmaster:\n%s\nserver:\n%s", u, err, mb, sb)
			}
		}
	}
	// The token from the mounted Secret is in force.
	resp, err := http.Get(strings.TrimSuffix(mReady, "/readyz") + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/v1/status without the token: %d, want 401 (GD2FS_TOKEN_FILE not taken?)", resp.StatusCode)
	}
}
