package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/tcp"
)

// TestHTTPConnsFirstOut: HTTP keep-alive connections (which never say
// hello) filling the port do not lock out a client's hello, and idle at
// most HelloTimeout (issue 22 finding 4).
func TestHTTPConnsFirstOut(t *testing.T) {
	s, _ := startLimited(t, Config{MaxConns: 4, HelloTimeout: 2 * time.Second})
	var held []net.Conn
	for range 6 {
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		held = append(held, c)
	}
	// The last one was served: it took an older one's place.
	if line, err := bufio.NewReader(held[5]).ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("HTTP on a full port: %q %v", line, err)
	}
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("a hello behind idle HTTP connections: %v", err)
	}
	// An idle keep-alive connection is closed after HelloTimeout, not
	// IdleTimeout (5 minutes).
	c := held[5]
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("an idle HTTP connection outlived HelloTimeout")
	}
}

// TestHelloGuessesThrottled: past a burst of hellos with a wrong token an
// address is refused without its token being checked (issue 22 finding 14).
func TestHelloGuessesThrottled(t *testing.T) {
	s, _ := startLimited(t, Config{Token: "right"})
	ctx := context.Background()
	for i := range 30 {
		if c, err := tcp.Dial(ctx, s.Addr(), tcp.Options{Name: "guess", Token: fmt.Sprint("guess-", i)}, ""); err == nil {
			c.Close()
			t.Fatalf("guess %d accepted", i)
		}
	}
	c, err := tcp.Dial(ctx, s.Addr(), tcp.Options{Name: "right", Token: "right"}, "")
	if err == nil {
		c.Close()
		t.Fatal("the right token was checked right after 30 wrong ones from the same address")
	}
	if !strings.Contains(err.Error(), "too many") {
		t.Fatalf("throttled hello: %v", err)
	}
}

// TestDebugNeedsToken: --debug's pprof and GC endpoints on the data port
// answer only the cluster token (issue 22 finding 17).
func TestDebugNeedsToken(t *testing.T) {
	s, _ := startLimited(t, Config{Token: "right", Debug: true})
	for _, c := range []struct {
		auth string
		code int
	}{{"", 401}, {"Bearer wrong", 401}, {"Bearer right", 200}} {
		req, _ := http.NewRequest("GET", "http://"+s.Addr()+"/debug/pprof/", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Fatalf("pprof with %q: %d, want %d", c.auth, resp.StatusCode, c.code)
		}
	}
}
