package resp_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestHTTPToRESPClosed: an HTTP request sent to the RESP port (a web page's
// cross-origin POST) is not run: the connection closes at its first line,
// and the SET in its body never happens (issue 22 finding 3; Redis does
// the same for "POST" and "Host:").
func TestHTTPToRESPClosed(t *testing.T) {
	c := startCluster(t, 1, "")
	addr := c.RESP[0].Addr()
	for _, req := range []string{
		"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: 20\r\n\r\nSET pwned yes\r\nQUIT\r\n",
		"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nSET pwned yes\r\n",
		"host: x\r\nSET pwned yes\r\n",
	} {
		r := dial(t, addr)
		r.send([]byte(req))
		r.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(r.nc)
		if err != nil {
			t.Fatalf("%q: the connection stayed open: %v (%q)", req[:16], err, b)
		}
		if strings.Contains(string(b), "+OK") {
			t.Fatalf("%q: a command ran: %q", req[:16], b)
		}
	}
	// The same with a real HTTP client.
	resp, err := http.Post("http://"+addr+"/", "text/plain", strings.NewReader("SET pwned yes\r\n"))
	if err == nil {
		resp.Body.Close()
	}
	r := dial(t, addr)
	eq(t, "the key was never set", r.do("GET", "pwned"), "$-1\r\n")
	// A value that looks like an HTTP version is still just a value.
	eq(t, "SET", r.do("SET", "k", "/", "HTTP/1.1"), "-ERR syntax error\r\n")
	eq(t, "SET value", r.do("SET", "HTTP/1.1", "HTTP/1.1"), "+OK\r\n")
}

// TestAuthGuessesThrottled: one connection cannot try AUTH passwords at
// full speed: past a burst every AUTH is refused unchecked, the right one
// included, until the budget refills (issue 22 finding 14).
func TestAuthGuessesThrottled(t *testing.T) {
	c := startCluster(t, 1, "tok")
	r := dial(t, c.RESP[0].Addr())
	for i := range 30 {
		if got := r.do("AUTH", fmt.Sprint("guess-", i)); !strings.HasPrefix(got, "-WRONGPASS") {
			t.Fatalf("wrong password %d: %q", i, got)
		}
	}
	if got := r.do("AUTH", "tok"); strings.HasPrefix(got, "+OK") {
		t.Fatal("the right password was checked right after 30 wrong ones from the same address")
	}
}
