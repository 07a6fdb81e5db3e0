package fastjson

import (
	"strings"
	"testing"
)

// TestRaw: Raw returns the bytes of one plain value of any kind, as
// encoding/json would store them into a json.RawMessage, and turns down
// what is not plain or nests deeper than maxRawDepth (left to
// encoding/json by its callers).
func TestRaw(t *testing.T) {
	for _, c := range []struct {
		doc, want string
		ok        bool
	}{
		{`{"a": {"b":[1, -2.5e3, true,"x",{}], "c":[]} }`, `{"b":[1, -2.5e3, true,"x",{}], "c":[]}`, true},
		{`{"a":"s"}`, `"s"`, true},
		{`{"a":false}`, `false`, true},
		{`{"a":null}`, ``, false},
		{`{"a":"\u0041"}`, ``, false},
		{`{"a":[1,]}`, ``, false},
		{`{"a":01}`, ``, false},
		{`{"a":` + strings.Repeat("[", maxRawDepth+1) + strings.Repeat("]", maxRawDepth+1) + `}`, strings.Repeat("[", maxRawDepth+1) + strings.Repeat("]", maxRawDepth+1), true},
		{`{"a":` + strings.Repeat("[", maxRawDepth+2) + strings.Repeat("]", maxRawDepth+2) + `}`, ``, false},
	} {
		s := NewScanner([]byte(c.doc))
		var got []byte
		s.Object(func(k []byte) { got = s.Raw() })
		if ok := s.End(); ok != c.ok || ok && string(got) != c.want {
			t.Errorf("%s: Raw %q, plain %v; want %q, %v", c.doc, got, ok, c.want, c.ok)
		}
	}
}
