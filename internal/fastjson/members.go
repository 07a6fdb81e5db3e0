package fastjson

import "encoding/json"

// Members splits b, a JSON object, into its members as json.Unmarshal into
// a map[string]json.RawMessage does — each value's bytes as they are (here
// views of b, not copies), a repeated key's last value — for the router,
// which reads every completion request so (a prompt of thousands of token
// ids took encoding/json 70 µs). Unlike Scanner it takes every valid
// value: strings with escapes and any bytes from 0x20 up (encoding/json
// keeps a RawMessage's bytes, valid UTF-8 or not), null, nesting to
// maxMembersDepth. Keys must be plain (printable ASCII without escapes),
// since encoding/json unescapes keys and mends bad UTF-8 in them. ok
// false: anything else, which the caller hands to encoding/json for its
// result or its error (FuzzMembers compares the two).
func Members(b []byte) (map[string]json.RawMessage, bool) {
	v := validator{b: b}
	v.ws()
	if v.i >= len(b) || b[v.i] != '{' {
		return nil, false
	}
	v.i++
	m := map[string]json.RawMessage{}
	v.ws()
	if v.i < len(b) && b[v.i] == '}' {
		v.i++
	} else {
		for {
			v.ws()
			key, ok := v.plainKey()
			if !ok {
				return nil, false
			}
			if v.ws(); v.i >= len(b) || b[v.i] != ':' {
				return nil, false
			}
			v.i++
			v.ws()
			start := v.i
			if !v.value(1) {
				return nil, false
			}
			m[string(key)] = b[start:v.i:v.i] // an append to it copies, never writes over b
			v.ws()
			if v.i >= len(b) {
				return nil, false
			}
			if b[v.i] == '}' {
				v.i++
				break
			}
			if b[v.i] != ',' {
				return nil, false
			}
			v.i++
		}
	}
	v.ws()
	return m, v.i == len(b)
}

// maxMembersDepth bounds the nesting Members follows (a chat's messages,
// their content parts and tool schemas nest a few levels); a deeper
// document is left to encoding/json.
const maxMembersDepth = 64

// validator reads JSON values for Members, checking RFC 8259's grammar as
// encoding/json's scanner does.
type validator struct {
	b []byte
	i int
}

func (v *validator) ws() {
	for v.i < len(v.b) && isSpace(v.b[v.i]) {
		v.i++
	}
}

// plainKey reads a key of printable ASCII without escapes.
func (v *validator) plainKey() ([]byte, bool) {
	if v.i >= len(v.b) || v.b[v.i] != '"' {
		return nil, false
	}
	start := v.i + 1
	for j := start; j < len(v.b); j++ {
		switch c := v.b[j]; {
		case c == '"':
			v.i = j + 1
			return v.b[start:j], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// value reads one value at v.i (no white space before it) at nesting
// depth.
func (v *validator) value(depth int) bool {
	if v.i >= len(v.b) {
		return false
	}
	switch c := v.b[v.i]; {
	case c == '"':
		return v.str()
	case c == '{' || c == '[':
		if depth >= maxMembersDepth {
			return false
		}
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		v.i++
		v.ws()
		if v.i < len(v.b) && v.b[v.i] == end {
			v.i++
			return true
		}
		for {
			v.ws()
			if c == '{' {
				if v.i >= len(v.b) || v.b[v.i] != '"' || !v.str() {
					return false
				}
				if v.ws(); v.i >= len(v.b) || v.b[v.i] != ':' {
					return false
				}
				v.i++
				v.ws()
			}
			if !v.value(depth + 1) {
				return false
			}
			v.ws()
			if v.i >= len(v.b) {
				return false
			}
			if v.b[v.i] == end {
				v.i++
				return true
			}
			if v.b[v.i] != ',' {
				return false
			}
			v.i++
		}
	case c == 't':
		return v.word("true")
	case c == 'f':
		return v.word("false")
	case c == 'n':
		return v.word("null")
	default:
		return v.number()
	}
}

func (v *validator) word(w string) bool {
	if !hasPrefix(v.b[v.i:], w) {
		return false
	}
	v.i += len(w)
	return true
}

// str reads a string: no control characters, only JSON's escapes.
func (v *validator) str() bool {
	for j := v.i + 1; j < len(v.b); j++ {
		switch c := v.b[j]; {
		case c == '"':
			v.i = j + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			j++
			if j >= len(v.b) {
				return false
			}
			switch v.b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(v.b) {
					return false
				}
				for _, h := range v.b[j+1 : j+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return false
					}
				}
				j += 4
			default:
				return false
			}
		}
	}
	return false
}

// number reads a number of RFC 8259's grammar.
func (v *validator) number() bool {
	b, j := v.b, v.i
	digits := func() bool {
		k := j
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		return j > k
	}
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case !digits():
		return false
	}
	if j < len(b) && b[j] == '.' {
		j++
		if !digits() {
			return false
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if !digits() {
			return false
		}
	}
	v.i = j
	return true
}
