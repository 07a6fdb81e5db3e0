package resp

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/internal/crc32c"
	"github.com/gd2fs/gd2fs/internal/kvstore"
)

func parseAll(in []byte, lim Limits, authed bool) ([][]string, error) {
	r := newReader(bytes.NewReader(in), lim)
	r.authed = authed
	var out [][]string
	var c command
	defer c.release()
	for {
		if err := r.next(&c); err != nil {
			return out, err
		}
		var args []string
		for _, a := range c.args {
			args = append(args, string(a))
		}
		out = append(out, args)
	}
}

func TestParse(t *testing.T) {
	lim := DefaultLimits()
	lim.LargeArgBuffer = 8 // exercise pooled buffers with small inputs
	got, err := parseAll([]byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n\r\n*0\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\n0123456789\r\n  echo   a  b \n"), lim, true)
	if err != io.EOF {
		t.Fatalf("err %v", err)
	}
	want := [][]string{{"GET", "k"}, {"PING"}, nil, {"SET", "k", "0123456789"}, {"echo", "a", "b"}}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range want {
		if strings.Join(got[i], "|") != strings.Join(want[i], "|") {
			t.Errorf("command %d: got %q, want %q", i, got[i], want[i])
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"*1\r\n$99999999999\r\n", "Protocol error: invalid bulk length"},
		{"*1\r\n*1\r\n", "Protocol error: expected '$', got '*'"},
		{"*1\r\n\r\n", "Protocol error: expected '$', got '\\n'"},
		{"*abc\r\n", "Protocol error: invalid multibulk length"},
		{"*2\r\n$1\r\na\r\n", "unexpected EOF"},
		{"*1\r\n$2\r\nab", "unexpected EOF"},
		{"*1\r\n$2\r\nabcd", "Protocol error: expected CRLF after a bulk string of 2 bytes"},
	} {
		_, err := parseAll([]byte(tc.in), DefaultLimits(), true)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: got %v, want %q", tc.in, err, tc.want)
		}
	}
	// Values over MaxValue are read past, not kept.
	lim := DefaultLimits()
	lim.MaxValue = 4
	r := newReader(strings.NewReader("*2\r\n$3\r\nSET\r\n$5\r\nabcde\r\n*1\r\n$4\r\nPING\r\n"), lim)
	r.authed = true
	var c command
	if err := r.next(&c); err != nil || c.skipped != 5 {
		t.Fatalf("over-limit: err %v skipped %d", err, c.skipped)
	}
	if err := r.next(&c); err != nil || string(c.args[0]) != "PING" {
		t.Fatalf("after over-limit: %v %q", err, c.args)
	}
}

// FuzzParse feeds arbitrary bytes to the request parser: it must never
// panic, never hold more than the limits allow, and return only protocol
// errors or io errors. The seed corpus runs in every `go test`.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n",
		"PING\r\n",
		"*1\r\n$1099511627776\r\n",
		"*1\r\n*1\r\n*1\r\n",
		"*-1\r\n*0\r\n",
		"$5\r\nhello\r\n",
		"*2\r\n$3\r\nGET\r\n$-1\r\n",
		"\x00\xff\r\n",
		"*1\r\n$3\r\nabc",
		"*5\r\n$1\r\na\r\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	lim := Limits{MaxArgs: 64, MaxBulk: 1 << 16, MaxValue: 1 << 12, MaxCommand: 1 << 17, MaxInline: 1 << 10,
		UnauthArgs: 10, UnauthBulk: 1 << 10, LargeArgBuffer: 256}
	f.Fuzz(func(t *testing.T, in []byte, authed bool) {
		r := newReader(bytes.NewReader(in), lim)
		r.authed = authed
		var c command
		defer c.release()
		for i := 0; ; i++ {
			err := r.next(&c)
			if err != nil {
				var pe protoError
				if !errors.As(err, &pe) && err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("unexpected error %T %v", err, err)
				}
				return
			}
			if len(c.args) > lim.MaxArgs || (!authed && len(c.args) > lim.UnauthArgs) {
				t.Fatalf("%d args", len(c.args))
			}
			total := 0
			for _, a := range c.args {
				if int64(len(a)) > lim.MaxValue || (!authed && int64(len(a)) > lim.UnauthBulk) {
					t.Fatalf("argument of %d bytes kept", len(a))
				}
				total += len(a)
			}
			if int64(total) > lim.MaxCommand {
				t.Fatalf("command of %d bytes", total)
			}
			if i > len(in) {
				t.Fatal("more commands than input bytes")
			}
		}
	})
}

// FuzzParseIntoDRAM: with SET values read into a store's DRAM pages
// (reader.direct), the parser reads the same commands as without, every
// reserved value carries the CRC32C of its bytes, and no page stays
// reserved once the commands are released.
func FuzzParseIntoDRAM(f *testing.F) {
	for _, s := range []string{
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$300\r\n" + strings.Repeat("v", 300) + "\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
		"*3\r\n$3\r\nset\r\n$1\r\nk\r\n$300\r\n" + strings.Repeat("v", 300) + "xx",
		"*3\r\n$3\r\nSeT\r\n$1\r\nk\r\n$300\r\n" + strings.Repeat("v", 100),
		"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$300\r\n" + strings.Repeat("v", 300) + "\r\n$2\r\nNX\r\n",
		"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$300\r\n" + strings.Repeat("v", 300) + "\r\n",
	} {
		f.Add([]byte(s))
	}
	lim := Limits{MaxArgs: 64, MaxBulk: 1 << 16, MaxValue: 1 << 12, MaxCommand: 1 << 17, MaxInline: 1 << 10,
		UnauthArgs: 10, UnauthBulk: 1 << 10, LargeArgBuffer: 256}
	st, err := kvstore.Open(kvstore.Config{MemBytes: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		want, wantErr := parseAll(in, lim, true)
		r := newReader(bytes.NewReader(in), lim)
		r.authed = true
		r.direct = func(key []byte, n int64) *kvstore.Reservation {
			res, err := st.Reserve(key, n, true)
			if err != nil {
				return nil
			}
			return res
		}
		var c command
		var got [][]string
		for {
			err := r.next(&c)
			if err != nil {
				if (err == nil) != (wantErr == nil) || err.Error() != wantErr.Error() {
					t.Fatalf("into DRAM the parse ended with %v, through buffers with %v", err, wantErr)
				}
				break
			}
			if c.res != nil {
				crc := crc32c.Checksum(c.res.Views()...)
				if crc != c.resCRC {
					t.Fatalf("a reserved value's CRC is %08x, its bytes' %08x", c.resCRC, crc)
				}
				c.materialize()
			}
			var args []string
			for _, a := range c.args {
				args = append(args, string(a))
			}
			got = append(got, args)
		}
		c.release()
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("into DRAM the parser read %q, through buffers %q", got, want)
		}
		if used := st.Stats().MemUsed; used != 0 {
			t.Fatalf("%d bytes of DRAM still reserved", used)
		}
	})
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		p, s string
		want bool
	}{
		{"*", "", true}, {"*", "abc", true}, {"a*", "abc", true}, {"a*", "bac", false},
		{"*c", "abc", true}, {"a?c", "abc", true}, {"a?c", "ac", false},
		{"k[0-9]", "k5", true}, {"k[0-9]", "kx", false}, {"k[^0-9]", "kx", true},
		{"k[abc]", "kb", true}, {`a\*`, "a*", true}, {`a\*`, "ab", false},
		{"*metadata", "vllm@x@0metadata", true}, {"*metadata", "vllm@x@0kv_bytes", false},
		{"a*b*c", "aXXbYYc", true}, {"a*b*c", "aXXbYY", false}, {"[unterminated", "u", false},
		{strings.Repeat("*a", 50) + "b", strings.Repeat("a", 200), false}, // no exponential backtracking
	} {
		if got := globMatch(tc.p, tc.s); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.p, tc.s, got, tc.want)
		}
	}
}

func TestRange(t *testing.T) {
	for _, tc := range []struct {
		start, end, n int64
		from, to      int64
	}{
		{0, -1, 10, 0, 10}, {0, 3, 10, 0, 4}, {-3, -1, 10, 7, 10}, {5, 100, 10, 5, 10},
		{-100, 2, 10, 0, 3}, {8, 2, 10, 0, 0}, {0, -1, 0, 0, 0}, {-1, -5, 10, 0, 0},
	} {
		from, to := rangeOf(tc.start, tc.end, tc.n)
		if from != tc.from || to != tc.to {
			t.Errorf("rangeOf(%d, %d, %d) = [%d, %d), want [%d, %d)", tc.start, tc.end, tc.n, from, to, tc.from, tc.to)
		}
	}
	bufs := [][]byte{[]byte("abc"), []byte("def"), []byte("gh")}
	var got []byte
	for _, b := range cut(bufs, 2, 7) {
		got = append(got, b...)
	}
	if string(got) != "cdefg" {
		t.Errorf("cut: %q", got)
	}
}
