package resp_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/tlsconf"
)

// TestRESPOverTLS: in a cluster with mutual TLS the RESP door speaks TLS
// only: redis-cli --tls with a client certificate sets and gets; plain TCP
// (the token in clear) and TLS without a certificate are refused (issue 22
// finding 8).
func TestRESPOverTLS(t *testing.T) {
	cli := need(t, "/usr/bin/redis-cli", "redis-tools")
	files, err := tlsconf.TestCA(t.TempDir(), "node", "client")
	if err != nil {
		t.Fatal(err)
	}
	node := files["node"]
	node.VerifyClients = true
	stls, err := node.Server()
	if err != nil {
		t.Fatal(err)
	}
	ctls, err := node.Client()
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: t.TempDir(), Servers: 1, MemBytes: 8 << 20,
		KVMemBytes: 64 << 20, Token: "tok", RESP: true, TLS: stls, ClientTLS: ctls})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	host, port, _ := strings.Cut(c.RESP[0].Addr(), ":")
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, cli, append([]string{"-h", host, "-p", port, "--no-auth-warning"}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	cl := files["client"]
	withCert := []string{"--tls", "--cacert", cl.CA, "--cert", cl.Cert, "--key", cl.Key, "-a", "tok"}
	if out, err := run(append(withCert, "SET", "k", "v")...); err != nil || out != "OK" {
		t.Fatalf("redis-cli --tls SET: %q %v", out, err)
	}
	if out, err := run(append(withCert, "GET", "k")...); err != nil || out != "v" {
		t.Fatalf("redis-cli --tls GET: %q %v", out, err)
	}
	// Plain TCP: the token would cross in clear; nothing is answered.
	if out, _ := run("-a", "tok", "SET", "k", "plain"); strings.Contains(out, "OK") {
		t.Fatalf("a plaintext client was served: %q", out)
	}
	// TLS without a client certificate.
	if out, _ := run("--tls", "--cacert", cl.CA, "-a", "tok", "SET", "k", "nocert"); strings.Contains(out, "OK") {
		t.Fatalf("a client without a certificate was served: %q", out)
	}
	if out, err := run(append(withCert, "GET", "k")...); err != nil || out != "v" {
		t.Fatalf("after the refusals GET k: %q %v", out, err)
	}
	// redis-py with ssl=True.
	out := python(t, `
import os, redis
r = redis.Redis(host=os.environ["H"], port=int(os.environ["P"]), password="tok", ssl=True,
                ssl_ca_certs=os.environ["CA"], ssl_certfile=os.environ["CERT"], ssl_keyfile=os.environ["KEY"])
r.set("py", b"\x00\xffbytes")
print(r.get("py") == b"\x00\xffbytes", r.get("k"))
`, "H="+host, "P="+port, "CA="+cl.CA, "CERT="+cl.Cert, "KEY="+cl.Key)
	if strings.TrimSpace(out) != "True b'v'" {
		t.Fatalf("redis-py ssl=True: %q", out)
	}
}
