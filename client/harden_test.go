package client_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/tcp"
	"github.com/gd2fs/gd2fs/internal/tlsconf"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// tlsFiles makes a CA and certificates for "node" and "client" in a temp dir.
func tlsFiles(t *testing.T) map[string]tlsconf.Files {
	t.Helper()
	fs, err := tlsconf.TestCA(t.TempDir(), "node", "client")
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func mustTLS(t *testing.T, f func() (*tls.Config, error)) *tls.Config {
	t.Helper()
	c, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTLSCluster: master API and data plane over TLS; a file and a KV block
// round-trip, and a plain-TCP client gets nothing.
func TestTLSCluster(t *testing.T) {
	files := tlsFiles(t)
	node := files["node"]
	c := start(t, cluster.Config{TLS: mustTLS(t, node.Server), ClientTLS: mustTLS(t, node.Client), KVMemBytes: 16 << 20, Token: "tok"})
	if !strings.HasPrefix(c.Master.URL(), "https://") {
		t.Fatalf("master URL %s", c.Master.URL())
	}
	// A client trusting only the CA, without a certificate.
	cf := files["client"]
	cf.Cert, cf.Key = "", ""
	cl, err := client.New(client.Config{Master: c.Master.URL(), Token: "tok", TLS: mustTLS(t, cf.Client)})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	data := rnd(3<<20+5, 1)
	writeFile(t, cl, "/tls/a", "ha", data)
	if got, err := readFile(t, cl, "/tls/a"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read over TLS: %v", err)
	}
	ctx := context.Background()
	if err := cl.KV("ha").Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := cl.KV("ha").Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("KV over TLS: %q %v", v, err)
	}
	// Plain HTTP to the master, and plain TCP to a server, get nothing.
	if resp, err := http.Get(strings.Replace(c.Master.URL(), "https://", "http://", 1) + "/v1/status"); err == nil && resp.StatusCode == 200 {
		t.Fatal("master answered plain HTTP")
	}
	p := tcp.NewPool(tcp.Options{Token: "tok"})
	defer p.Close()
	if err := p.ReadChunk(ctx, c.Servers[0].Addr(), 1, 0, make([]byte, 1)); err == nil || !errors.Is(err, errs.ErrUnavailable) && !strings.Contains(err.Error(), "handshake") {
		t.Fatalf("plain TCP to a TLS server: %v", err)
	}
	// A client that does not trust the cluster's CA is refused.
	untrusting, _ := client.New(client.Config{Master: c.Master.URL(), Token: "tok"})
	defer untrusting.Close()
	if _, err := untrusting.Stat(ctx, "/tls/a"); err == nil {
		t.Fatal("a client without the CA talked to the master")
	}
}

// TestMutualTLS: with client certificates required, a client without one is
// refused by the master and by the data servers; one with a certificate of
// the cluster's CA works.
func TestMutualTLS(t *testing.T) {
	files := tlsFiles(t)
	node := files["node"]
	node.VerifyClients = true
	c := start(t, cluster.Config{TLS: mustTLS(t, node.Server), ClientTLS: mustTLS(t, node.Client)})
	good, _ := client.New(client.Config{Master: c.Master.URL(), TLS: mustTLS(t, files["client"].Client)})
	defer good.Close()
	data := rnd(1<<20, 2)
	writeFile(t, good, "/m/a", "ha", data)
	if got, err := readFile(t, good, "/m/a"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read with a client certificate: %v", err)
	}
	anon := files["client"]
	anon.Cert, anon.Key = "", ""
	bad, _ := client.New(client.Config{Master: c.Master.URL(), TLS: mustTLS(t, anon.Client)})
	defer bad.Close()
	ctx := context.Background()
	if _, err := bad.Stat(ctx, "/m/a"); err == nil {
		t.Fatal("master served a client without a certificate")
	}
	p := tcp.NewPool(tcp.Options{TLS: mustTLS(t, anon.Client)})
	defer p.Close()
	if err := p.ReadChunk(ctx, c.Servers[0].Addr(), 1, 0, make([]byte, 1)); err == nil {
		t.Fatal("data server served a client without a certificate")
	}
}

// TestDataFilesPrivate: metadata, chunk files and KV segments, and their
// folders, are readable by their owner only.
func TestDataFilesPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	c := start(t, cluster.Config{Dir: dir, KVMemBytes: 1 << 20, KVDiskBytes: 64 << 20})
	cl := c.Client()
	defer cl.Close()
	writeFile(t, cl, "/p", "ha", rnd(2<<20, 3))
	ctx := context.Background()
	for i := range 20 { // enough to spill some to the disk tier
		if err := cl.KV("perf").Put(ctx, "key"+strings.Repeat("x", i), rnd(128<<10, uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	kinds := map[string]int{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, _ := d.Info()
		if info.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s is %v: readable by others", p, info.Mode().Perm())
		}
		switch {
		case strings.HasSuffix(p, ".chunk"):
			kinds["chunk"]++
		case strings.HasSuffix(p, "meta.db"):
			kinds["meta"]++
		case strings.Contains(p, string(filepath.Separator)+"kv"+string(filepath.Separator)) && !d.IsDir():
			kinds["kv"]++
		}
		return nil
	})
	if kinds["chunk"] == 0 || kinds["meta"] == 0 {
		t.Fatalf("found %v: test does not see the files it checks", kinds)
	}
}

// TestKVKeyLimits: the same key rules through the SDK and the raw protocol:
// 1 to 1024 bytes whatever the pool, NUL allowed, empty refused.
func TestKVKeyLimits(t *testing.T) {
	c := start(t, cluster.Config{KVMemBytes: 16 << 20})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	for _, pool := range []string{"perf", "ha"} {
		for _, n := range []int{1, 1020, limits.MaxKVKey} {
			key := strings.Repeat("k", n)
			if err := cl.KV(pool).Put(ctx, key, []byte("v")); err != nil {
				t.Fatalf("%s: key of %d bytes: %v", pool, n, err)
			}
		}
		if err := cl.KV(pool).Put(ctx, strings.Repeat("k", limits.MaxKVKey+1), []byte("v")); !errors.Is(err, errs.ErrTooLarge) {
			t.Fatalf("oversize key: %v", err)
		}
		if err := cl.KV(pool).Put(ctx, "a\x00b", []byte("v")); err != nil {
			t.Fatalf("NUL key: %v", err)
		}
	}
	p := tcp.NewPool(tcp.Options{})
	defer p.Close()
	for _, s := range c.Servers {
		if _, err := p.KVPut(ctx, s.Addr(), wire.KVRef{Pool: "perf", Key: nil}, 0, []byte("v"), false, 0); !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("raw put of an empty key: %v", err)
		}
		if _, err := p.KVPut(ctx, s.Addr(), wire.KVRef{Pool: "pe\x00rf", Key: []byte("x")}, 0, []byte("v"), false, 0); err == nil {
			t.Fatal("raw put into a pool named with NUL")
		}
	}
}

type tlsPair struct{ server, client *tls.Config }

// tlsconfTestCA makes node certificates and returns the server and client
// sides of them.
func tlsconfTestCA(dir string) (tlsPair, error) {
	fs, err := tlsconf.TestCA(dir, "node")
	if err != nil {
		return tlsPair{}, err
	}
	s, err := fs["node"].Server()
	if err != nil {
		return tlsPair{}, err
	}
	c, err := fs["node"].Client()
	return tlsPair{s, c}, err
}
