package wire

import (
	"io"
	"syscall"

	"golang.org/x/sys/unix"
)

// rawConn is the connection under a Reader when it is a socket (a
// *net.TCPConn): its payloads are read into several views per system call.
func rawConn(src io.Reader) syscall.RawConn {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// readvState is one readv(2) of a Reader, kept in the Reader so that the
// function handed to RawConn.Read is made once per connection, not once
// per call.
type readvState struct {
	iovs [][]byte
	n    int
	err  error
	fn   func(fd uintptr) bool
}

// readv fills iovs with one readv(2) on rc, waiting in the runtime's
// network poller while the socket has nothing: what a net.Conn Read does,
// for many buffers. It returns io.EOF when the peer closed the stream.
func (r *Reader) readv(rc syscall.RawConn, iovs [][]byte) (int, error) {
	st := &r.rv
	if st.fn == nil {
		st.fn = func(fd uintptr) bool {
			for {
				st.n, st.err = unix.Readv(int(fd), st.iovs)
				if st.err != unix.EINTR {
					return st.err != unix.EAGAIN
				}
			}
		}
	}
	st.iovs = iovs
	err := rc.Read(st.fn)
	st.iovs = nil
	if err == nil {
		err = st.err
	}
	if err != nil {
		return 0, err
	}
	if st.n == 0 {
		return 0, io.EOF
	}
	return st.n, nil
}
