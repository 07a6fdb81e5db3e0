package server

import (
	"bufio"
	"crypto/subtle"
	"errors"
	"github.com/gd2fs/gd2fs/internal/authlimit"
	"net"
	"os"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// serveData serves one data-plane connection: the hello, then frames read
// in stream order, each dispatched once (dispatch) to a handler that runs
// beside the reader, at most maxInflight at a time.
func (s *Server) serveData(nc net.Conn, br *bufio.Reader) {
	dc := &dataConn{s: s, nc: nc, sem: make(chan struct{}, maxInflight)}
	r := wire.NewBufferedReader(br, nc, wire.DefaultLimits())
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
	host := authlimit.Host(nc.RemoteAddr().String())
	if ok, retry := s.guesses.Allow(host); s.cfg.Token != "" && !ok {
		s.metrics.errors.WithLabelValues("hello", "throttled").Inc()
		dc.reply(h, errs.New(errs.ErrUnauthorized, "too many hellos with a wrong token from %s: wait %s", host, retry.Round(time.Millisecond)))
		return
	}
	if s.cfg.Token != "" && subtle.ConstantTimeCompare(tok, []byte(s.cfg.Token)) != 1 {
		s.guesses.Fail(host)
		s.metrics.errors.WithLabelValues("hello", "unauthorized").Inc()
		dc.reply(h, errs.New(errs.ErrUnauthorized, "wrong cluster token: give the cluster's token with --token-file or GD2FS_TOKEN_FILE (or GD2FS_TOKEN)"))
		return
	}
	s.ln.Authenticated(nc) // no longer first to go when the port is full
	dc.send(h, wire.StatusOK, [][]byte{[]byte(s.cfg.ID)}, 0)

	defer dc.wg.Wait()
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
		dc.awaitPayload()
		if !s.dispatch(dc, r, h, key, time.Now()) {
			return // the stream broke mid-payload
		}
	}
}

// dispatch is the one switch on a frame's opcode: it consumes the frame's
// payload here, in stream order (data payloads into pooled buffers, small
// control payloads into a slice, the rest skipped), parses its key and
// starts its handler. A bad CRC, an oversize control payload or a bad key
// fails only this request; it reports false when the stream is broken.
func (s *Server) dispatch(dc *dataConn, r *wire.Reader, h wire.Header, key []byte, start time.Time) bool {
	switch h.Op {
	case wire.OpWrite:
		ref, perr := wire.ParseChunkRef(key)
		// Zero copy when the chunk's DRAM pages can take the bytes as they
		// arrive (new bytes of a cached chunk).
		if perr == nil {
			if dst, pw, ok := s.store.BeginWrite(ref.ID, int64(h.Offset), int(h.PayloadLen)); ok {
				// Summed as it arrives: Commit checks the CRC from the
				// sums, without a second pass over the pages.
				if err := r.ReadPayloadInto(dst, pw.Sums()); err != nil {
					pw.Abort()
					return false
				}
				s.metrics.bytesIn.Add(float64(h.PayloadLen))
				return dc.start(h, start, nil, nil, func() error {
					return s.writeDirect(ref, int64(h.Offset), pw, h.PayloadCRC, h.Flags)
				})
			}
		}
		// The chunk store checks the CRC in the pass that computes its
		// block CRCs (store.WriteChecked).
		bp := bufpool.Get(int(h.PayloadLen))
		_, err := r.ReadPayloadUnchecked(*bp)
		s.metrics.bytesIn.Add(float64(h.PayloadLen))
		return dc.start(h, start, bp, err, func() error {
			if perr != nil {
				return perr
			}
			return s.write(ref, int64(h.Offset), *bp, h.PayloadCRC, h.Flags)
		})
	case wire.OpRead:
		return dc.chunk(r, h, key, start, func(ref wire.ChunkRef) error { return s.read(dc, h, ref.ID, start) })
	case wire.OpStat:
		return dc.chunk(r, h, key, start, func(ref wire.ChunkRef) error { return s.stat(dc, h, ref.ID, start) })
	case wire.OpExtents:
		return dc.chunk(r, h, key, start, func(ref wire.ChunkRef) error { return s.extents(dc, h, ref.ID, start) })
	case wire.OpSeal:
		return dc.chunk(r, h, key, start, func(ref wire.ChunkRef) error { return s.store.Seal(ref.ID) })
	case wire.OpDelete:
		return dc.chunk(r, h, key, start, func(ref wire.ChunkRef) error { return s.store.Delete(ref.ID) })
	case wire.OpCopy:
		var body []byte
		var err error
		if h.PayloadLen > 4096 {
			if err = r.Discard(); err == nil {
				err = errs.New(errs.ErrTooLarge, "%v payload of %d bytes", h.Op, h.PayloadLen)
			}
		} else {
			body = make([]byte, h.PayloadLen)
			_, err = r.ReadPayload(body, h.PayloadCRC)
		}
		ref, perr := wire.ParseChunkRef(key)
		return dc.start(h, start, nil, err, func() error {
			if perr != nil {
				return perr
			}
			return s.copyFrom(ref.ID, string(body))
		})
	case wire.OpReadCold:
		err := r.Discard()
		ref, perr := wire.ParseColdRef(key)
		return dc.start(h, start, nil, err, func() error {
			if perr != nil {
				return perr
			}
			return s.readCold(dc, h, ref, start)
		})
	case wire.OpKVPut:
		if dc.kvPutIntoDRAM(r, h, key, start) {
			return true
		}
		bp := bufpool.Get(int(h.PayloadLen))
		_, err := r.ReadPayload(*bp, h.PayloadCRC)
		s.metrics.bytesIn.Add(float64(h.PayloadLen))
		ref, perr := wire.ParseKVRef(append([]byte(nil), key...)) // the reader reuses its key buffer
		return dc.start(h, start, bp, err, func() error {
			if perr != nil {
				return perr
			}
			return s.kvPutFrame(dc, h, ref, *bp, nil, start)
		})
	case wire.OpKVGet:
		return dc.kv(r, h, key, start, func(ref wire.KVRef) error { return s.kvGet(dc, h, ref, start) })
	case wire.OpKVExists:
		return dc.kv(r, h, key, start, func(ref wire.KVRef) error { return s.kvExists(dc, h, ref, start) })
	case wire.OpKVDelete:
		return dc.kv(r, h, key, start, func(ref wire.KVRef) error { return s.kvDelete(dc, h, ref, start) })
	case wire.OpKVScan:
		return dc.kv(r, h, key, start, func(ref wire.KVRef) error { return s.kvScan(dc, h, ref, start) })
	case wire.OpKVRetain:
		var body [wire.RetainSize]byte
		var err error
		if h.PayloadLen != wire.RetainSize {
			if err = r.Discard(); err == nil {
				err = errs.New(errs.ErrTooLarge, "%v payload of %d bytes, want %d", h.Op, h.PayloadLen, wire.RetainSize)
			}
		} else {
			_, err = r.ReadPayload(body[:], h.PayloadCRC)
		}
		ref, perr := wire.ParseKVRef(append([]byte(nil), key...))
		ret, rerr := wire.ParseRetain(body[:])
		return dc.start(h, start, nil, err, func() error {
			if perr != nil {
				return perr
			}
			if rerr != nil {
				return rerr
			}
			return s.kvRetain(dc, h, ref, ret, start)
		})
	case wire.OpPing:
		return dc.start(h, start, nil, r.Discard(), func() error { return nil })
	default:
		return dc.start(h, start, nil, r.Discard(), func() error {
			return errs.New(errs.ErrUnknownOp, "unknown opcode %d: this server speaks protocol version %d", h.Op, wire.Version)
		})
	}
}

// errAnswered is what a handler returns once it has answered the frame
// itself (a payload, or fields in the header): start then sends nothing.
var errAnswered = errors.New("answered")

// start runs fn for frame h beside the reader; what fn returns is the
// answer (errAnswered: fn sent it). perr is the error of reading h's
// payload: a bad CRC or a payload over a limit fails only this request,
// any other broke the stream (start then reports false). bp, the pooled
// payload buffer, if any, is given back once fn is done.
func (dc *dataConn) start(h wire.Header, start time.Time, bp *[]byte, perr error, fn func() error) bool {
	if perr != nil {
		if bp != nil {
			bufpool.Put(bp)
		}
		if !errors.Is(perr, errs.ErrChecksum) && !errors.Is(perr, errs.ErrTooLarge) {
			return false
		}
		dc.done(h, start, perr)
		return true
	}
	dc.sem <- struct{}{}
	dc.wg.Add(1)
	go func() {
		defer func() {
			if bp != nil {
				bufpool.Put(bp)
			}
			<-dc.sem
			dc.finished()
			dc.wg.Done()
		}()
		if err := fn(); err != errAnswered {
			dc.done(h, start, err)
		}
	}()
	return true
}

// kvPutIntoDRAM serves a KV put of a large value without replicas by
// receiving its payload straight into DRAM pages the store reserves for
// it (one copy, the kernel's; the CRC computed as the bytes arrive), and
// reports whether it did. It does not where the store has no pages to
// spare, the ref does not parse, or the key is not this server's under the
// map it has (reserving would evict blocks for a put answered moved): the
// caller then reads the payload into a buffer, as for every other put.
func (dc *dataConn) kvPutIntoDRAM(r *wire.Reader, h wire.Header, key []byte, start time.Time) bool {
	s := dc.s
	if s.kv == nil || h.PayloadLen < kvPutIntoDRAMMin {
		return false
	}
	ref, err := wire.ParseKVRef(append([]byte(nil), key...)) // the reader reuses its key buffer
	if err != nil || len(ref.Forward) > 0 || checkKVRef(ref, false) != nil || !s.ownsNow(ref) {
		return false // the ordinary path answers, refreshing the map if need be
	}
	res, err := s.kv.Reserve(kvKey(ref), int64(h.PayloadLen), h.Flags&wire.FlagOverwrite != 0)
	if err != nil || res == nil {
		return false
	}
	crc, err := r.ReadPayloadViews(res.Views())
	s.metrics.bytesIn.Add(float64(h.PayloadLen))
	if err == nil && crc != h.PayloadCRC {
		err = wire.ErrPayloadCRC
	}
	if err != nil {
		res.Release()
	}
	return dc.start(h, start, nil, err, func() error {
		return s.kvPutFrame(dc, h, ref, nil, res, start)
	})
}

// kvPutIntoDRAMMin is the least payload received into reserved pages:
// below it a put's copy out of a pooled buffer costs less than reserving.
const kvPutIntoDRAMMin = 64 << 10

// chunk starts fn for a payload-less frame whose key is a chunk ref.
func (dc *dataConn) chunk(r *wire.Reader, h wire.Header, key []byte, start time.Time, fn func(wire.ChunkRef) error) bool {
	err := r.Discard()
	ref, perr := wire.ParseChunkRef(key)
	return dc.start(h, start, nil, err, func() error {
		if perr != nil {
			return perr
		}
		return fn(ref)
	})
}

// kv starts fn for a payload-less frame whose key is a KV ref.
func (dc *dataConn) kv(r *wire.Reader, h wire.Header, key []byte, start time.Time, fn func(wire.KVRef) error) bool {
	err := r.Discard()
	ref, perr := wire.ParseKVRef(append([]byte(nil), key...)) // the reader reuses its key buffer
	return dc.start(h, start, nil, err, func() error {
		if perr != nil {
			return perr
		}
		return fn(ref)
	})
}
