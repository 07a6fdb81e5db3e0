package master

import (
	"encoding/hex"
	"encoding/json"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/kvlayout"
)

// A plan request is mostly its prompt's token ids (or block hashes):
// thousands of numbers that encoding/json decodes one reflective step at a
// time — about a tenth of the master's CPU under chat-turn load (a profile
// of gd2fs-bench turns, issue 20). The master decodes plan requests into
// planWire, whose two arrays parse by hand in the common form (plain
// numbers, plain hex strings) and fall back to encoding/json for anything
// else, so every request decodes to what it did before and every bad one
// gets encoding/json's error (FuzzPlanWire compares the two).

// planWire is api.PlanRequest as the master decodes it: its fields, with
// token_ids and block_hashes shadowed by the hand-parsed lists.
type planWire struct {
	api.PlanRequest
	TokenIDs    tokenIDList   `json:"token_ids,omitempty"`
	BlockHashes blockHashList `json:"block_hashes,omitempty"`
}

func (w *planWire) request() api.PlanRequest {
	r := w.PlanRequest
	r.TokenIDs, r.BlockHashes = w.TokenIDs, w.BlockHashes
	return r
}

// planBatchWire is api.PlanBatchRequest with planWire plans.
type planBatchWire struct {
	Plans []struct {
		Session   string   `json:"session"`
		RequestID string   `json:"request_id,omitempty"`
		Plan      planWire `json:"plan"`
	} `json:"plans"`
}

func (w *planBatchWire) request() api.PlanBatchRequest {
	var out api.PlanBatchRequest
	if w.Plans != nil {
		out.Plans = make([]api.PlanBatchItem, len(w.Plans))
	}
	for i := range w.Plans {
		p := &w.Plans[i]
		out.Plans[i] = api.PlanBatchItem{Session: p.Session, RequestID: p.RequestID, Plan: p.Plan.request()}
	}
	return out
}

type tokenIDList []uint32

func (l *tokenIDList) UnmarshalJSON(b []byte) error {
	if ids, ok := parseUint32s(b); ok {
		*l = ids
		return nil
	}
	var ids []uint32
	if err := json.Unmarshal(b, &ids); err != nil {
		return err
	}
	*l = ids
	return nil
}

type blockHashList []kvlayout.BlockHash

func (l *blockHashList) UnmarshalJSON(b []byte) error {
	if hs, ok := parseHashes(b); ok {
		*l = hs
		return nil
	}
	var hs []kvlayout.BlockHash
	if err := json.Unmarshal(b, &hs); err != nil {
		return err
	}
	*l = hs
	return nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// elements checks that b is a JSON array, '[' to ']' with nothing around
// it, and counts its top-level commas plus one (0 for an empty array): an
// upper bound on its elements, so that a list is allocated once. ok false:
// not an array (or not one that the hand parsers below take).
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

// parseArray parses b when it is a JSON array of elements that one reads:
// one is given b, where the element starts and where the array's contents
// end, and answers the element and where it ends (ok false: not one it
// takes). minLen is the fewest bytes an element and its comma take: the
// list's room is bounded by it, because elements' count of commas also
// counts those inside strings, and a bad body of nothing but commas must
// not make the decoder allocate for each. ok false: anything else, which
// encoding/json then decodes or refuses.
func parseArray[T any](b []byte, minLen int, one func(b []byte, i, end int) (T, int, bool)) ([]T, bool) {
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

// parseUint32s parses b when it is an array of plain JSON integers from 0
// to 2^32-1 (no sign, fraction, exponent or leading zero).
func parseUint32s(b []byte) ([]uint32, bool) {
	return parseArray(b, 2, func(b []byte, i, end int) (uint32, int, bool) {
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

// parseHashes parses b when it is an array of JSON strings of exactly
// 2*BlockHashSize hex digits with no escapes.
func parseHashes(b []byte) ([]kvlayout.BlockHash, bool) {
	const w = 2 * kvlayout.BlockHashSize
	return parseArray(b, w+3, func(b []byte, i, end int) (kvlayout.BlockHash, int, bool) {
		var h kvlayout.BlockHash
		if end-i < w+2 || b[i] != '"' || b[i+w+1] != '"' {
			return h, 0, false
		}
		if _, err := hex.Decode(h[:], b[i+1:i+w+1]); err != nil {
			return h, 0, false
		}
		return h, i + w + 2, true
	})
}
