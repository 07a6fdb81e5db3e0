package wire

import (
	"errors"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

func TestChainHint(t *testing.T) {
	for _, h := range []ChainHint{{}, {Pos: 1}, {Pos: 7, Leaf: true}, {Pos: 1<<32 - 1, Leaf: true}} {
		got, ok, err := DecodeChain(h.Encode())
		if err != nil || !ok || got != h {
			t.Fatalf("%+v: decoded %+v ok=%v err=%v", h, got, ok, err)
		}
	}
	if _, ok, err := DecodeChain(0); ok || err != nil {
		t.Fatalf("0 is no hint: ok=%v err=%v", ok, err)
	}
	for _, c := range []uint64{1, 1 << 62, 1<<63 | 1<<40, 1<<63 | 1<<32} {
		if _, _, err := DecodeChain(c); !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("%#x: want a bad request, got %v", c, err)
		}
	}
}

func FuzzDecodeChain(f *testing.F) {
	f.Add(uint64(0))
	f.Add(ChainHint{Pos: 3, Leaf: true}.Encode())
	f.Fuzz(func(t *testing.T, c uint64) {
		h, ok, err := DecodeChain(c)
		if err != nil {
			return
		}
		if ok && h.Encode() != c {
			t.Fatalf("%#x decodes to %+v which encodes to %#x", c, h, h.Encode())
		}
		if !ok && c != 0 {
			t.Fatalf("%#x: no hint and no error", c)
		}
	})
}
