package server

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/wire"
)

func (s *Server) track(c net.Conn, on bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		if s.closed {
			return false
		}
		s.conns[c] = struct{}{}
	} else {
		delete(s.conns, c)
	}
	return true
}

// route sniffs the first bytes: a gd2fs frame starts with the magic, anything
// else is handed to the HTTP server.
func (s *Server) route(nc net.Conn, release func()) {
	defer s.wg.Done()
	if s.cfg.TLS != nil {
		nc = tls.Server(nc, s.cfg.TLS) // the handshake runs in Peek, under the hello deadline
	}
	br := bufio.NewReaderSize(nc, 256<<10)
	// The hello deadline covers the TLS handshake, the sniff and the hello
	// frame: a connection that sends only the magic is closed after it.
	nc.SetReadDeadline(time.Now().Add(s.cfg.HelloTimeout))
	head, err := br.Peek(4)
	if err != nil {
		nc.Close()
		release()
		return
	}
	if string(head) != "GD2F" {
		nc.SetReadDeadline(time.Time{}) // the HTTP server sets its own
		s.httpLn.deliver(&peekedConn{Conn: nc, r: br, release: release})
		return
	}
	defer release()
	if !s.track(nc, true) {
		nc.Close()
		return
	}
	defer s.track(nc, false)
	s.serveData(nc, br)
}

const maxInflight = 16 // per connection; bounds pooled payload memory

type dataConn struct {
	s   *Server
	nc  net.Conn
	wmu sync.Mutex
	sem chan struct{}  // requests in flight
	wg  sync.WaitGroup // their handlers

	dmu     sync.Mutex // orders read-deadline changes (deadline.go)
	waiting bool       // the reader waits for a frame header
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)
}

// done answers h with err's status (or OK) and records metrics.
func (dc *dataConn) done(h wire.Header, start time.Time, err error) {
	dc.s.metrics.observe(h.Op, start, err)
	dc.reply(h, err)
}

func (dc *dataConn) reply(h wire.Header, err error) {
	if err == nil {
		dc.send(h, wire.StatusOK, nil, 0)
		return
	}
	var payload [][]byte
	if msg := err.Error(); msg != "" {
		payload = [][]byte{[]byte(msg)}
	}
	dc.send(h, wire.StatusOf(err), payload, 0)
}

// send writes one response frame, gathering bufs with writev.
func (dc *dataConn) send(req wire.Header, st wire.Status, bufs [][]byte, flags uint16) error {
	return dc.sendCRC(req, st, bufs, flags, crc32c.Checksum(bufs...))
}

// sendCRC is send for a payload whose CRC32C is already known.
func (dc *dataConn) sendCRC(req wire.Header, st wire.Status, bufs [][]byte, flags uint16, crc uint32) error {
	h := wire.Header{Op: req.Op, ReqID: req.ReqID, Status: st, Flags: flags | wire.FlagResponse, Offset: req.Offset, Count: req.Count}
	var n int
	for _, b := range bufs {
		n += len(b)
	}
	h.PayloadLen = uint32(n)
	h.PayloadCRC = crc
	var hb [wire.HeaderSize]byte
	out := make(net.Buffers, 0, 1+len(bufs))
	out = append(out, wire.Encode(hb[:], &h, nil))
	out = append(out, bufs...)
	dc.wmu.Lock()
	defer dc.wmu.Unlock()
	dc.nc.SetWriteDeadline(time.Now().Add(60 * time.Second))
	_, err := out.WriteTo(dc.nc)
	if err != nil {
		dc.nc.Close() // a partial frame: the client must reconnect
	}
	return err
}
