package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"time"

	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/fastjson"
)

// A chat turn is two master calls, a plan and a commit, and decoding their
// answers with encoding/json's reflection was half of the client's HTTP
// exchange (a profile of gd2fs-bench turns, issue 20). The answers a turn
// gets — Plan (EnginePlan for the router) and Session — decode by hand in their plain form (the form
// the master writes: no escapes, no nulls, known keys once each), and by
// encoding/json's Decoder, as every answer always did, in any other form,
// so an answer decodes to exactly what it did before and a bad one gets
// the same error (FuzzAnswerDecode compares the two).

// plainDecoder is an answer type with a hand decoder of its plain form.
type plainDecoder interface {
	// decodePlain decodes b, the whole body, into the receiver when b is
	// in the plain form, and says whether it did; it leaves the receiver
	// as it was when not.
	decodePlain(b []byte) bool
}

// bodies holds the buffers answers are read into before a hand decoder
// runs: what it keeps it copies.
var bodies = bufpool.NewBuffers(64 << 10)

// readAnswer decodes the answer body r into out as json.Decoder.Decode
// did (the first JSON value; what follows it is not looked at), by hand
// when out has a hand decoder, is a zero value (encoding/json merges into
// what is there) and the body is plain.
func readAnswer(r io.Reader, out any) error {
	pd, ok := out.(plainDecoder)
	if !ok || !reflect.ValueOf(out).Elem().IsZero() {
		return json.NewDecoder(r).Decode(out)
	}
	buf := bodies.Get()
	defer bodies.Put(buf)
	_, rerr := buf.ReadFrom(r)
	if pd.decodePlain(buf.Bytes()) {
		return nil // all of it was read and it is a whole answer
	}
	// What was read decodes as the Decoder would have decoded the stream:
	// it reads up to the first value's end, so an answer cut after it still
	// decodes, one cut within it fails with the read's error, and a syntax
	// error before the cut is that syntax error.
	err := json.NewDecoder(bytes.NewReader(buf.Bytes())).Decode(out)
	if rerr != nil && (err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF)) {
		return rerr
	}
	return err
}

// decodePlain implements plainDecoder.
func (p *Plan) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v Plan
	scanPlan(s, &v)
	if !s.End() {
		return false
	}
	*p = v
	return true
}

// scanPlan reads a plan's object into v.
func scanPlan(s *fastjson.Scanner, v *Plan) {
	var seen uint64
	s.Object(func(k []byte) {
		switch string(k) {
		case "plan_id":
			s.Seen(&seen, 0)
			v.PlanID = s.Int()
		case "stored_kv_cache":
			s.Seen(&seen, 1)
			v.Stored = ScanKVRanges(s)
		case "fresh_kv_cache":
			s.Seen(&seen, 2)
			v.Fresh = ScanKVRanges(s)
		case "cached_tokens":
			s.Seen(&seen, 3)
			v.CachedTokens = s.Int()
		case "verified_tokens":
			s.Seen(&seen, 4)
			v.VerifiedTokens = s.Int()
		case "shortened":
			s.Seen(&seen, 5)
			v.Shortened = s.String()
		case "shortened_tokens":
			s.Seen(&seen, 6)
			v.ShortenedTokens = s.Int()
		case "prefill_tokens":
			s.Seen(&seen, 7)
			v.PrefillTokens = s.Int()
		case "decode_tokens":
			s.Seen(&seen, 8)
			v.DecodeTokens = s.Int()
		case "load_bytes":
			s.Seen(&seen, 9)
			v.LoadBytes = s.Int()
		case "hit_rate":
			s.Seen(&seen, 10)
			v.HitRate = s.Float()
		case "evicted_sessions":
			s.Seen(&seen, 11)
			v.Evicted = []string{}
			s.Array(func() { v.Evicted = append(v.Evicted, s.String()) })
		case "fresh_files":
			s.Seen(&seen, 12)
			v.FreshFiles = []File{}
			s.Array(func() {
				var f File
				plainFile(s, &f)
				v.FreshFiles = append(v.FreshFiles, f)
			})
		default:
			s.Fail()
		}
	})
}

// decodePlain implements plainDecoder.
func (ss *Session) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v Session
	scanSession(s, &v)
	if !s.End() {
		return false
	}
	*ss = v
	return true
}

// scanSession reads a session's object into v.
func scanSession(s *fastjson.Scanner, v *Session) {
	var seen uint64
	s.Object(func(k []byte) {
		switch string(k) {
		case "id":
			s.Seen(&seen, 0)
			v.ID = s.String()
		case "model":
			s.Seen(&seen, 1)
			v.Model = s.String()
		case "tokens":
			s.Seen(&seen, 2)
			v.Tokens = s.Int()
		case "bytes":
			s.Seen(&seen, 3)
			v.Bytes = s.Int()
		case "last_used":
			s.Seen(&seen, 4)
			plainTime(s, &v.LastUsed)
		case "created":
			s.Seen(&seen, 5)
			plainTime(s, &v.Created)
		case "ranges":
			s.Seen(&seen, 6)
			v.Ranges = ScanKVRanges(s)
		case "hashed_tokens":
			s.Seen(&seen, 7)
			v.HashedTokens = s.Int()
		default:
			s.Fail()
		}
	})
}

// A client's coalesced plans and commits come back as batches
// (PlanBatchAnswer, CommitBatchAnswer): their hand decoders read the plain
// form as the single answers' do, each plan kept as the bytes the master
// wrote (DecodePlan reads them) and each session decoded in place.

// decodePlain implements plainDecoder.
func (a *PlanBatchAnswer) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v PlanBatchAnswer
	var seen uint64
	s.Object(func(k []byte) {
		if string(k) != "plans" {
			s.Fail()
			return
		}
		s.Seen(&seen, 0)
		v.Plans = []PlanBatchResult{}
		s.Array(func() {
			var r PlanBatchResult
			var seen uint64
			s.Object(func(k []byte) {
				switch string(k) {
				case "plan":
					s.Seen(&seen, 0)
					r.Plan = append(json.RawMessage(nil), s.Raw()...) // the body's buffer is reused
				case "error":
					s.Seen(&seen, 1)
					r.Error = scanError(s)
				default:
					s.Fail()
				}
			})
			v.Plans = append(v.Plans, r)
		})
	})
	if !s.End() {
		return false
	}
	*a = v
	return true
}

// decodePlain implements plainDecoder.
func (a *CommitBatchAnswer) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v CommitBatchAnswer
	var seen uint64
	s.Object(func(k []byte) {
		if string(k) != "commits" {
			s.Fail()
			return
		}
		s.Seen(&seen, 0)
		v.Commits = []CommitBatchResult{}
		s.Array(func() {
			var r CommitBatchResult
			var seen uint64
			s.Object(func(k []byte) {
				switch string(k) {
				case "session":
					s.Seen(&seen, 0)
					r.Session = new(Session)
					scanSession(s, r.Session)
				case "error":
					s.Seen(&seen, 1)
					r.Error = scanError(s)
				default:
					s.Fail()
				}
			})
			v.Commits = append(v.Commits, r)
		})
	})
	if !s.End() {
		return false
	}
	*a = v
	return true
}

// scanError reads an Error's object.
func scanError(s *fastjson.Scanner) *Error {
	var e Error
	var seen uint64
	s.Object(func(k []byte) {
		switch string(k) {
		case "error":
			s.Seen(&seen, 0)
			e.Error = s.String()
		case "code":
			s.Seen(&seen, 1)
			e.Code = s.String()
		default:
			s.Fail()
		}
	})
	return &e
}

// DecodePlan decodes a plan of a PlanBatchAnswer into p (a zero Plan) as
// json.Unmarshal does, by hand when it is in the plain form.
func DecodePlan(raw json.RawMessage, p *Plan) error {
	if p.decodePlain(raw) {
		return nil
	}
	return json.Unmarshal(raw, p)
}

// DecodeEnginePlan decodes an engine-format plan of a PlanBatchAnswer
// into p (a zero EnginePlan) as json.Unmarshal does, by hand when it is in
// the plain form (flags are left to encoding/json).
func DecodeEnginePlan(raw json.RawMessage, p *EnginePlan) error {
	if p.decodePlain(raw) {
		return nil
	}
	return json.Unmarshal(raw, p)
}

// plainTime reads a time as encoding/json does: the quoted string handed
// to time.Time's UnmarshalJSON.
func plainTime(s *fastjson.Scanner, t *time.Time) {
	if q := s.QuotedString(); !s.OK() || t.UnmarshalJSON(q) != nil {
		s.Fail()
	}
}

// ScanKVRanges reads a list of KVRange in its plain form (see
// fastjson.Scanner; the master's commit requests use it too): unknown or
// repeated keys fail the scanner.
func ScanKVRanges(s *fastjson.Scanner) []KVRange {
	out := []KVRange{}
	s.Array(func() {
		var r KVRange
		var seen uint64
		s.Object(func(k []byte) {
			switch string(k) {
			case "token_start":
				s.Seen(&seen, 0)
				r.TokenStart = s.Int()
			case "token_length":
				s.Seen(&seen, 1)
				r.TokenLength = s.Int()
			case "kv_uri":
				s.Seen(&seen, 2)
				r.KVURI = s.String()
			case "kv_start":
				s.Seen(&seen, 3)
				r.KVStart = s.Int()
			case "kv_length":
				s.Seen(&seen, 4)
				r.KVLength = s.Int()
			default:
				s.Fail()
			}
		})
		out = append(out, r)
	})
	return out
}

// plainFile reads a File without attrs (a plan's fresh files have none).
func plainFile(s *fastjson.Scanner, f *File) {
	var seen uint64
	s.Object(func(k []byte) {
		switch string(k) {
		case "id":
			s.Seen(&seen, 0)
			f.ID = s.Int()
		case "path":
			s.Seen(&seen, 1)
			f.Path = s.String()
		case "is_dir":
			s.Seen(&seen, 2)
			f.IsDir = s.Bool()
		case "pool":
			s.Seen(&seen, 3)
			f.Pool = s.String()
		case "chunk_size":
			s.Seen(&seen, 4)
			f.ChunkSize = s.Int()
		case "size":
			s.Seen(&seen, 5)
			f.Size = s.Int()
		case "sealed":
			s.Seen(&seen, 6)
			f.Sealed = s.Bool()
		case "modified":
			s.Seen(&seen, 7)
			plainTime(s, &f.Modified)
		case "chunks":
			s.Seen(&seen, 8)
			f.Chunks = []Chunk{}
			s.Array(func() {
				var c Chunk
				plainChunk(s, &c)
				f.Chunks = append(f.Chunks, c)
			})
		default:
			s.Fail()
		}
	})
}

func plainChunk(s *fastjson.Scanner, c *Chunk) {
	var seen uint64
	s.Object(func(k []byte) {
		switch string(k) {
		case "index":
			s.Seen(&seen, 0)
			c.Index = s.Int()
		case "id":
			s.Seen(&seen, 1)
			c.ID = s.Uint()
		case "length":
			s.Seen(&seen, 2)
			c.Length = s.Int()
		case "replicas":
			s.Seen(&seen, 3)
			c.Replicas = []Replica{}
			s.Array(func() {
				var r Replica
				var seen uint64
				s.Object(func(k []byte) {
					switch string(k) {
					case "server":
						s.Seen(&seen, 0)
						r.Server = s.String()
					case "addr":
						s.Seen(&seen, 1)
						r.Addr = s.String()
					case "up":
						s.Seen(&seen, 2)
						r.Up = s.Bool()
					default:
						s.Fail()
					}
				})
				c.Replicas = append(c.Replicas, r)
			})
		default:
			s.Fail()
		}
	})
}

// decodePlain implements plainDecoder: an engine-format plan, as the
// router gets one for each request (kvcache_params with flags are left to
// encoding/json).
func (p *EnginePlan) decodePlain(b []byte) bool {
	s := fastjson.NewScanner(b)
	var v EnginePlan
	var seen uint64
	s.Object(func(k []byte) {
		switch string(k) {
		case "kvcache_params":
			s.Seen(&seen, 0)
			scanKVCacheParams(s, &v.KVCacheParams)
		case "plan_id":
			s.Seen(&seen, 1)
			v.PlanID = s.Int()
		case "cached_tokens":
			s.Seen(&seen, 2)
			v.CachedTokens = s.Int()
		case "verified_tokens":
			s.Seen(&seen, 3)
			v.VerifiedTokens = s.Int()
		case "shortened":
			s.Seen(&seen, 4)
			v.Shortened = s.String()
		case "shortened_tokens":
			s.Seen(&seen, 5)
			v.ShortenedTokens = s.Int()
		case "prefill_tokens":
			s.Seen(&seen, 6)
			v.PrefillTokens = s.Int()
		case "decode_tokens":
			s.Seen(&seen, 7)
			v.DecodeTokens = s.Int()
		case "load_bytes":
			s.Seen(&seen, 8)
			v.LoadBytes = s.Int()
		case "hit_rate":
			s.Seen(&seen, 9)
			v.HitRate = s.Float()
		case "evicted_sessions":
			s.Seen(&seen, 10)
			v.Evicted = []string{}
			s.Array(func() { v.Evicted = append(v.Evicted, s.String()) })
		default:
			s.Fail()
		}
	})
	if !s.End() {
		return false
	}
	*p = v
	return true
}

// scanKVCacheParams reads kvcache_params without flags, as its
// UnmarshalJSON sets them: the whole value replaced.
func scanKVCacheParams(s *fastjson.Scanner, k *KVCacheParams) {
	var seen uint64
	s.Object(func(key []byte) {
		switch string(key) {
		case "id":
			s.Seen(&seen, 0)
			k.ID = s.String()
		case "stored_kvcache":
			s.Seen(&seen, 1)
			k.Stored = ScanKVRanges(s)
		case "fresh_kvcache":
			s.Seen(&seen, 2)
			k.Fresh = ScanKVRanges(s)
		case "load_threshold":
			s.Seen(&seen, 3)
			k.LoadThreshold = s.Int()
		default:
			s.Fail()
		}
	})
}
