package kvlayout

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

// TestBlockHashesGolden pins the definition: these values were computed
// with Python's hashlib from the definition in blockhash.go, and
// python/tests/test_blockhash.py checks pygd2fs against the same ones (and
// against `gd2fs session hashes` on random ids).
func TestBlockHashesGolden(t *testing.T) {
	for _, c := range []struct {
		ids  []uint32
		pt   int
		want []string
	}{
		{[]uint32{1, 2, 3, 4, 5}, 4, []string{"3a60ee17b8d4f5b7d56818719a9b6674", "328906f368fed69168af268de548ec6e"}},
		{[]uint32{0, 4294967295, 7}, 16, []string{"a6a0635f0b352475ee2fc14d16f60628"}},
		{nil, 4, nil},
	} {
		got := BlockHashes(c.ids, c.pt)
		if len(got) != len(c.want) {
			t.Fatalf("%v in blocks of %d: %d hashes, want %d", c.ids, c.pt, len(got), len(c.want))
		}
		for i := range got {
			if got[i].String() != c.want[i] {
				t.Fatalf("%v in blocks of %d: hash %d is %s, want %s", c.ids, c.pt, i, got[i], c.want[i])
			}
		}
	}
}

// TestBlockHashChain: a block's hash covers every block before it, so two
// sequences share hashes exactly as far as they share whole blocks; a
// partial block's hash differs from the whole block's.
func TestBlockHashChain(t *testing.T) {
	a := make([]uint32, 1000) // over the hasher's 256-id buffer
	for i := range a {
		a[i] = uint32(i * 7)
	}
	b := append([]uint32(nil), a...)
	b[530] = 1
	ha, hb := BlockHashes(a, 64), BlockHashes(b, 64)
	for i := range ha {
		if (ha[i] == hb[i]) != (i < 530/64) {
			t.Fatalf("block %d: equal %v after an edit at token 530", i, ha[i] == hb[i])
		}
	}
	if p := BlockHashes(a[:100], 64); p[1] == ha[1] || p[0] != ha[0] {
		t.Fatal("a partial block hashes as the whole one, or the first block changed")
	}
	if HashBlock(BlockHash{}, a[:64]) != ha[0] || HashBlock(ha[0], a[64:128]) != ha[1] {
		t.Fatal("HashBlock does not chain as BlockHashes")
	}
	// The text form, and JSON.
	h, err := ParseBlockHash(ha[3].String())
	if err != nil || h != ha[3] {
		t.Fatalf("parse %s: %v %v", ha[3], h, err)
	}
	for _, bad := range []string{"", "00", "zz112233445566778899aabbccddeeff", "00112233445566778899aabbccddeeff00"} {
		if _, err := ParseBlockHash(bad); !errors.Is(err, errs.ErrBadRequest) {
			t.Fatalf("parse %q: %v", bad, err)
		}
	}
	js, _ := json.Marshal(ha[:2])
	var back []BlockHash
	if err := json.Unmarshal(js, &back); err != nil || back[0] != ha[0] || back[1] != ha[1] {
		t.Fatalf("JSON round trip %s: %v", js, err)
	}
	if err := json.Unmarshal([]byte(`["nothex"]`), &back); err == nil {
		t.Fatal("a bad hash in JSON was accepted")
	}
}

func FuzzParseBlockHash(f *testing.F) {
	f.Add("3a60ee17b8d4f5b7d56818719a9b6674")
	f.Add("3A60EE17B8D4F5B7D56818719A9B6674")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseBlockHash(s)
		if err == nil && len(s) != 32 {
			t.Fatalf("%q parsed as %s", s, h)
		}
	})
}
