// Package errs holds every sentinel error of gd2fs in one documented place.
//
// Errors cross two boundaries: the binary data plane (as a wire.Status) and the
// HTTP control plane (as a short code string). Each boundary translates in
// exactly one function on each side (wire.StatusOf / wire.ErrorOf and Code /
// FromCode here), so callers can always test with errors.Is against these
// sentinels, whichever side produced the failure.
package errs

import (
	"errors"
	"fmt"
)

// Sentinel errors. Compare with errors.Is.
var (
	// ErrNotFound: a path, file, chunk or server that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: creating something that is already there.
	ErrExists = errors.New("already exists")
	// ErrNotEmpty: removing a directory that still has entries.
	ErrNotEmpty = errors.New("directory not empty")
	// ErrIsDir / ErrNotDir: a path of the wrong kind.
	ErrIsDir  = errors.New("is a directory")
	ErrNotDir = errors.New("not a directory")
	// ErrSealed: a write to a sealed (immutable) file or chunk.
	ErrSealed = errors.New("sealed: file is immutable")
	// ErrBusy: a change refused while something uses the name (a file still
	// being written, or one a KV session holds); it works once that is over.
	ErrBusy = errors.New("busy")
	// ErrNoSpace: the store is full and nothing can be evicted.
	ErrNoSpace = errors.New("no space left")
	// ErrUnavailable: no live server holds the data (dead server, perf-pool loss).
	ErrUnavailable = errors.New("unavailable")
	// ErrChecksum: bytes whose CRC32C does not match; never returned as data.
	ErrChecksum = errors.New("checksum mismatch")
	// ErrOutOfRange: an offset or length outside the object.
	ErrOutOfRange = errors.New("out of range")
	// ErrBadRequest: malformed input (frame, JSON, path, argument).
	ErrBadRequest = errors.New("bad request")
	// ErrTooLarge: a length beyond a configured limit.
	ErrTooLarge = errors.New("too large")
	// ErrUnauthorized: a wrong or missing cluster token.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrVersion: a protocol version this peer does not speak.
	ErrVersion = errors.New("protocol version mismatch")
	// ErrUnknownOp: an opcode this server does not know.
	ErrUnknownOp = errors.New("unknown opcode")
	// ErrMoved: the addressed server is not the owner for the caller's epoch.
	ErrMoved = errors.New("moved")
	// ErrInternal: a bug or an unexpected failure on the remote side.
	ErrInternal = errors.New("internal error")
)

// Error is a sentinel kind with a human message and, when it has one, the
// error underneath. errors.Is sees both: errors.Is(e, e.Kind) holds, and so
// does errors.Is(e, context.DeadlineExceeded) for an error that wraps a
// timeout. Only the kind crosses the wire; the cause stays in this process.
type Error struct {
	Kind  error
	Msg   string
	Cause error // nil when there is none
}

func (e *Error) Error() string { return e.Msg }

// Unwrap gives errors.Is and errors.As the kind, then the cause.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

// New returns an error of kind with a formatted message. The message should
// say what to do next where that is known. Format the underlying error with
// %w, as fmt.Errorf does, to keep it as the cause.
func New(kind error, format string, args ...any) error {
	e := fmt.Errorf(format, args...)
	var cause error
	switch w := e.(type) {
	case interface{ Unwrap() error }:
		cause = w.Unwrap()
	case interface{ Unwrap() []error }:
		cause = e // several %w: the fmt error holds them all
	}
	return &Error{Kind: kind, Msg: e.Error(), Cause: cause}
}

// KindOf is the sentinel kind of err: the Kind of the outermost *Error in
// its chain, so a cause of another kind never decides it; else the first
// sentinel, in the order of the table below, that errors.Is finds; else nil.
func KindOf(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) && e.Kind != nil {
		return e.Kind
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.err
		}
	}
	return nil
}

var codes = []struct {
	code string
	err  error
}{
	{"not_found", ErrNotFound},
	{"exists", ErrExists},
	{"not_empty", ErrNotEmpty},
	{"is_dir", ErrIsDir},
	{"not_dir", ErrNotDir},
	{"sealed", ErrSealed},
	{"busy", ErrBusy},
	{"no_space", ErrNoSpace},
	{"unavailable", ErrUnavailable},
	{"checksum", ErrChecksum},
	{"out_of_range", ErrOutOfRange},
	{"bad_request", ErrBadRequest},
	{"too_large", ErrTooLarge},
	{"unauthorized", ErrUnauthorized},
	{"version", ErrVersion},
	{"unknown_op", ErrUnknownOp},
	{"moved", ErrMoved},
	{"internal", ErrInternal},
}

// Code names err's kind for the HTTP API ("internal" when it has none).
func Code(err error) string {
	kind := KindOf(err)
	for _, c := range codes {
		if kind == c.err {
			return c.code
		}
	}
	return "internal"
}

// FromCode rebuilds an error of the kind named by code with message msg.
func FromCode(code, msg string) error {
	for _, c := range codes {
		if c.code == code {
			return &Error{Kind: c.err, Msg: msg}
		}
	}
	return &Error{Kind: ErrInternal, Msg: msg}
}
