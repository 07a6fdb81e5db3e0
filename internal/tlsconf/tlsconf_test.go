package tlsconf

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFlagErrors(t *testing.T) {
	dir := t.TempDir()
	fs, err := TestCA(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	f := fs["server"]
	if cfg, err := (Files{}).Server(); cfg != nil || err != nil {
		t.Fatalf("no files: server %v, %v; want plain TCP", cfg, err)
	}
	if cfg, err := (Files{}).Client(); cfg != nil || err != nil {
		t.Fatalf("no files: client %v, %v; want plain TCP", cfg, err)
	}
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		f      Files
		client bool
		want   string
	}{
		"cert without key":          {Files{Cert: f.Cert}, false, "go together"},
		"key without cert (client)": {Files{Key: f.Key, CA: f.CA}, true, "go together"},
		"verify without cert":       {Files{VerifyClients: true, CA: f.CA}, false, "needs --tls-cert"},
		"verify without CA":         {Files{Cert: f.Cert, Key: f.Key, VerifyClients: true}, false, "needs --tls-ca"},
		"CA missing":                {Files{CA: filepath.Join(dir, "none.pem")}, true, "--tls-ca"},
		"CA not PEM":                {Files{CA: notPEM}, true, "no PEM certificate"},
		"key not PEM":               {Files{Cert: f.Cert, Key: notPEM}, false, "--tls-cert/--tls-key"},
	} {
		var err error
		if tc.client {
			_, err = tc.f.Client()
		} else {
			_, err = tc.f.Server()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
}

// handshake runs a TLS handshake over loopback and reports each side's error.
func handshake(t *testing.T, srv, cli *tls.Config) (serr, cerr error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		tc := tls.Server(c, srv)
		if err := tc.Handshake(); err != nil {
			done <- err
			return
		}
		// TLS 1.3 clients finish before the server has checked their
		// certificate: a read shows the server's verdict to both.
		_, err = tc.Write([]byte("x"))
		done <- err
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := cli.Clone()
	cfg.ServerName = "127.0.0.1"
	tc := tls.Client(c, cfg)
	cerr = tc.Handshake()
	if cerr == nil {
		_, cerr = io.ReadFull(tc, make([]byte, 1))
	}
	c.Close()
	return <-done, cerr
}

func TestHandshakes(t *testing.T) {
	fs, err := TestCA(t.TempDir(), "server", "client")
	if err != nil {
		t.Fatal(err)
	}
	other, err := TestCA(t.TempDir(), "stranger")
	if err != nil {
		t.Fatal(err)
	}
	must := func(c *tls.Config, err error) *tls.Config {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	srv := must(fs["server"].Server())
	if srv.MinVersion != tls.VersionTLS12 {
		t.Fatalf("server minimum version %x, want TLS 1.2", srv.MinVersion)
	}
	trusting := must(Files{CA: fs["server"].CA}.Client())
	if s, c := handshake(t, srv, trusting); s != nil || c != nil {
		t.Fatalf("one-way TLS: server %v, client %v", s, c)
	}
	// A client that trusts another CA refuses the server.
	if _, c := handshake(t, srv, must(Files{CA: other["stranger"].CA}.Client())); c == nil {
		t.Fatal("a client trusting another CA accepted the server")
	}
	// Mutual TLS: a client certificate from the cluster's CA is required.
	mf := fs["server"]
	mf.VerifyClients = true
	msrv := must(mf.Server())
	if s, c := handshake(t, msrv, must(fs["client"].Client())); s != nil || c != nil {
		t.Fatalf("mutual TLS with a client certificate: server %v, client %v", s, c)
	}
	if s, _ := handshake(t, msrv, trusting); s == nil {
		t.Fatal("mutual TLS accepted a client without a certificate")
	}
	stranger := other["stranger"]
	stranger.CA = fs["server"].CA // trusts the server, but its certificate is from another CA
	if s, _ := handshake(t, msrv, must(stranger.Client())); s == nil {
		t.Fatal("mutual TLS accepted a client certificate from another CA")
	}
}
