// Package tlsconf turns the --tls-cert, --tls-key, --tls-ca and
// --tls-verify-clients flags into crypto/tls configurations for the two
// sides of every gd2fs connection: the master's HTTP API and the data
// servers' port (server side), and clients, servers dialling peers and the
// master (client side). TLS 1.2 is the minimum; Go's defaults pick
// AES-GCM or ChaCha20-Poly1305 suites.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files names PEM files.
type Files struct {
	Cert, Key string // this process's certificate and key
	CA        string // CA bundle that signed the peers' certificates; "": system roots
	// VerifyClients makes the server side require a client certificate
	// signed by CA (mutual TLS).
	VerifyClients bool
}

// Enabled reports whether any TLS file is given.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

func (f Files) pool() (*x509.CertPool, error) {
	if f.CA == "" {
		return nil, nil
	}
	b, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", f.CA)
	}
	return p, nil
}

func (f Files) cert() ([]tls.Certificate, error) {
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if f.Cert == "" {
		return nil, nil
	}
	c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	return []tls.Certificate{c}, nil
}

// Server is the configuration of a listening side, nil when no certificate
// is given (plain TCP).
func (f Files) Server() (*tls.Config, error) {
	certs, err := f.cert()
	if err != nil || certs == nil {
		if err == nil && f.VerifyClients {
			err = errors.New("--tls-verify-clients needs --tls-cert and --tls-key")
		}
		return nil, err
	}
	cfg := &tls.Config{Certificates: certs, MinVersion: tls.VersionTLS12}
	if f.VerifyClients {
		if f.CA == "" {
			return nil, errors.New("--tls-verify-clients needs --tls-ca: the CA that signs client certificates")
		}
		if cfg.ClientCAs, err = f.pool(); err != nil {
			return nil, err
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client is the configuration of a dialling side: it trusts CA (or the
// system roots) and presents the certificate when one is given. nil when no
// TLS file is given.
func (f Files) Client() (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	certs, err := f.cert()
	if err != nil {
		return nil, err
	}
	roots, err := f.pool()
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: certs, RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}
