package server

import (
	"bufio"
	"net"
	"sync"
)

// chanListener is a net.Listener fed by the data listener's router with the
// connections that turned out to speak HTTP.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) deliver(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// peekedConn replays the bytes the router peeked at, and gives its slot of
// the connection limit back on Close.
type peekedConn struct {
	net.Conn
	r       *bufio.Reader
	release func()
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *peekedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
