package resp

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"time"
)

// writer encodes replies in RESP2 or RESP3 into a buffer that is flushed
// when the client has no more pipelined requests waiting (or it fills up),
// so a pipeline of small replies costs one write.
type writer struct {
	nc    net.Conn
	bw    *bufio.Writer
	proto int // 2 or 3
}

const writeTimeout = 60 * time.Second

func newWriter(nc net.Conn) *writer {
	return &writer{nc: nc, bw: bufio.NewWriterSize(nc, 64<<10), proto: 2}
}

func (w *writer) flush() error {
	if w.bw.Buffered() == 0 {
		return nil
	}
	w.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	return w.bw.Flush()
}

func (w *writer) header(kind byte, n int64) {
	var b [24]byte
	out := append(b[:0], kind)
	out = strconv.AppendInt(out, n, 10)
	out = append(out, '\r', '\n')
	w.bw.Write(out)
}

func (w *writer) simple(s string) {
	w.bw.WriteByte('+')
	w.bw.WriteString(s)
	w.bw.WriteString("\r\n")
}

// errorf writes an error reply; msg starts with its code ("ERR ...").
// Line breaks in it (from a client's own arguments) become spaces, so a
// reply can never end early and desynchronise the client.
func (w *writer) error(msg string) {
	msg = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, msg)
	w.bw.WriteByte('-')
	w.bw.WriteString(msg)
	w.bw.WriteString("\r\n")
}

func (w *writer) int(n int64) { w.header(':', n) }

func (w *writer) bulk(b []byte) {
	w.header('$', int64(len(b)))
	w.bw.Write(b)
	w.bw.WriteString("\r\n")
}

func (w *writer) bulkString(s string) {
	w.header('$', int64(len(s)))
	w.bw.WriteString(s)
	w.bw.WriteString("\r\n")
}

// bulkViews writes a bulk string whose bytes are in several buffers (DRAM
// pages of the store). Small values go through the buffer; a large one goes
// out with one writev of its header, the pages themselves (never copied)
// and the CRLF, after any buffered replies ahead of it.
func (w *writer) bulkViews(bufs [][]byte, n int) error {
	if n < 32<<10 {
		w.header('$', int64(n))
		for _, b := range bufs {
			w.bw.Write(b)
		}
		w.bw.WriteString("\r\n")
		return nil
	}
	if err := w.flush(); err != nil {
		return err
	}
	var hb [24]byte
	hdr := append(hb[:0], '$')
	hdr = strconv.AppendInt(hdr, int64(n), 10)
	hdr = append(hdr, '\r', '\n')
	out := make(net.Buffers, 0, len(bufs)+2)
	out = append(out, hdr)
	out = append(out, bufs...)
	out = append(out, crlf)
	w.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := out.WriteTo(w.nc)
	return err
}

var crlf = []byte("\r\n")

// null is a missing value: "_" in RESP3, "$-1" in RESP2.
func (w *writer) null() {
	if w.proto == 3 {
		w.bw.WriteString("_\r\n")
		return
	}
	w.bw.WriteString("$-1\r\n")
}

// nullArray is an absent array: "_" in RESP3, "*-1" in RESP2.
func (w *writer) array(n int) { w.header('*', int64(n)) }

// mapHeader starts a map of n pairs: "%n" in RESP3, a flat array of 2n in RESP2.
func (w *writer) mapHeader(n int) {
	if w.proto == 3 {
		w.header('%', int64(n))
		return
	}
	w.header('*', int64(2*n))
}

// setHeader starts a set: "~n" in RESP3, an array in RESP2.
func (w *writer) setHeader(n int) {
	if w.proto == 3 {
		w.header('~', int64(n))
		return
	}
	w.header('*', int64(n))
}
