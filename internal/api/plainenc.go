package api

import (
	"encoding/hex"
	"math"
	"strconv"
	"time"

	"github.com/gd2fs/gd2fs/kvlayout"
)

// The messages of a chat turn — the client's plan and commit requests, the
// master's plan and commit answers — are also written by hand, to exactly
// the bytes encoding/json writes for them (TestPlainEncodeSameBytes and
// FuzzPlainEncode compare), when every value in them has the plain form
// the hand decoders read: strings of printable ASCII that encoding/json
// writes as they are, no engine flags, no attrs. Anything else (a false
// from an appender) is written by encoding/json as before. A token list of
// thousands of ids, encoded one reflective step each, was most of the
// client's request cost.

// plainString appends s quoted when encoding/json writes it as it is:
// printable ASCII but for the quote, the backslash and the HTML characters
// it escapes.
func plainString(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}

// plainFloat appends f as encoding/json writes a float64, in the range
// where it uses the 'f' format (no exponent to clean up).
func plainFloat(b []byte, f float64) ([]byte, bool) {
	if a := math.Abs(f); math.IsNaN(f) || a != 0 && (a < 1e-6 || a >= 1e21) {
		return b, false
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64), true
}

// plainTimeJSON appends t as its MarshalJSON writes it.
func plainTimeJSON(b []byte, t time.Time) ([]byte, bool) {
	b = append(b, '"')
	b, err := t.AppendText(b)
	return append(b, '"'), err == nil
}

// enc appends the fields of one JSON object, stopping at the first value
// without a plain form.
type enc struct {
	b     []byte
	ok    bool
	comma bool
}

func (e *enc) key(k string) {
	if e.comma {
		e.b = append(e.b, ',')
	}
	e.comma = true
	e.b = append(e.b, '"')
	e.b = append(e.b, k...)
	e.b = append(e.b, '"', ':')
}

func (e *enc) str(k, v string) {
	if e.ok {
		e.key(k)
		e.b, e.ok = plainString(e.b, v)
	}
}

func (e *enc) int(k string, v int64) {
	if e.ok {
		e.key(k)
		e.b = strconv.AppendInt(e.b, v, 10)
	}
}

func (e *enc) bool(k string, v bool) {
	if e.ok {
		e.key(k)
		e.b = strconv.AppendBool(e.b, v)
	}
}

func (e *enc) time(k string, t time.Time) {
	if e.ok {
		e.key(k)
		e.b, e.ok = plainTimeJSON(e.b, t)
	}
}

func (e *enc) strs(k string, v []string) {
	if !e.ok {
		return
	}
	e.key(k)
	if v == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, '[')
	for i, s := range v {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		if e.b, e.ok = plainString(e.b, s); !e.ok {
			return
		}
	}
	e.b = append(e.b, ']')
}

func (e *enc) ranges(k string, v []KVRange) {
	if !e.ok {
		return
	}
	e.key(k)
	if v == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, '[')
	for i, r := range v {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		o := enc{b: append(e.b, '{'), ok: true}
		o.int("token_start", r.TokenStart)
		o.int("token_length", r.TokenLength)
		o.str("kv_uri", r.KVURI)
		o.int("kv_start", r.KVStart)
		o.int("kv_length", r.KVLength)
		if e.b, e.ok = append(o.b, '}'), o.ok; !e.ok {
			return
		}
	}
	e.b = append(e.b, ']')
}

func (e *enc) file(f File) {
	o := enc{b: append(e.b, '{'), ok: len(f.Attrs) == 0}
	if f.ID != 0 {
		o.int("id", f.ID)
	}
	o.str("path", f.Path)
	if f.IsDir {
		o.bool("is_dir", true)
	}
	if f.Pool != "" {
		o.str("pool", f.Pool)
	}
	if f.ChunkSize != 0 {
		o.int("chunk_size", f.ChunkSize)
	}
	o.int("size", f.Size)
	if f.Sealed {
		o.bool("sealed", true)
	}
	if f.CommitRecordsSize {
		o.bool("commit_records_size", true)
	}
	o.time("modified", f.Modified)
	if len(f.Chunks) > 0 && o.ok {
		o.key("chunks")
		o.b = append(o.b, '[')
		for i, c := range f.Chunks {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			ch := enc{b: append(o.b, '{'), ok: true}
			ch.int("index", c.Index)
			ch.key("id")
			ch.b = strconv.AppendUint(ch.b, c.ID, 10)
			ch.int("length", c.Length)
			ch.key("replicas")
			if c.Replicas == nil {
				ch.b = append(ch.b, "null"...)
			} else {
				ch.b = append(ch.b, '[')
				for j, r := range c.Replicas {
					if j > 0 {
						ch.b = append(ch.b, ',')
					}
					re := enc{b: append(ch.b, '{'), ok: ch.ok}
					re.str("server", r.Server)
					re.str("addr", r.Addr)
					re.bool("up", r.Up)
					ch.b, ch.ok = append(re.b, '}'), re.ok
				}
				ch.b = append(ch.b, ']')
			}
			if o.b, o.ok = append(ch.b, '}'), ch.ok; !o.ok {
				break
			}
		}
		o.b = append(o.b, ']')
	}
	e.b, e.ok = append(o.b, '}'), o.ok
}

// AppendPlanJSON appends p as json.Marshal writes it and says whether it
// could (false: p has a value without a plain form; use encoding/json).
func AppendPlanJSON(b []byte, p *Plan) ([]byte, bool) {
	e := enc{b: append(b, '{'), ok: true}
	e.int("plan_id", p.PlanID)
	e.ranges("stored_kv_cache", p.Stored)
	e.ranges("fresh_kv_cache", p.Fresh)
	e.int("cached_tokens", p.CachedTokens)
	e.int("verified_tokens", p.VerifiedTokens)
	if p.Shortened != "" {
		e.str("shortened", p.Shortened)
	}
	if p.ShortenedTokens != 0 {
		e.int("shortened_tokens", p.ShortenedTokens)
	}
	e.int("prefill_tokens", p.PrefillTokens)
	e.int("decode_tokens", p.DecodeTokens)
	e.int("load_bytes", p.LoadBytes)
	if e.ok {
		e.key("hit_rate")
		e.b, e.ok = plainFloat(e.b, p.HitRate)
	}
	if len(p.Evicted) > 0 {
		e.strs("evicted_sessions", p.Evicted)
	}
	if len(p.FreshFiles) > 0 && e.ok {
		e.key("fresh_files")
		e.b = append(e.b, '[')
		for i, f := range p.FreshFiles {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			if e.file(f); !e.ok {
				break
			}
		}
		e.b = append(e.b, ']')
	}
	return append(e.b, '}'), e.ok
}

// AppendSessionJSON appends s as json.Marshal writes it and says whether
// it could.
func AppendSessionJSON(b []byte, s *Session) ([]byte, bool) {
	e := enc{b: append(b, '{'), ok: true}
	e.str("id", s.ID)
	e.str("model", s.Model)
	e.int("tokens", s.Tokens)
	e.int("bytes", s.Bytes)
	e.time("last_used", s.LastUsed)
	e.time("created", s.Created)
	if len(s.Ranges) > 0 {
		e.ranges("ranges", s.Ranges)
	}
	e.int("hashed_tokens", s.HashedTokens)
	return append(e.b, '}'), e.ok
}

// appendRequest appends the JSON of a request Do sends, as json.Marshal
// writes it, for the requests of a chat turn; false for anything else.
func appendRequest(b []byte, in any) ([]byte, bool) {
	switch r := in.(type) {
	case PlanRequest:
		if b == nil {
			b = make([]byte, 0, 128+8*len(r.TokenIDs)+(2*kvlayout.BlockHashSize+3)*len(r.BlockHashes))
		}
		return appendPlanRequest(b, &r)
	case PlanBatchRequest:
		if b == nil {
			n := 0
			for _, p := range r.Plans {
				n += 128 + len(p.Session) + len(p.RequestID) + 8*len(p.Plan.TokenIDs) + (2*kvlayout.BlockHashSize+3)*len(p.Plan.BlockHashes)
			}
			b = make([]byte, 0, 16+n)
		}
		return appendPlanBatchRequest(b, &r)
	case CommitBatchRequest:
		if b == nil {
			n := 16
			for _, c := range r.Commits {
				n += 64 + len(c.Session)
				if c.Fresh != nil {
					n += 160 * len(*c.Fresh)
				}
			}
			b = make([]byte, 0, n)
		}
		return appendCommitBatchRequest(b, &r)
	case CommitSessionRequest:
		if b == nil {
			n := 0
			if r.Fresh != nil {
				n = len(*r.Fresh)
			}
			b = make([]byte, 0, 64+160*n)
		}
		return appendCommitRequest(b, &r)
	}
	return b, false
}

func appendPlanRequest(b []byte, r *PlanRequest) ([]byte, bool) {
	if len(r.Flags) > 0 {
		return b, false
	}
	e := enc{b: append(b, '{'), ok: true}
	e.str("model", r.Model)
	if len(r.Prefixes) > 0 {
		e.strs("prefixes", r.Prefixes)
	}
	e.int("prompt_tokens", r.PromptTokens)
	if len(r.TokenIDs) > 0 && e.ok {
		e.key("token_ids")
		b := append(e.b, '[')
		for i, id := range r.TokenIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(id), 10)
		}
		e.b = append(b, ']')
	}
	if len(r.BlockHashes) > 0 && e.ok {
		e.key("block_hashes")
		b := append(e.b, '[')
		for i, h := range r.BlockHashes {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = hex.AppendEncode(b, h[:])
			b = append(b, '"')
		}
		e.b = append(b, ']')
	}
	if r.UnsafeCountOnly {
		e.bool("unsafe_count_only", true)
	}
	if r.DecodeTokens != 0 {
		e.int("decode_tokens", r.DecodeTokens)
	}
	if r.NewFile {
		e.bool("new_file", true)
	}
	if r.Format != "" {
		e.str("format", r.Format)
	}
	if r.LoadThreshold != 0 {
		e.int("load_threshold", r.LoadThreshold)
	}
	return append(e.b, '}'), e.ok
}

func appendCommitRequest(b []byte, r *CommitSessionRequest) ([]byte, bool) {
	if r.KVCacheParams != nil {
		return b, false
	}
	e := enc{b: append(b, '{'), ok: true}
	if r.PlanID != 0 {
		e.int("plan_id", r.PlanID)
	}
	if r.Fresh != nil {
		e.ranges("fresh_kvcache", *r.Fresh)
	}
	if r.Written {
		e.bool("written", true)
	}
	return append(e.b, '}'), e.ok
}

// appendPlanBatchRequest appends a batch of plans (a client's coalesced
// plans): each plan as appendPlanRequest writes it.
func appendPlanBatchRequest(b []byte, r *PlanBatchRequest) ([]byte, bool) {
	if r.Plans == nil {
		return b, false
	}
	b = append(b, `{"plans":[`...)
	for i := range r.Plans {
		p := &r.Plans[i]
		if i > 0 {
			b = append(b, ',')
		}
		e := enc{b: append(b, '{'), ok: true}
		e.str("session", p.Session)
		if p.RequestID != "" {
			e.str("request_id", p.RequestID)
		}
		if !e.ok {
			return b, false
		}
		e.key("plan")
		var ok bool
		if b, ok = appendPlanRequest(e.b, &p.Plan); !ok {
			return b, false
		}
		b = append(b, '}')
	}
	return append(b, ']', '}'), true
}

// appendCommitBatchRequest appends a batch of commits, plain or an
// engine's (fresh_kvcache).
func appendCommitBatchRequest(b []byte, r *CommitBatchRequest) ([]byte, bool) {
	if r.Commits == nil {
		return b, false
	}
	b = append(b, `{"commits":[`...)
	for i := range r.Commits {
		c := &r.Commits[i]
		if i > 0 {
			b = append(b, ',')
		}
		e := enc{b: append(b, '{'), ok: true}
		e.str("session", c.Session)
		e.int("plan_id", c.PlanID)
		if c.Written {
			e.bool("written", true)
		}
		if c.Fresh != nil {
			e.ranges("fresh_kvcache", *c.Fresh)
		}
		if !e.ok {
			return b, false
		}
		b = append(e.b, '}')
	}
	return append(b, ']', '}'), true
}

// AppendPlanBatchAnswerJSON appends a's JSON as json.Marshal writes it
// (each plan's bytes as they are: written by AppendPlanJSON, they are
// what json.Marshal writes of a json.RawMessage) and says whether it
// could.
func AppendPlanBatchAnswerJSON(b []byte, a *PlanBatchAnswer) ([]byte, bool) {
	if a.Plans == nil {
		return b, false
	}
	b = append(b, `{"plans":[`...)
	for i, r := range a.Plans {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		if len(r.Plan) > 0 {
			b = append(b, `"plan":`...)
			b = append(b, r.Plan...)
		}
		if r.Error != nil {
			if len(r.Plan) > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendError(b, r.Error); !ok {
				return b, false
			}
		}
		b = append(b, '}')
	}
	return append(b, ']', '}'), true
}

// AppendCommitBatchAnswerJSON appends a's JSON as json.Marshal writes it
// and says whether it could.
func AppendCommitBatchAnswerJSON(b []byte, a *CommitBatchAnswer) ([]byte, bool) {
	if a.Commits == nil {
		return b, false
	}
	b = append(b, `{"commits":[`...)
	for i, r := range a.Commits {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		var ok bool
		if r.Session != nil {
			b = append(b, `"session":`...)
			if b, ok = AppendSessionJSON(b, r.Session); !ok {
				return b, false
			}
		}
		if r.Error != nil {
			if r.Session != nil {
				b = append(b, ',')
			}
			if b, ok = appendError(b, r.Error); !ok {
				return b, false
			}
		}
		b = append(b, '}')
	}
	return append(b, ']', '}'), true
}

// appendError appends "error":{"error":...,"code":...}.
func appendError(b []byte, e *Error) ([]byte, bool) {
	x := enc{b: append(b, `"error":{`...), ok: true}
	x.str("error", e.Error)
	x.str("code", e.Code)
	return append(x.b, '}'), x.ok
}

// AppendEnginePlanJSON appends p as json.Marshal writes it and says
// whether it could (engine flags are left to encoding/json).
func AppendEnginePlanJSON(b []byte, p *EnginePlan) ([]byte, bool) {
	k := &p.KVCacheParams
	e := enc{b: append(b, '{'), ok: len(k.Flags) == 0}
	if e.ok {
		e.key("kvcache_params")
		o := enc{b: append(e.b, '{'), ok: true}
		o.str("id", k.ID)
		o.ranges("stored_kvcache", k.Stored)
		o.ranges("fresh_kvcache", k.Fresh)
		o.int("load_threshold", k.LoadThreshold)
		e.b, e.ok = append(o.b, '}'), o.ok
	}
	e.int("plan_id", p.PlanID)
	e.int("cached_tokens", p.CachedTokens)
	e.int("verified_tokens", p.VerifiedTokens)
	if p.Shortened != "" {
		e.str("shortened", p.Shortened)
	}
	if p.ShortenedTokens != 0 {
		e.int("shortened_tokens", p.ShortenedTokens)
	}
	e.int("prefill_tokens", p.PrefillTokens)
	e.int("decode_tokens", p.DecodeTokens)
	e.int("load_bytes", p.LoadBytes)
	if e.ok {
		e.key("hit_rate")
		e.b, e.ok = plainFloat(e.b, p.HitRate)
	}
	if len(p.Evicted) > 0 {
		e.strs("evicted_sessions", p.Evicted)
	}
	return append(e.b, '}'), e.ok
}
