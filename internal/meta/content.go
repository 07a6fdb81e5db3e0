package meta

import (
	"encoding/binary"
	"encoding/hex"
	"strings"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/kvlayout"
)

// The content check of explicit-mode plans (docs/kv-cache.md "The content
// check"), as pure functions like the rules of plan.go. Token counts alone
// cannot tell a prompt whose user edited an earlier message from the one
// the session stored; so a session keeps, per block of the layout's
// page_tokens, the chained hash of the token ids its KV was computed from
// (kvlayout.BlockHashes), and a plan may use stored KV only as far as the
// prompt's hashes match.
//
// A session's hashes cover its first hashed tokens (hashed <= tokens): one
// hash per block, the last of a partial block when hashed is not a multiple
// of page_tokens. Tokens past hashed (the room a plan reserved for decoded
// tokens, whose ids the master never sees; the tokens of a shared prefix
// registered without its ids; a plan made with UnsafeCountOnly) are stored
// but never vouched for, so a checked plan does not use them.

// BlockHash is the chained hash of one block of token ids.
type BlockHash = kvlayout.BlockHash

// prompt is what a plan knows of its prompt's content: n tokens and their
// block hashes (one per block, the last of a partial block), and the ids
// themselves when the request sent them (they let a session's partial last
// block be checked against a longer prompt).
type prompt struct {
	n      int64
	hashes []BlockHash
	ids    []uint32
}

// verified is how many leading tokens of the prompt the session's hashes
// vouch for: whole blocks while both hashes agree, and the session's
// partial last block when the prompt's first tokens of that block hash the
// same (with the ids; with hashes alone, only a prompt that ends exactly
// there can show it). Never more than the prompt or the hashed tokens.
func verified(pt int64, sess []BlockHash, hashed int64, p prompt) int64 {
	full := min(hashed/pt, p.n/pt)
	j := int64(0)
	for j < full && sess[j] == p.hashes[j] {
		j++
	}
	if j < full || hashed%pt == 0 || j != hashed/pt || p.n < hashed {
		return j * pt
	}
	// Every whole block of the session matched; its last block is partial
	// and the prompt covers it.
	var h BlockHash
	switch {
	case p.n == hashed:
		h = p.hashes[j]
	case p.ids != nil:
		var parent BlockHash
		if j > 0 {
			parent = p.hashes[j-1]
		}
		h = kvlayout.HashBlock(parent, p.ids[j*pt:hashed])
	default:
		return j * pt
	}
	if h == sess[j] {
		return hashed
	}
	return j * pt
}

// hashesAfterCommit is a session's hashes after a commit that kept the first
// keep tokens and now holds tokens in all. A checked plan knew its prompt's
// hashes (planHashes, from block planFrom on; planned = its prompt tokens):
// the session is then vouched for up to the prompt or what it holds,
// whichever ends first, rounded down to a whole block where that point is
// inside a block whose partial hash the plan does not know. A plan on counts
// alone (planned < 0) leaves the hashes it kept, up to keep (rounded down to
// a whole block likewise).
func hashesAfterCommit(pt int64, sess []BlockHash, hashed, keep, tokens int64, planFrom int64, planHashes []BlockHash, planned int64) ([]BlockHash, int64) {
	if planned < 0 {
		h := min(hashed, keep)
		if h < hashed && h%pt != 0 {
			h = h / pt * pt
		}
		return sess[: (h+pt-1)/pt : (h+pt-1)/pt], h
	}
	h := min(planned, tokens)
	if h < planned && h%pt != 0 {
		h = h / pt * pt
	}
	blocks := (h + pt - 1) / pt
	out := make([]BlockHash, 0, blocks)
	for b := int64(0); b < blocks; b++ {
		if b < planFrom {
			out = append(out, sess[b])
		} else {
			out = append(out, planHashes[b-planFrom])
		}
	}
	return out, h
}

// freshSplit is where a checked plan cuts its fresh range in two: at the
// end of the prompt (rounded down to a whole block for an engine of whole
// blocks), when that lies inside the range. The first part then holds only
// prompt tokens, whose content the commit records, so the next turn can
// load it whole; the second (the room for decoded tokens, whose ids the
// master never sees) is stored but not vouched for. Without the cut, a
// layer_first or kv_first range, which cannot be loaded in part, would be
// lost whole to its unverified tail. 0 means no cut.
func freshSplit(pt, start, end, prompt int64, aligned bool) int64 {
	at := prompt
	if aligned {
		at = prompt / pt * pt
	}
	if at <= start || at >= end {
		return 0
	}
	return at
}

// splitFresh is fr cut at token at (0: not cut), the second part's bytes
// following the first's (each part sized by the layout on its own).
func splitFresh(l Layout, fr Range, at int64) []Range {
	if at == 0 {
		fr.KVLength = l.RangeBytes(fr.TokenLength)
		return []Range{fr}
	}
	a, b := fr, fr
	a.TokenLength, a.KVLength = at-fr.TokenStart, l.RangeBytes(at-fr.TokenStart)
	b.TokenStart, b.TokenLength = at, fr.TokenStart+fr.TokenLength-at
	b.KVStart, b.KVLength = a.KVStart+a.KVLength, l.RangeBytes(b.TokenLength)
	return []Range{a, b}
}

// checkHashes is the invariant of a session's hashes: hashed tokens at most
// the tokens it holds, one hash per block of them.
func checkHashes(pt int64, hashes []BlockHash, hashed, tokens int64) error {
	if hashed < 0 || hashed > tokens {
		return errs.New(errs.ErrInternal, "%d hashed tokens of %d", hashed, tokens)
	}
	if int64(len(hashes)) != (hashed+pt-1)/pt {
		return errs.New(errs.ErrInternal, "%d block hashes for %d hashed tokens in blocks of %d", len(hashes), hashed, pt)
	}
	return nil
}

// encodeHashes is the column form of a list of hashes: hex, back to back.
func encodeHashes(hs []BlockHash) string {
	var b strings.Builder
	b.Grow(len(hs) * 2 * kvlayout.BlockHashSize)
	for _, h := range hs {
		b.WriteString(h.String())
	}
	return b.String()
}

func decodeHashes(s string) ([]BlockHash, error) {
	const w = 2 * kvlayout.BlockHashSize
	if len(s)%w != 0 {
		return nil, errs.New(errs.ErrInternal, "stored block hashes: %d hex digits, not a multiple of %d", len(s), w)
	}
	out := make([]BlockHash, len(s)/w)
	for i := range out {
		if _, err := hex.Decode(out[i][:], []byte(s[i*w:(i+1)*w])); err != nil {
			return nil, errs.New(errs.ErrInternal, "stored block hash %d: %v", i, err)
		}
	}
	return out, nil
}

// encodeIDs is the column form of token ids: hex of little-endian uint32s.
func encodeIDs(ids []uint32) string {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], id)
	}
	return hex.EncodeToString(b)
}

func decodeIDs(s string) ([]uint32, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b)%4 != 0 {
		return nil, errs.New(errs.ErrInternal, "stored token ids: not hex of uint32s (%d digits)", len(s))
	}
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out, nil
}
