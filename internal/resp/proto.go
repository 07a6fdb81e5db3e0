package resp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/kvstore"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// Limits bound what one request may make the server hold. Every length is
// checked against them before anything is allocated.
type Limits struct {
	MaxArgs        int   // elements of one command array (Redis: 1024*1024)
	MaxBulk        int64 // one argument; longer ones are a protocol error (Redis: 512 MiB)
	MaxValue       int64 // a SET value; longer ones (≤ MaxBulk) are skipped and refused
	MaxCommand     int64 // all arguments of one command together
	MaxInline      int   // an inline command line (Redis: 64 KiB)
	UnauthArgs     int   // before AUTH (Redis: 10)
	UnauthBulk     int64 // before AUTH (Redis: 16 KiB)
	LargeArgBuffer int64 // arguments at least this long go to pooled buffers
}

// DefaultLimits returns Redis's limits, with the value limit of a data
// server. A function, not a variable, so no caller can change the defaults
// every other server in the process starts with.
func DefaultLimits() Limits {
	return Limits{
		MaxArgs:        1024 * 1024,
		MaxBulk:        512 << 20,
		MaxValue:       limits.MaxKVValue,
		MaxCommand:     1 << 30,
		MaxInline:      64 << 10,
		UnauthArgs:     10,
		UnauthBulk:     16 << 10,
		LargeArgBuffer: 64 << 10,
	}
}

// protoError is a malformed request: the server answers it and closes the
// connection, as Redis does, since the stream cannot be resynchronised.
type protoError string

func (e protoError) Error() string { return "Protocol error: " + string(e) }

// command is one parsed request. Large arguments live in pooled buffers
// (bufs) that release returns.
type command struct {
	args    [][]byte
	bufs    []*[]byte
	skipped int64 // > 0: an argument of that many bytes was over MaxValue and skipped
	inline  bool  // sent as a line of words, not a multibulk array

	// res holds the value of a plain SET read straight into the store's
	// DRAM pages (reader.direct); args[2] is then empty and only set
	// (through conn.res) or value() may take the value. resCRC is its
	// CRC32C, computed as the bytes arrived.
	res    *kvstore.Reservation
	resCRC uint32
}

func (c *command) release() {
	for _, b := range c.bufs {
		bufpool.Put(b)
	}
	if c.res != nil {
		c.res.Release() // nothing after its Commit
		c.res = nil
	}
	c.bufs = c.bufs[:0]
	c.args = c.args[:0]
	c.skipped = 0
	c.inline = false
}

// materialize copies a reserved value into args[2] and gives the pages
// back: for any use of the command other than a plain SET's own put (a
// SET queued in MULTI keeps its arguments).
func (c *command) materialize() {
	if c.res == nil {
		return
	}
	v := make([]byte, 0, c.res.Size())
	for _, b := range c.res.Views() {
		v = append(v, b...)
	}
	c.args[2] = v
	c.res.Release()
	c.res = nil
}

// reader parses requests: RESP arrays of bulk strings, as every client
// sends, and inline commands (a line of words), as telnet users type.
type reader struct {
	br     *bufio.Reader
	lim    Limits
	authed bool
	small  []byte // backing store of small arguments, reused per command

	// direct, when set, is asked for DRAM pages to read the value of a
	// plain SET (SET key value, nothing after) of at least LargeArgBuffer
	// bytes into; nil: read it the ordinary way. wr reads into them:
	// readv(2) from the socket past what br holds.
	direct func(key []byte, n int64) *kvstore.Reservation
	wr     *wire.Reader
}

func newReader(r io.Reader, lim Limits) *reader {
	br := bufio.NewReaderSize(r, 64<<10)
	return &reader{br: br, lim: lim, wr: wire.NewBufferedReader(br, r, wire.Limits{})}
}

// line reads one CRLF-terminated line (without the CRLF), at most max bytes.
func (r *reader) line(max int) ([]byte, error) {
	b, err := r.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || (err == nil && len(b) > max+2) {
		return nil, protoError("too big inline request")
	}
	if err != nil {
		if err == io.EOF && len(b) > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	b = b[:len(b)-1]
	if len(b) > 0 && b[len(b)-1] == '\r' {
		b = b[:len(b)-1]
	}
	return b, nil
}

// parseLen parses the decimal length after a '*' or '$'; -1 allowed.
func parseLen(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}

// next reads one command into c. io.EOF means the client went away between
// commands; a protoError means the stream is broken.
func (r *reader) next(c *command) error {
	c.release()
	r.small = r.small[:0]
	for {
		b, err := r.br.Peek(1)
		if err != nil {
			return err
		}
		if b[0] != '*' {
			c.inline = true
			ok, err := r.inline(c)
			if err != nil || ok {
				return err
			}
			continue // an empty line: ignored, as Redis does
		}
		return r.multibulk(c)
	}
}

func (r *reader) inline(c *command) (bool, error) {
	ln, err := r.line(r.lim.MaxInline)
	if err != nil {
		return false, err
	}
	for _, f := range bytes.Fields(ln) {
		r.small = append(r.small, f...)
	}
	off := 0
	for _, f := range bytes.Fields(ln) {
		c.args = append(c.args, r.small[off:off+len(f):off+len(f)])
		off += len(f)
	}
	return len(c.args) > 0, nil
}

func (r *reader) multibulk(c *command) error {
	ln, err := r.line(64)
	if err != nil {
		if _, ok := err.(protoError); ok {
			return protoError("invalid multibulk length")
		}
		return err
	}
	n, ok := parseLen(ln[1:])
	switch {
	case !ok || n > int64(r.lim.MaxArgs):
		return protoError("invalid multibulk length")
	case !r.authed && n > int64(r.lim.UnauthArgs):
		return protoError("unauthenticated multibulk length")
	case n <= 0:
		return nil // "*0" and "*-1": nothing to do (the caller reads on)
	}
	// Arguments are appended one by one: a huge announced count costs
	// nothing until its elements arrive.
	var total int64
	for i := int64(0); i < n; i++ {
		ln, err := r.line(64)
		if err != nil {
			if _, ok := err.(protoError); ok {
				return protoError("invalid bulk length")
			}
			return noEOF(err)
		}
		if len(ln) == 0 || ln[0] != '$' {
			got := "\\n"
			if len(ln) > 0 {
				got = string(ln[:1])
			}
			return protoError("expected '$', got '" + got + "'")
		}
		blen, ok := parseLen(ln[1:])
		switch {
		case !ok || blen < 0 || blen > r.lim.MaxBulk:
			return protoError("invalid bulk length")
		case !r.authed && blen > r.lim.UnauthBulk:
			return protoError("unauthenticated bulk length")
		}
		total += blen
		if total > r.lim.MaxCommand {
			return protoError("command of more than " + strconv.FormatInt(r.lim.MaxCommand, 10) + " bytes")
		}
		if n == 3 && i == 2 && r.direct != nil && blen >= r.lim.LargeArgBuffer && blen <= r.lim.MaxValue && lowerIs(c.args[0], "set") {
			if res := r.direct(c.args[1], blen); res != nil {
				if err := r.reserved(c, res); err != nil {
					return err
				}
				continue
			}
		}
		if err := r.bulk(c, blen); err != nil {
			return err
		}
	}
	return nil
}

// reserved reads a SET's value into res's pages, then its CRLF.
func (r *reader) reserved(c *command, res *kvstore.Reservation) error {
	c.res = res // released with the command, whatever happens here
	crc, err := r.wr.ReadRawViews(res.Views())
	if err != nil {
		if errors.Is(err, errs.ErrBadRequest) { // wire's word for a stream that ended early
			return io.ErrUnexpectedEOF
		}
		return err
	}
	c.resCRC = crc
	if err := r.crlf(res.Size()); err != nil {
		return err
	}
	c.args = append(c.args, []byte{})
	return nil
}

// lowerIs reports whether b, lower-cased, is the lower-case word w.
func lowerIs(b []byte, w string) bool {
	if len(b) != len(w) {
		return false
	}
	for i := range len(b) {
		if b[i]|0x20 != w[i] {
			return false
		}
	}
	return true
}

// bulk reads one argument of n bytes and its CRLF.
func (r *reader) bulk(c *command, n int64) error {
	var arg []byte
	switch {
	case n > r.lim.MaxValue:
		// Too big to keep, small enough to read past: the command is
		// refused and the connection stays usable.
		if _, err := r.br.Discard(int(n)); err != nil {
			return noEOF(err)
		}
		c.skipped = n
		arg = []byte{}
	case n >= r.lim.LargeArgBuffer:
		bp := bufpool.Get(int(n))
		c.bufs = append(c.bufs, bp)
		arg = *bp
		if _, err := io.ReadFull(r.br, arg); err != nil {
			return noEOF(err)
		}
	default:
		start := len(r.small)
		if cap(r.small)-start < int(n) {
			// Grow into a new array; earlier arguments keep the old one.
			ns := make([]byte, start, max(2*cap(r.small), start+int(n), 4096))
			copy(ns, r.small)
			r.small = ns
		}
		r.small = r.small[:start+int(n)]
		arg = r.small[start : start+int(n) : start+int(n)]
		if _, err := io.ReadFull(r.br, arg); err != nil {
			return noEOF(err)
		}
	}
	if err := r.crlf(n); err != nil {
		return err
	}
	c.args = append(c.args, arg)
	return nil
}

// crlf reads the CRLF after a bulk string of n bytes.
func (r *reader) crlf(n int64) error {
	var crlf [2]byte
	if _, err := io.ReadFull(r.br, crlf[:]); err != nil {
		return noEOF(err)
	}
	if crlf != [2]byte{'\r', '\n'} {
		return protoError("expected CRLF after a bulk string of " + strconv.FormatInt(n, 10) + " bytes")
	}
	return nil
}

// noEOF: the client went away in the middle of a command.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
