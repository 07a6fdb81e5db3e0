package connpool

import (
	"crypto/tls"
	"net"
	"syscall"
)

// Open reports whether a kept connection is still open: a peek at its
// socket that does not wait. The peers of a Conn send nothing between
// answers, so an end of stream (the peer closed the connection: idle,
// restart, failover) or any byte (a TLS close_notify) means the connection
// is done. A call on such a connection would fail after it was written,
// and one that may not be sent twice could then not be retried.
func Open(nc net.Conn) bool {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true // a dialer's own connection type: found out by the call
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true // never wait
	})
	return err == nil && alive
}

// Peeks says Open can tell a connection the peer closed.
const Peeks = true
