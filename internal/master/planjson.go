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
	Plans []planBatchWireItem `json:"plans"`
}

type planBatchWireItem struct {
	Session   string   `json:"session"`
	RequestID string   `json:"request_id,omitempty"`
	Plan      planWire `json:"plan"`
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

// Whole requests decode by hand, too, in their plain form: encoding/json's
// Decoder scans every byte of a body before it decodes it and reflects on
// each field, several per cent of the master's CPU under chat turns even
// with the arrays parsed by hand. decodeStrict tries a request's hand
// decoder first; one that turns the body down (any escape, null, unknown
// or repeated key, flags, anything after the value) leaves it to
// encoding/json, which gives the same request or the same error
// (FuzzPlanWire compares them).

// plainDecoder is a request type with a hand decoder of its plain form.
type plainDecoder interface {
	// decodePlain decodes b, the whole body, into the receiver when b is
	// in the plain form, and says whether it did; it leaves the receiver
	// as it was when not.
	decodePlain(b []byte) bool
}

// decodePlain implements plainDecoder.
func (w *planWire) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v planWire
	v.scan(s)
	if !s.End() {
		return false
	}
	*w = v
	return true
}

// scan reads a plan request's object into v.
func (v *planWire) scan(s *fastjson.Scanner) {
	var seen uint64
	s.Object(func(k []byte) {
		switch string(k) {
		case "model":
			s.Seen(&seen, 0)
			v.Model = s.String()
		case "prefixes":
			s.Seen(&seen, 1)
			v.Prefixes = []string{}
			s.Array(func() { v.Prefixes = append(v.Prefixes, s.String()) })
		case "prompt_tokens":
			s.Seen(&seen, 2)
			v.PromptTokens = s.Int()
		case "token_ids":
			s.Seen(&seen, 3)
			ids, ok := fastjson.Uint32s(s.Span())
			if !ok {
				s.Fail()
			}
			v.TokenIDs = ids
		case "block_hashes":
			s.Seen(&seen, 4)
			hs, ok := parseHashes(s.Span())
			if !ok {
				s.Fail()
			}
			v.BlockHashes = hs
		case "unsafe_count_only":
			s.Seen(&seen, 5)
			v.UnsafeCountOnly = s.Bool()
		case "decode_tokens":
			s.Seen(&seen, 6)
			v.DecodeTokens = s.Int()
		case "new_file":
			s.Seen(&seen, 7)
			v.NewFile = s.Bool()
		case "format":
			s.Seen(&seen, 8)
			v.Format = s.String()
		case "load_threshold":
			s.Seen(&seen, 9)
			v.LoadThreshold = s.Int()
		default: // flags (any JSON scalars) and unknown keys
			s.Fail()
		}
	})
}

// decodePlain implements plainDecoder: a batch of plans (a client's
// coalesced plans), each read as planWire reads a single one.
func (w *planBatchWire) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v planBatchWire
	var seen uint64
	s.Object(func(k []byte) {
		if string(k) != "plans" {
			s.Fail()
			return
		}
		s.Seen(&seen, 0)
		v.Plans = []planBatchWireItem{} // present: an empty list, not nil
		s.Array(func() {
			v.Plans = append(v.Plans, planBatchWireItem{})
			it := &v.Plans[len(v.Plans)-1]
			var seen uint64
			s.Object(func(k []byte) {
				switch string(k) {
				case "session":
					s.Seen(&seen, 0)
					it.Session = s.String()
				case "request_id":
					s.Seen(&seen, 1)
					it.RequestID = s.String()
				case "plan":
					s.Seen(&seen, 2)
					it.Plan.scan(s)
				default:
					s.Fail()
				}
			})
		})
	})
	if !s.End() {
		return false
	}
	*w = v
	return true
}

// commitWire is api.CommitSessionRequest as the master decodes it.
type commitWire struct {
	api.CommitSessionRequest
}

// decodePlain implements plainDecoder: a plan id, written, and an
// engine's saved fresh_kvcache (its kvcache_params are left to
// encoding/json: an engine's own, decoded leniently).
func (w *commitWire) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v commitWire
	var seen uint64
	s.Object(func(k []byte) {
		switch string(k) {
		case "plan_id":
			s.Seen(&seen, 0)
			v.PlanID = s.Int()
		case "fresh_kvcache":
			s.Seen(&seen, 1)
			rs := api.ScanKVRanges(s)
			v.Fresh = &rs
		case "written":
			s.Seen(&seen, 2)
			v.Written = s.Bool()
		default:
			s.Fail()
		}
	})
	if !s.End() {
		return false
	}
	*w = v
	return true
}

// commitBatchWire is api.CommitBatchRequest as the master decodes it.
type commitBatchWire struct {
	api.CommitBatchRequest
}

// decodePlain implements plainDecoder: a batch of commits (a client's
// coalesced commits), each item's fields as commitWire reads them.
func (w *commitBatchWire) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v commitBatchWire
	var seen uint64
	s.Object(func(k []byte) {
		if string(k) != "commits" {
			s.Fail()
			return
		}
		s.Seen(&seen, 0)
		v.Commits = []api.CommitBatchItem{} // present: an empty list, not nil
		s.Array(func() {
			v.Commits = append(v.Commits, api.CommitBatchItem{})
			it := &v.Commits[len(v.Commits)-1]
			var seen uint64
			s.Object(func(k []byte) {
				switch string(k) {
				case "session":
					s.Seen(&seen, 0)
					it.Session = s.String()
				case "plan_id":
					s.Seen(&seen, 1)
					it.PlanID = s.Int()
				case "written":
					s.Seen(&seen, 2)
					it.Written = s.Bool()
				case "fresh_kvcache":
					s.Seen(&seen, 3)
					rs := api.ScanKVRanges(s)
					it.Fresh = &rs
				default:
					s.Fail()
				}
			})
		})
	})
	if !s.End() {
		return false
	}
	*w = v
	return true
}
