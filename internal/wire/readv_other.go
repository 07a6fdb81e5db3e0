//go:build !linux

package wire

import (
	"io"
	"syscall"
)

// rawConn: elsewhere than Linux, payloads are read one view at a time.
func rawConn(io.Reader) syscall.RawConn { return nil }

type readvState struct{}

func (r *Reader) readv(syscall.RawConn, [][]byte) (int, error) {
	return 0, io.ErrUnexpectedEOF // not reached: rawConn is nil
}
