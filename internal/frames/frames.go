// Package frames carries a client's calls to the master over persistent
// connections that speak length-prefixed frames instead of HTTP/1.1, one
// call at a time on a connection (issue 20).
//
// Why: a chat turn is a plan and a commit, and at 1,000 turns/s the master
// answers a plan in under 0.1 ms (p50) while the client sees 0.35 ms and a
// router 1.5 ms: the rest is waking goroutines and threads, and on a VM a
// wake-up is expensive. net/http spends several a round trip: the client
// hands each request to its connection's write goroutine and gets the answer
// from its read goroutine, and the server starts and then stops a
// background read around every handler. Here the caller's goroutine writes
// the frame and reads the answer itself, and the server's one goroutine a
// connection reads a frame, runs the handler and writes the answer. On this
// machine a loopback round trip between two processes took 0.15 ms against
// net/http's 0.41–0.46 ms at 64 calls a second, and half the CPU
// (docs/benchmarks.md, "Eighteenth session").
//
// What is carried is still HTTP: a frame holds a method, a path, headers and
// a body, and the server answers it by running its ordinary http.Handler on
// a request built from it, so every route, limit, guard and metric applies
// to a framed call exactly as to a plain one. A connection starts as an
// HTTP/1.1 request (GET Path with Upgrade: Protocol) that passes the master's
// guard and token check like any other and is answered 101 Switching
// Protocols; a master that does not know the route answers 404, a standby
// 503, and the client then sends its calls as plain HTTP.
//
// Frames (all integers big-endian):
//
//	request: u32 n (the bytes that follow), u8 method, u16 path length,
//	         path, headers, body (the rest)
//	answer:  u32 n, u16 status, headers, body (the rest)
//	headers: u8 count, then count times: u8 name length, name,
//	         u16 value length, value
//
// n is checked against MaxRequest or MaxAnswer before anything is
// allocated; a frame that does not parse closes the connection.
//
// Which calls a master takes on frames grew after the first version: the
// explicit sessions' POSTs always, and those its 101 names in TakesHeader
// (CallCommit: a file's commit, the Sync of an engine's saved KV;
// CallStat: a session file's stat). A
// client sends a call of such a family framed only on a connection whose
// master named it, so an older master, which would refuse it (400), gets
// it as plain HTTP.
package frames

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"
)

const (
	// Protocol is the Upgrade token; Path the route that upgrades.
	Protocol = "gd2fs-frames/1"
	Path     = "/v1/frames"

	// MaxRequest bounds a request frame: the master's JSON body limit
	// (4 MiB) and room for its path and headers.
	MaxRequest = 4<<20 + 128<<10
	// MaxAnswer bounds an answer frame; a handler's answer over it is
	// refused (500) rather than sent.
	MaxAnswer = 64 << 20
	// MaxHeaders bounds a frame's headers.
	MaxHeaders = 32
)

// TakesHeader, in the 101 of an upgrade, lists (comma-separated) the
// families of calls the master takes on the connection beyond explicit
// sessions' (Server.Takes).
const TakesHeader = "Gd2fs-Frames-Takes"

// CallCommit is the family of a file's commit (POST /v1/commit/...).
const CallCommit = "commit"

// CallStat is the family of a session file's stat (GET
// /v1/files/kv-sessions/...: an engine's Open of a new chat's file, a
// load's), whose answer is small.
const CallStat = "stat"

// family is the family a call must be named in TakesHeader for ("": none).
func family(method, path string) string {
	switch {
	case method == http.MethodPost && strings.HasPrefix(path, "/v1/commit/"):
		return CallCommit
	case method == http.MethodGet && strings.HasPrefix(path, "/v1/files/kv-sessions/"):
		return CallStat
	}
	return ""
}

// ErrFrame marks a frame that does not parse.
var ErrFrame = errors.New("bad frame")

var methods = [...]string{1: http.MethodGet, 2: http.MethodPost, 3: http.MethodPut, 4: http.MethodDelete}

func methodCode(m string) (byte, bool) {
	for i, s := range methods {
		if s != "" && s == m {
			return byte(i), true
		}
	}
	return 0, false
}

// Request is a decoded request frame. Path and Body are views of the
// frame's bytes.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// Answer is a decoded answer frame; Body is a view of the frame's bytes.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// AppendRequest appends req's frame to b; an error when it cannot be
// framed (a method other than GET, POST, PUT, DELETE; a path, header or
// body over the limits).
func AppendRequest(b []byte, method, path string, h http.Header, body []byte) ([]byte, error) {
	code, ok := methodCode(method)
	if !ok {
		return b, fmt.Errorf("frames: method %s cannot be framed", method)
	}
	if len(path) == 0 || path[0] != '/' || len(path) > 0xffff || !validPath(path) {
		return b, fmt.Errorf("frames: path of %d bytes cannot be framed", len(path))
	}
	start := len(b)
	b = append(b, 0, 0, 0, 0, code)
	b = binary.BigEndian.AppendUint16(b, uint16(len(path)))
	b = append(b, path...)
	b, err := appendHeaders(b, h)
	if err != nil {
		return b[:start], err
	}
	b = append(b, body...)
	n := len(b) - start - 4
	if n > MaxRequest {
		return b[:start], fmt.Errorf("frames: request of %d bytes over %d", n, MaxRequest)
	}
	binary.BigEndian.PutUint32(b[start:], uint32(n))
	return b, nil
}

// AppendAnswer appends an answer frame to b; an error when it is over
// the limits.
func AppendAnswer(b []byte, status int, h http.Header, body []byte) ([]byte, error) {
	start := len(b)
	b, err := appendAnswerHead(b, status, h, len(body))
	if err != nil {
		return b[:start], err
	}
	return append(b, body...), nil
}

// appendAnswerHead appends an answer frame's length, status and headers,
// for a body of bodyLen bytes to follow.
func appendAnswerHead(b []byte, status int, h http.Header, bodyLen int) ([]byte, error) {
	if status < 100 || status > 999 {
		return b, fmt.Errorf("frames: status %d", status)
	}
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(status))
	b, err := appendHeaders(b, h)
	if err != nil {
		return b[:start], err
	}
	n := len(b) - start - 4 + bodyLen
	if n > MaxAnswer {
		return b[:start], fmt.Errorf("frames: answer of %d bytes over %d", n, MaxAnswer)
	}
	binary.BigEndian.PutUint32(b[start:], uint32(n))
	return b, nil
}

func appendHeaders(b []byte, h http.Header) ([]byte, error) {
	count := 0
	for _, vs := range h {
		count += len(vs)
	}
	if count > MaxHeaders {
		return b, fmt.Errorf("frames: %d header values, at most %d", count, MaxHeaders)
	}
	b = append(b, byte(count))
	for k, vs := range h {
		if len(k) > 0xff || !httpguts.ValidHeaderFieldName(k) {
			return b, fmt.Errorf("frames: header name %.64q", k)
		}
		for _, v := range vs {
			if len(v) > 0xffff || !httpguts.ValidHeaderFieldValue(v) {
				return b, fmt.Errorf("frames: header %s of %d bytes", k, len(v))
			}
			b = append(b, byte(len(k)))
			b = append(b, k...)
			b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
			b = append(b, v...)
		}
	}
	return b, nil
}

// Length reads a frame's length prefix and checks it against max before
// the caller allocates room for the frame.
func Length(prefix [4]byte, max int) (int, error) {
	n := binary.BigEndian.Uint32(prefix[:])
	if uint64(n) > uint64(max) {
		return 0, fmt.Errorf("%w: %d bytes, at most %d", ErrFrame, n, max)
	}
	return int(n), nil
}

// ParseRequest decodes a request frame's bytes (after its length).
func ParseRequest(b []byte) (Request, error) {
	var r Request
	if len(b) < 3 {
		return r, fmt.Errorf("%w: request of %d bytes", ErrFrame, len(b))
	}
	if int(b[0]) >= len(methods) || methods[b[0]] == "" {
		return r, fmt.Errorf("%w: method %d", ErrFrame, b[0])
	}
	r.Method = methods[b[0]]
	pl := int(binary.BigEndian.Uint16(b[1:]))
	b = b[3:]
	if pl == 0 || pl > len(b) || b[0] != '/' {
		return r, fmt.Errorf("%w: path of %d bytes", ErrFrame, pl)
	}
	r.Path = string(b[:pl])
	if !validPath(r.Path) {
		return r, fmt.Errorf("%w: path %.64q", ErrFrame, r.Path)
	}
	var err error
	r.Header, b, err = parseHeaders(b[pl:])
	r.Body = b
	return r, err
}

// ParseAnswer decodes an answer frame's bytes (after its length).
func ParseAnswer(b []byte) (Answer, error) {
	var a Answer
	if len(b) < 3 {
		return a, fmt.Errorf("%w: answer of %d bytes", ErrFrame, len(b))
	}
	a.Status = int(binary.BigEndian.Uint16(b))
	if a.Status < 100 || a.Status > 999 {
		return a, fmt.Errorf("%w: status %d", ErrFrame, a.Status)
	}
	var err error
	a.Header, a.Body, err = parseHeaders(b[2:])
	return a, err
}

func parseHeaders(b []byte) (http.Header, []byte, error) {
	if len(b) < 1 {
		return nil, nil, fmt.Errorf("%w: no header count", ErrFrame)
	}
	count := int(b[0])
	b = b[1:]
	if count > MaxHeaders {
		return nil, nil, fmt.Errorf("%w: %d headers, at most %d", ErrFrame, count, MaxHeaders)
	}
	h := make(http.Header, count)
	for range count {
		if len(b) < 1 {
			return nil, nil, fmt.Errorf("%w: header cut short", ErrFrame)
		}
		kl := int(b[0])
		if kl == 0 || len(b) < 1+kl+2 {
			return nil, nil, fmt.Errorf("%w: header cut short", ErrFrame)
		}
		k := string(b[1 : 1+kl])
		vl := int(binary.BigEndian.Uint16(b[1+kl:]))
		b = b[1+kl+2:]
		if vl > len(b) {
			return nil, nil, fmt.Errorf("%w: header %.64q cut short", ErrFrame, k)
		}
		v := string(b[:vl])
		// Checked as net/http's reader checks them; canonical names,
		// values as sent.
		if !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
			return nil, nil, fmt.Errorf("%w: header %.64q", ErrFrame, k)
		}
		ck := http.CanonicalHeaderKey(k)
		h[ck] = append(h[ck], v)
		b = b[vl:]
	}
	return h, b, nil
}

// validPath: printable ASCII without spaces, as a request line's target.
func validPath(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] <= ' ' || p[i] >= 0x7f {
			return false
		}
	}
	return true
}
