package master

import (
	"encoding/hex"
	"encoding/json"

	"github.com/gd2fs/gd2fs/internal/api"
	"github.com/gd2fs/gd2fs/internal/fastjson"
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
	if ids, ok := fastjson.Uint32s(b); ok {
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

// parseHashes parses b when it is an array of JSON strings of exactly
// 2*BlockHashSize hex digits with no escapes.
func parseHashes(b []byte) ([]kvlayout.BlockHash, bool) {
	const w = 2 * kvlayout.BlockHashSize
	return fastjson.Array(b, w+3, func(b []byte, i, end int) (kvlayout.BlockHash, int, bool) {
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
