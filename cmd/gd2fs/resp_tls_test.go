package main

import (
	"crypto/tls"
	"strings"
	"testing"
)

// TestRESPRefusesPlaintextInTLSCluster: a RESP door of a TLS cluster with
// no certificate of its own does not start in clear unless asked (issue 22
// finding 8); with a certificate it serves TLS.
func TestRESPRefusesPlaintextInTLSCluster(t *testing.T) {
	g := &globals{clientTLS: &tls.Config{}}
	if _, err := respTLS(g, false); err == nil || !strings.Contains(err.Error(), "--resp-plaintext") {
		t.Fatalf("no certificate in a TLS cluster: %v", err)
	}
	if c, err := respTLS(g, true); err != nil || c != nil {
		t.Fatalf("--resp-plaintext: %v %v", c, err)
	}
	g.serverTLS = &tls.Config{}
	if c, err := respTLS(g, false); err != nil || c != g.serverTLS {
		t.Fatalf("with a certificate: %v %v", c, err)
	}
	if c, err := respTLS(&globals{}, false); err != nil || c != nil {
		t.Fatalf("a plain cluster: %v %v", c, err)
	}
}
