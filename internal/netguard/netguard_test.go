package netguard

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestLimit: past Max open connections a new one is closed at once; closing
// one makes room again.
func TestLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, 2, nil)
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := dial(), dial()
	sa, sb := <-accepted, <-accepted
	c := dial()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("third connection: %v, want it closed by the server", err)
	}
	if l.Rejected.Load() != 1 || l.Open() != 2 {
		t.Fatalf("rejected %d open %d", l.Rejected.Load(), l.Open())
	}
	sa.Close()
	a.Close()
	d := dial()
	sd := <-accepted
	if _, err := d.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(sd, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	for _, x := range []net.Conn{b, sb, c, d, sd} {
		x.Close()
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
