package server

import (
	"bufio"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
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
	sem chan struct{} // requests in flight

	dmu     sync.Mutex // orders read-deadline changes (deadline.go)
	waiting bool       // the reader waits for a frame header
}

func (s *Server) serveData(nc net.Conn, br *bufio.Reader) {
	dc := &dataConn{s: s, nc: nc, sem: make(chan struct{}, maxInflight)}
	r := wire.NewReader(br, wire.DefaultLimits)
	defer nc.Close()
	s.metrics.conns.Inc()
	defer s.metrics.conns.Dec()

	// The first frame must be a valid handshake.
	h, key, err := r.Next()
	if err != nil {
		dc.reply(h, err)
		return
	}
	if h.Op != wire.OpHello {
		dc.reply(h, errs.New(errs.ErrUnauthorized, "first frame must be a hello handshake, got %v", h.Op))
		return
	}
	if h.PayloadLen > 4096 {
		dc.reply(h, errs.New(errs.ErrTooLarge, "hello with a %d-byte token", h.PayloadLen))
		return
	}
	s.log.Debug("client connected", "name", string(key), "remote", nc.RemoteAddr())
	tok := make([]byte, h.PayloadLen)
	if _, err := r.ReadPayload(tok, h.PayloadCRC); err != nil {
		dc.reply(h, err)
		return
	}
	if s.cfg.Token != "" && subtle.ConstantTimeCompare(tok, []byte(s.cfg.Token)) != 1 {
		s.metrics.errors.WithLabelValues("hello", "unauthorized").Inc()
		dc.reply(h, errs.New(errs.ErrUnauthorized, "wrong cluster token: pass the cluster's token (--token or GD2FS_TOKEN)"))
		return
	}
	dc.send(h, wire.StatusOK, [][]byte{[]byte(s.cfg.ID)}, 0)

	sem := dc.sem
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		dc.awaitHeader()
		h, key, err := r.Next()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return // idle past IdleTimeout, or a header that stalled
			}
			if !isEOF(err) {
				// A frame we cannot parse leaves the stream unusable: say
				// why, then close this connection only.
				s.metrics.errors.WithLabelValues(h.Op.String(), wire.StatusOf(err).String()).Inc()
				dc.reply(h, err)
			}
			return
		}
		start := time.Now()
		dc.awaitPayload()
		// Consume the payload here, in stream order: data payloads into
		// pooled buffers, small control payloads into a slice, the rest is
		// skipped. A bad CRC or an oversize control payload fails only this
		// request; any other error broke the stream.
		var bp *[]byte
		var body []byte
		if h.Op == wire.OpWrite {
			// Zero copy when the chunk's DRAM pages can take the bytes as
			// they arrive (new bytes of a cached chunk).
			if ref, perr := wire.ParseChunkRef(key); perr == nil {
				if dst, pw, ok := s.store.BeginWrite(ref.ID, int64(h.Offset), int(h.PayloadLen)); ok {
					if err := r.ReadPayloadInto(dst); err != nil {
						pw.Abort()
						return // the stream broke mid-payload
					}
					s.metrics.bytesIn.Add(float64(h.PayloadLen))
					sem <- struct{}{}
					wg.Add(1)
					go func() {
						defer func() { <-sem; dc.finished(); wg.Done() }()
						dc.done(h, start, s.writeDirect(ref, int64(h.Offset), pw, h.PayloadCRC, h.Flags))
					}()
					continue
				}
			}
		}
		switch h.Op {
		case wire.OpWrite:
			// The chunk store checks the CRC in the pass that computes its
			// block CRCs (store.WriteChecked).
			bp = bufpool.Get(int(h.PayloadLen))
			_, err = r.ReadPayloadUnchecked(*bp)
			body = *bp
			s.metrics.bytesIn.Add(float64(h.PayloadLen))
		case wire.OpKVPut:
			bp = bufpool.Get(int(h.PayloadLen))
			_, err = r.ReadPayload(*bp, h.PayloadCRC)
			body = *bp
			s.metrics.bytesIn.Add(float64(h.PayloadLen))
		case wire.OpCopy:
			if h.PayloadLen > 4096 {
				if err = r.Discard(); err == nil {
					err = errs.New(errs.ErrTooLarge, "%v payload of %d bytes", h.Op, h.PayloadLen)
				}
				break
			}
			body = make([]byte, h.PayloadLen)
			_, err = r.ReadPayload(body, h.PayloadCRC)
		default:
			err = r.Discard()
		}
		if err != nil {
			if bp != nil {
				bufpool.Put(bp)
			}
			if !errors.Is(err, errs.ErrChecksum) && !errors.Is(err, errs.ErrTooLarge) {
				return
			}
			dc.done(h, start, err)
			continue
		}
		key = append([]byte(nil), key...) // the reader reuses its key buffer
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() {
				if bp != nil {
					bufpool.Put(bp)
				}
				<-sem
				dc.finished()
				wg.Done()
			}()
			s.handle(dc, h, key, body, start)
		}()
	}
}

// handle serves one request whose payload has been read.
func (s *Server) handle(dc *dataConn, h wire.Header, key, body []byte, start time.Time) {
	switch h.Op {
	case wire.OpWrite, wire.OpRead, wire.OpStat, wire.OpSeal, wire.OpDelete, wire.OpCopy:
		ref, err := wire.ParseChunkRef(key)
		if err != nil {
			dc.done(h, start, err)
			return
		}
		switch h.Op {
		case wire.OpWrite:
			dc.done(h, start, s.write(ref, int64(h.Offset), body, h.PayloadCRC, h.Flags))
		case wire.OpRead:
			s.read(dc, h, ref.ID, start)
		default:
			s.control(dc, h, ref.ID, body, start)
		}
	case wire.OpReadCold:
		ref, err := wire.ParseColdRef(key)
		if err != nil {
			dc.done(h, start, err)
			return
		}
		s.readCold(dc, h, ref, start)
	case wire.OpKVPut, wire.OpKVGet, wire.OpKVExists, wire.OpKVDelete, wire.OpKVScan:
		ref, err := wire.ParseKVRef(key)
		if err != nil {
			dc.done(h, start, err)
			return
		}
		if h.Op == wire.OpKVScan {
			s.kvScan(dc, h, ref, start)
			return
		}
		if h.Op != wire.OpKVPut {
			s.kvOp(dc, h, ref, start)
			return
		}
		existed, err := s.kvPut(ref, int64(h.Offset), h.Flags&wire.FlagOverwrite != 0, body, h.PayloadCRC)
		if err == nil && existed {
			s.metrics.observe(h.Op, start, nil)
			dc.send(h, wire.StatusOK, nil, wire.FlagExisted)
			return
		}
		dc.done(h, start, err)
	case wire.OpPing:
		dc.done(h, start, nil)
	default:
		dc.done(h, start, errs.New(errs.ErrUnknownOp, "unknown opcode %d: this server speaks protocol version %d", h.Op, wire.Version))
	}
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
	return dc.sendCRC(req, st, bufs, flags, wire.Checksum(bufs...))
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
