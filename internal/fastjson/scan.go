package fastjson

import (
	"strconv"
)

// Scanner reads the plain form of a JSON document one value at a time, for
// hand decoders of small, fixed-shape messages (the master's plan and
// commit answers, its commit requests): objects whose keys have no escapes,
// strings of printable ASCII with no escapes, integers, numbers, booleans.
// Anything else — an escape, a non-ASCII byte, null, a syntax error — sets
// the scanner bad, and the caller decodes the document with encoding/json
// instead, which gives the same result (or the error) it always gave. A
// hand decoder must also turn down what it cannot map exactly as
// encoding/json would (an unknown or repeated key: encoding/json matches
// keys case-insensitively and merges repeats).
//
// A document of more than MaxElems array elements in all (arrays read by
// Array; Span's are the caller's) is turned down too: a hand decoder
// builds each element as it reads it, before it knows the document is
// valid, where encoding/json checks the whole syntax first, so a long list
// in a body broken at its end would otherwise cost far more memory by hand
// (16 times encoding/json's for a 4 MiB commit body of `{},` elements).
// Plain messages hold a few dozen.
//
// The zero Scanner is unusable; NewScanner sets it on a document.
type Scanner struct {
	b     []byte
	i     int
	bad   bool
	elems int // array elements read so far
}

// MaxElems is how many array elements a plain document may hold.
const MaxElems = 4096

// NewScanner scans b.
func NewScanner(b []byte) *Scanner { return &Scanner{b: b} }

// Reset scans b from its start, as NewScanner does.
func (s *Scanner) Reset(b []byte) { *s = Scanner{b: b} }

// OK says the document was plain so far.
func (s *Scanner) OK() bool { return !s.bad }

// Fail marks the document as one the hand decoder does not take.
func (s *Scanner) Fail() { s.bad = true }

func (s *Scanner) ws() {
	for s.i < len(s.b) && isSpace(s.b[s.i]) {
		s.i++
	}
}

// peek is the next byte after white space, 0 at the end.
func (s *Scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// End says the document was plain and nothing but white space follows
// what was read.
func (s *Scanner) End() bool {
	s.ws()
	return !s.bad && s.i == len(s.b)
}

// plainString reads a string of printable ASCII without escapes and
// returns its contents (a view of the document).
func (s *Scanner) plainString() []byte {
	if s.bad || s.peek() != '"' {
		s.bad = true
		return nil
	}
	start := s.i + 1
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return s.b[start:j]
		case c < 0x20 || c >= 0x7f || c == '\\':
			s.bad = true
			return nil
		}
	}
	s.bad = true
	return nil
}

// Object reads an object, calling field with each key (a view of the
// document, valid during the call) with the scanner at the key's value;
// field reads the value (or fails the scanner). It says whether the
// object was read.
func (s *Scanner) Object(field func(key []byte)) bool {
	if s.bad || s.peek() != '{' {
		s.bad = true
		return false
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return true
	}
	for !s.bad {
		key := s.plainString()
		if s.bad || s.peek() != ':' {
			s.bad = true
			return false
		}
		s.i++
		field(key)
		if s.bad {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			s.bad = true
		}
	}
	return false
}

// Array reads an array, calling elem for each element with the scanner at
// it; elem reads it (or fails the scanner). It says whether the array was
// read.
func (s *Scanner) Array(elem func()) bool {
	if s.bad || s.peek() != '[' {
		s.bad = true
		return false
	}
	s.i++
	if s.peek() == ']' {
		s.i++
		return true
	}
	for !s.bad {
		if s.elems++; s.elems > MaxElems {
			s.bad = true
			return false
		}
		elem()
		if s.bad {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return true
		default:
			s.bad = true
		}
	}
	return false
}

// String reads a plain string (printable ASCII, no escapes).
func (s *Scanner) String() string { return string(s.plainString()) }

// QuotedString reads a plain string and returns it with its quotes, a
// view of the document: what encoding/json hands a json.Unmarshaler
// (time.Time) for that string.
func (s *Scanner) QuotedString() []byte {
	s.ws()
	start := s.i
	if s.plainString(); s.bad {
		return nil
	}
	return s.b[start:s.i]
}

// Bool reads true or false.
func (s *Scanner) Bool() bool {
	s.ws()
	switch {
	case s.bad:
	case hasPrefix(s.b[s.i:], "true"):
		s.i += 4
		return true
	case hasPrefix(s.b[s.i:], "false"):
		s.i += 5
		return false
	}
	s.bad = true
	return false
}

func hasPrefix(b []byte, p string) bool { return len(b) >= len(p) && string(b[:len(p)]) == p }

// number reads a JSON number (RFC 8259's grammar) and returns its text and
// whether it is an integer (no fraction, no exponent).
func (s *Scanner) number() (text []byte, integer bool) {
	if s.bad {
		return nil, false
	}
	s.ws()
	start, j := s.i, s.i
	digits := func() bool {
		k := j
		for j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9' {
			j++
		}
		return j > k
	}
	if j < len(s.b) && s.b[j] == '-' {
		j++
	}
	switch {
	case j < len(s.b) && s.b[j] == '0':
		j++
	case !digits():
		s.bad = true
		return nil, false
	}
	integer = true
	if j < len(s.b) && s.b[j] == '.' {
		j++
		if !digits() {
			s.bad = true
			return nil, false
		}
		integer = false
	}
	if j < len(s.b) && (s.b[j] == 'e' || s.b[j] == 'E') {
		j++
		if j < len(s.b) && (s.b[j] == '+' || s.b[j] == '-') {
			j++
		}
		if !digits() {
			s.bad = true
			return nil, false
		}
		integer = false
	}
	s.i = j
	return s.b[start:j], integer
}

// Int reads an integer that fits an int64: what encoding/json stores into
// an int64 field (a fraction or an exponent is its error, so not plain).
func (s *Scanner) Int() int64 {
	t, integer := s.number()
	if s.bad || !integer {
		s.bad = true
		return 0
	}
	v, err := strconv.ParseInt(string(t), 10, 64)
	if err != nil {
		s.bad = true
	}
	return v
}

// Uint reads an integer that fits a uint64.
func (s *Scanner) Uint() uint64 {
	t, integer := s.number()
	if s.bad || !integer {
		s.bad = true
		return 0
	}
	v, err := strconv.ParseUint(string(t), 10, 64)
	if err != nil {
		s.bad = true
	}
	return v
}

// Float reads a number as encoding/json stores it into a float64.
func (s *Scanner) Float() float64 {
	t, _ := s.number()
	if s.bad {
		return 0
	}
	v, err := strconv.ParseFloat(string(t), 64)
	if err != nil {
		s.bad = true
	}
	return v
}

// Seen records key number k of an object in *mask and fails the scanner
// when it was already there: encoding/json merges a repeated key's values,
// which a hand decoder leaves to it.
func (s *Scanner) Seen(mask *uint64, k uint) {
	if *mask&(1<<k) != 0 {
		s.bad = true
	}
	*mask |= 1 << k
}

// Span reads the bytes from an array's '[' to the first ']' after it, for
// a list parser of this package (Uint32s, Array) that takes only arrays of
// plain scalars: an array that holds a ']' anywhere but at its end (in a
// string, in a nested array) is cut short there, which such a parser then
// turns down.
func (s *Scanner) Span() []byte {
	if s.bad || s.peek() != '[' {
		s.bad = true
		return nil
	}
	for j := s.i + 1; j < len(s.b); j++ {
		if s.b[j] == ']' {
			span := s.b[s.i : j+1]
			s.i = j + 1
			return span
		}
	}
	s.bad = true
	return nil
}

// maxRawDepth bounds the nesting Raw follows: the answers it reads nest a
// few levels, and a deeper document is left to encoding/json.
const maxRawDepth = 16

// Raw reads one plain value of any kind (objects and arrays of plain
// values, nested at most maxRawDepth deep) and returns its bytes, a view
// of the document: what encoding/json stores into a json.RawMessage.
func (s *Scanner) Raw() []byte {
	s.ws()
	start := s.i
	s.skip(0)
	if s.bad {
		return nil
	}
	return s.b[start:s.i]
}

func (s *Scanner) skip(depth int) {
	if depth > maxRawDepth {
		s.bad = true
		return
	}
	switch s.peek() {
	case '{':
		s.Object(func([]byte) { s.skip(depth + 1) })
	case '[':
		s.Array(func() { s.skip(depth + 1) })
	case '"':
		s.plainString()
	case 't', 'f':
		s.Bool()
	default:
		s.number()
	}
}
