// Package fastjson parses the long JSON arrays on the request paths of
// explicit mode — a prompt's token ids and block hashes, thousands of
// numbers a request — without encoding/json's reflective step per element
// (a tenth of the master's CPU under chat turns, issue 20). It takes only
// the plain form (an array of plain integers, of plain strings) and says
// ok false for anything else, which the caller then hands to encoding/json,
// so a request decodes exactly as it did and a bad one gets encoding/json's
// error (FuzzPlanWire in internal/master and FuzzParseIDs in
// internal/router compare the two).
//
// Scanner (scan.go) does the same for whole small messages of fixed shape
// — the plan and commit requests and answers of a chat turn — read one
// value at a time by hand decoders in internal/api and internal/master
// (FuzzAnswerDecode and FuzzPlanWire compare those with encoding/json).
//
// Members (members.go) splits a whole JSON object into its members, any
// valid values, for the router's reading of every completion request
// (FuzzMembers compares it with encoding/json).
package fastjson

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// elements checks that b is a JSON array, '[' to ']' with nothing around
// it, and counts its top-level commas plus one (0 for an empty array): an
// upper bound on its elements, so that a list is allocated once. ok false:
// not an array (or not one that the parsers below take).
func elements(b []byte) (n int, ok bool) {
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return 0, false
	}
	empty := true
	for _, c := range b[1 : len(b)-1] {
		switch {
		case c == ',':
			n++
		case !isSpace(c):
			empty = false
		}
	}
	if empty {
		return 0, true
	}
	return n + 1, true
}

// Array parses b when it is a JSON array of elements that one reads:
// one is given b, where the element starts and where the array's contents
// end, and answers the element and where it ends (ok false: not one it
// takes). minLen is the fewest bytes an element and its comma take: the
// list's room is bounded by it, because elements' count of commas also
// counts those inside strings, and a bad body of nothing but commas must
// not make the decoder allocate for each. ok false: anything else, which
// encoding/json then decodes or refuses.
func Array[T any](b []byte, minLen int, one func(b []byte, i, end int) (T, int, bool)) ([]T, bool) {
	n, ok := elements(b)
	if !ok {
		return nil, false
	}
	out := make([]T, 0, min(n, len(b)/minLen+1))
	i, end := 1, len(b)-1
	skip := func() {
		for i < end && isSpace(b[i]) {
			i++
		}
	}
	skip()
	if i == end {
		return out, true // "[]"
	}
	for {
		v, next, ok := one(b, i, end)
		if !ok {
			return nil, false
		}
		out = append(out, v)
		i = next
		skip()
		if i == end {
			return out, true
		}
		if b[i] != ',' {
			return nil, false
		}
		i++
		skip()
		if i == end {
			return nil, false // a trailing comma: a value must follow it
		}
	}
}

// Uint32s parses b when it is an array of plain JSON integers from 0
// to 2^32-1 (no sign, fraction, exponent or leading zero).
func Uint32s(b []byte) ([]uint32, bool) {
	return Array(b, 2, func(b []byte, i, end int) (uint32, int, bool) {
		start := i
		var v uint64
		for i < end && b[i] >= '0' && b[i] <= '9' {
			v = v*10 + uint64(b[i]-'0')
			if v > 1<<32-1 {
				return 0, 0, false
			}
			i++
		}
		if i == start || (b[start] == '0' && i-start > 1) {
			return 0, 0, false
		}
		return uint32(v), i, true
	})
}
