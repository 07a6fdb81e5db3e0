package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"
)

// Problems lists what is wrong with the certificates a listener serves, at
// now: expired, not yet valid, or expiring within a week. A node that
// serves an expired certificate fails every handshake; it must say so when
// it starts, not only in each client's error (issue 22 finding 16).
func Problems(cfg *tls.Config, now time.Time) []string {
	if cfg == nil {
		return nil
	}
	var out []string
	for _, c := range cfg.Certificates {
		leaf := c.Leaf
		if leaf == nil && len(c.Certificate) > 0 {
			var err error
			if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
				out = append(out, fmt.Sprintf("certificate cannot be parsed: %v", err))
				continue
			}
		}
		if leaf == nil {
			continue
		}
		name := leaf.Subject.CommonName
		switch {
		case now.After(leaf.NotAfter):
			out = append(out, fmt.Sprintf("certificate %q expired on %s: every client will refuse it; renew it (--tls-cert)", name, leaf.NotAfter.UTC().Format(time.RFC3339)))
		case now.Before(leaf.NotBefore):
			out = append(out, fmt.Sprintf("certificate %q is not valid before %s (is this machine's clock right?)", name, leaf.NotBefore.UTC().Format(time.RFC3339)))
		case leaf.NotAfter.Sub(now) < 7*24*time.Hour:
			out = append(out, fmt.Sprintf("certificate %q expires on %s: renew it soon", name, leaf.NotAfter.UTC().Format(time.RFC3339)))
		}
	}
	return out
}
