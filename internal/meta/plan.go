package meta

import (
	"fmt"

	"github.com/gd2fs/gd2fs/errs"
)

// The rules of explicit-mode sessions as pure functions over a session's
// ranges, so they can be read and tested without a database; sessions.go
// loads the ranges, calls these, and stores the result.
//
// A session's ranges always satisfy checkRanges: sorted, disjoint,
// contiguous from token 0. A range's bytes are never rewritten (fresh bytes
// are reserved at the end of a file), so a range keeps meaning the KV it was
// committed with for as long as it exists.

// storedFor is what a prompt of n tokens can load: the session's ranges that
// end inside the prompt and, when the prompt ends inside a page_first range,
// that range's whole pages (their bytes are a prefix of the range's bytes).
// A layer_first range the prompt ends inside is not used at all: each layer
// of it is laid out over all its pages, so no prefix of its bytes is a
// prefix of its tokens. cached is where the stored ranges end.
func storedFor(l Layout, ranges []Range, n int64) (stored []Range, cached int64) {
	for _, r := range ranges {
		if r.TokenStart+r.TokenLength <= n {
			stored = append(stored, r)
			cached = r.TokenStart + r.TokenLength
			continue
		}
		if c, ok := clip(l, r, n-r.TokenStart); ok {
			stored = append(stored, c)
			cached = c.TokenStart + c.TokenLength
		}
		break
	}
	return stored, cached
}

// clip is the first tokens of r rounded down to whole pages, when the layout
// allows using part of a range; ok is false when nothing of r is usable.
func clip(l Layout, r Range, tokens int64) (Range, bool) {
	// Per-rank regions are laid out by the range's full length, so only a
	// single-region page_first range has its pages as a byte prefix.
	if l.Order != "page_first" || l.Regions() != 1 {
		return Range{}, false
	}
	pages := tokens / int64(l.PageTokens)
	if pages < 1 {
		return Range{}, false
	}
	r.TokenLength = pages * int64(l.PageTokens)
	r.KVLength = pages * l.PageBytes()
	return r, true
}

// storedAligned is storedFor for engines that load and save whole blocks
// (the vllm format): every stored range starts and ends on a page boundary,
// and the stored tokens end at or before the last whole page that leaves the
// prompt's last token to compute (engines need at least one token to
// prefill to produce logits). A range of the session that is not whole
// pages ends the stored run there (cut to whole pages where clip allows).
// Nothing past valid is used (the tokens the content check vouched for).
func storedAligned(l Layout, ranges []Range, n, valid int64) (stored []Range, cached int64) {
	pt := int64(l.PageTokens)
	limit := min((n-1)/pt*pt, valid/pt*pt)
	for _, r := range ranges {
		end := r.TokenStart + r.TokenLength
		if r.TokenStart%pt != 0 || r.TokenStart >= limit {
			break
		}
		if end <= limit && end%pt == 0 {
			stored = append(stored, r)
			cached = end
			continue
		}
		if c, ok := clip(l, r, min(end, limit)-r.TokenStart); ok {
			stored = append(stored, c)
			cached = c.TokenStart + c.TokenLength
		}
		break
	}
	return stored, cached
}

// checkSaved checks what an engine reports it saved of a plan's fresh
// range fr: segments that follow each other from fr's first token, whole
// pages (but for one that ends exactly where fr ends, or at split, where
// the plan cut fr: an engine that saved exactly the plan's fresh ranges),
// sized by the layout, in fr's file, inside fr's reserved bytes and not
// overlapping.
func checkSaved(l Layout, fr Range, split int64, saved []Range) error {
	pt := int64(l.PageTokens)
	at, kvAt := fr.TokenStart, fr.KVStart
	for i, s := range saved {
		switch {
		case s.Path != fr.Path:
			return errs.New(errs.ErrBadRequest, "saved segment %d names %s; the plan reserved %s", i, s.Path, fr.Path)
		case s.TokenStart != at:
			return errs.New(errs.ErrBadRequest, "saved segment %d starts at token %d; it must continue at %d (segments in order, no gaps or overlaps)", i, s.TokenStart, at)
		case s.TokenLength < 1 || s.TokenLength > fr.TokenStart+fr.TokenLength-at:
			return errs.New(errs.ErrBadRequest, "saved segment %d has %d tokens; the plan reserved tokens %d to %d", i, s.TokenLength, fr.TokenStart, fr.TokenStart+fr.TokenLength)
		case s.TokenLength%pt != 0 && s.TokenStart+s.TokenLength != fr.TokenStart+fr.TokenLength && (split == 0 || s.TokenStart+s.TokenLength != split):
			return errs.New(errs.ErrBadRequest, "saved segment %d has %d tokens, not whole blocks of %d", i, s.TokenLength, pt)
		case s.KVLength != l.RangeBytes(s.TokenLength):
			return errs.New(errs.ErrBadRequest, "saved segment %d: %d tokens take %d bytes in this layout, not %d", i, s.TokenLength, l.RangeBytes(s.TokenLength), s.KVLength)
		case s.KVStart < kvAt || s.KVStart > fr.KVStart+fr.KVLength-s.KVLength:
			return errs.New(errs.ErrBadRequest, "saved segment %d (bytes %d+%d) lies outside the plan's reserved bytes %d+%d or overlaps the previous segment",
				i, s.KVStart, s.KVLength, fr.KVStart, fr.KVLength)
		}
		at += s.TokenLength
		kvAt = s.KVStart + s.KVLength
	}
	return nil
}

// afterCommit is a session's ranges after committing a plan that kept the
// first keep tokens (the plan's cached tokens) and wrote fresh, which must
// start at keep and follow each other. Everything from keep on is dropped:
// a rewind replaces the tokens after it, it does not patch them. A range
// that straddles keep is cut to its first keep-start tokens, which is only
// possible where storedFor could have stopped there (a page boundary of a
// page_first range).
func afterCommit(l Layout, ranges []Range, keep int64, fresh []Range) ([]Range, error) {
	var out []Range
	for _, r := range ranges {
		end := r.TokenStart + r.TokenLength
		switch {
		case end <= keep:
			out = append(out, r)
		case r.TokenStart < keep:
			c, ok := clip(l, r, keep-r.TokenStart)
			if !ok || c.TokenStart+c.TokenLength != keep {
				return nil, errs.New(errs.ErrInternal, "session ranges cannot be cut at token %d (range %d+%d, %s)", keep, r.TokenStart, r.TokenLength, l.Order)
			}
			out = append(out, c)
		}
	}
	at := int64(0)
	if len(out) > 0 {
		at = out[len(out)-1].TokenStart + out[len(out)-1].TokenLength
	}
	if at != keep {
		return nil, errs.New(errs.ErrInternal, "session ranges end at token %d, before the %d the plan kept", at, keep)
	}
	for _, f := range fresh {
		if f.TokenStart != at || f.TokenLength < 1 {
			return nil, errs.New(errs.ErrBadRequest, "fresh range %d+%d does not continue the session at token %d", f.TokenStart, f.TokenLength, at)
		}
		out = append(out, f)
		at += f.TokenLength
	}
	return out, nil
}

// checkRanges is the invariant of a session's ranges: sorted, disjoint,
// contiguous from token 0, each non-empty and sized by the layout (whole
// pages, the last one padded).
func checkRanges(l Layout, ranges []Range) error {
	var at int64
	for i, r := range ranges {
		if r.TokenStart != at {
			return fmt.Errorf("range %d starts at token %d, the previous one ends at %d", i, r.TokenStart, at)
		}
		if r.TokenLength < 1 || r.KVStart < 0 || r.KVLength != l.RangeBytes(r.TokenLength) {
			return fmt.Errorf("range %d (%d+%d tokens, bytes %d+%d) is empty or not sized by the layout (%d bytes)",
				i, r.TokenStart, r.TokenLength, r.KVStart, r.KVLength, l.RangeBytes(r.TokenLength))
		}
		at += r.TokenLength
	}
	return nil
}

// planStored sets p's Verified, Stored and Cached for a plan of in on a
// session that holds ranges, vouched for by hashes (of its first hashed
// tokens), and returns where the plan's tokens end (rounded up to whole
// pages when aligned). The plan made in SQL and the one answered from the
// leader's memory (writebehind.go) both decide their stored part here.
func planStored(p *Plan, l Layout, in PlanInput, hashes []BlockHash, hashed int64, ranges []Range, pr prompt, checked bool) (end int64) {
	n := in.PromptTokens
	end = n + in.DecodeTokens
	pt := int64(l.PageTokens)
	// valid: the tokens whose stored KV may be used, those the session's
	// hashes vouch for (all, on counts alone).
	valid := n
	if checked {
		valid = verified(pt, hashes, hashed, pr)
	}
	p.Verified = valid
	if in.Aligned {
		p.Stored, p.Cached = storedAligned(l, ranges, n, valid)
		end = (end + pt - 1) / pt * pt
	} else {
		p.Stored, p.Cached = storedFor(l, ranges, valid)
	}
	return end
}

// planReachable cuts p's stored part before its first range that down
// says is on no reachable server (the engine would fail to load it).
func planReachable(p *Plan, down func(Range) (bool, error)) error {
	for i, r := range p.Stored {
		d, err := down(r)
		if err != nil {
			return err
		}
		if d {
			p.Shortened, p.ShortenedTokens = "server_down", p.Cached-r.TokenStart
			p.Stored, p.Cached = p.Stored[:i], r.TokenStart
			return nil
		}
	}
	return nil
}

// planCounts sets p's bytes to load and tokens to prefill and decode
// from its stored part.
func planCounts(p *Plan, in PlanInput) {
	for _, r := range p.Stored {
		p.Load += r.KVLength
	}
	p.Prefill = in.PromptTokens - p.Cached
	p.Decode = in.DecodeTokens
}
