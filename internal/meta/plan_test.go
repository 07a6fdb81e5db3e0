package meta

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestStoredForAndAfterCommit(t *testing.T) {
	pf := Layout{Model: "m-pf", Layers: 3, KVHeads: 1, HeadDim: 128, DType: "fp16", PageTokens: 32, Order: "page_first"}
	lf := pf
	lf.Order = "layer_first"
	rg := func(l Layout, start, n int64, path string, kv int64) Range {
		return Range{TokenStart: start, TokenLength: n, Path: path, KVStart: kv, KVLength: l.RangeBytes(n)}
	}
	type step struct {
		prompt, decode int64
		wantStored     []Range
		wantCached     int64
		after          []Range // ranges after committing the plan
	}
	page := pf.PageBytes()
	cases := []struct {
		name   string
		l      Layout
		ranges []Range
		steps  []step
	}{
		{
			// Issue 8's reproduction: 422 tokens, a rewind to 155, then 347.
			name: "page_first rewind inside a page", l: pf, ranges: []Range{rg(pf, 0, 422, "/f", 0)},
			steps: []step{
				{prompt: 155, wantStored: []Range{rg(pf, 0, 128, "/f", 0)}, wantCached: 128,
					after: []Range{rg(pf, 0, 128, "/f", 0), rg(pf, 128, 27, "/f", 14*page)}},
				{prompt: 347, wantStored: []Range{rg(pf, 0, 128, "/f", 0), rg(pf, 128, 27, "/f", 14*page)}, wantCached: 155},
			},
		},
		{
			name: "page_first rewind on a page boundary", l: pf, ranges: []Range{rg(pf, 0, 100, "/f", 0)},
			steps: []step{{prompt: 64, wantStored: []Range{rg(pf, 0, 64, "/f", 0)}, wantCached: 64,
				after: []Range{rg(pf, 0, 64, "/f", 0)}}}, // nothing fresh: the session is cut at 64
		},
		{
			name: "page_first rewind inside the first page", l: pf, ranges: []Range{rg(pf, 0, 100, "/f", 0)},
			steps: []step{{prompt: 20, decode: 4, wantCached: 0, after: []Range{rg(pf, 0, 24, "/f", 4*page)}}},
		},
		{
			name: "page_first rewind inside a prefix", l: pf, ranges: []Range{rg(pf, 0, 70, "/prefix", 0), rg(pf, 70, 50, "/f", 0)},
			steps: []step{{prompt: 40, decode: 1, wantStored: []Range{rg(pf, 0, 32, "/prefix", 0)}, wantCached: 32,
				after: []Range{rg(pf, 0, 32, "/prefix", 0), rg(pf, 32, 9, "/f", 2*page)}}},
		},
		{
			name: "layer_first rewind uses whole ranges only", l: lf, ranges: []Range{rg(lf, 0, 70, "/prefix", 0), rg(lf, 70, 50, "/f", 0)},
			steps: []step{
				{prompt: 100, wantStored: []Range{rg(lf, 0, 70, "/prefix", 0)}, wantCached: 70,
					after: []Range{rg(lf, 0, 70, "/prefix", 0), rg(lf, 70, 30, "/f", 2*page)}},
				{prompt: 40, wantCached: 0, after: []Range{rg(lf, 0, 40, "/f", 3*page)}},
			},
		},
		{
			name: "longer prompt uses everything", l: lf, ranges: []Range{rg(lf, 0, 16, "/a", 0), rg(lf, 16, 16, "/b", 0)},
			steps: []step{{prompt: 40, wantStored: []Range{rg(lf, 0, 16, "/a", 0), rg(lf, 16, 16, "/b", 0)}, wantCached: 32}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ranges := c.ranges
			for i, st := range c.steps {
				stored, cached := storedFor(c.l, ranges, st.prompt)
				if cached != st.wantCached || !reflect.DeepEqual(stored, st.wantStored) {
					t.Fatalf("step %d: stored %+v cached %d, want %+v cached %d", i, stored, cached, st.wantStored, st.wantCached)
				}
				if st.after == nil {
					continue
				}
				var fresh []Range
				if n := st.prompt + st.decode - cached; n > 0 {
					last := st.after[len(st.after)-1]
					fresh = []Range{rg(c.l, cached, n, last.Path, last.KVStart)}
				}
				next, err := afterCommit(c.l, ranges, cached, fresh)
				if err != nil || !reflect.DeepEqual(next, st.after) {
					t.Fatalf("step %d: after commit %+v (%v), want %+v", i, next, err, st.after)
				}
				if err := checkRanges(c.l, next); err != nil {
					t.Fatal(err)
				}
				ranges = next
			}
		})
	}
}

func TestAfterCommitRefuses(t *testing.T) {
	lf := Layout{Model: "m", Layers: 1, KVHeads: 1, HeadDim: 1, DType: "fp16", PageTokens: 16, Order: "layer_first"}
	pf := lf
	pf.Order = "page_first"
	ranges := []Range{{TokenStart: 0, TokenLength: 40, Path: "/f", KVLength: lf.RangeBytes(40)}}
	if _, err := afterCommit(lf, ranges, 16, nil); err == nil {
		t.Fatal("cut a layer_first range inside it")
	}
	if _, err := afterCommit(pf, ranges, 20, nil); err == nil {
		t.Fatal("cut a page_first range inside a page")
	}
	if _, err := afterCommit(pf, ranges, 16, []Range{{TokenStart: 17, TokenLength: 3}}); err == nil {
		t.Fatal("accepted a fresh range that leaves a gap")
	}
	if _, err := afterCommit(pf, nil, 16, nil); err == nil {
		t.Fatal("kept tokens a session does not have")
	}
	bad := []Range{{TokenStart: 0, TokenLength: 16, KVLength: lf.RangeBytes(16)}, {TokenStart: 8, TokenLength: 16, KVLength: lf.RangeBytes(16)}}
	if checkRanges(lf, bad) == nil {
		t.Fatal("overlapping ranges pass the invariant")
	}
}

// TestPlanAnswerIsMarshal: the answer a plan keeps for a repeat of its
// request id is what json.Marshal writes of it, escapes included.
func TestPlanAnswerIsMarshal(t *testing.T) {
	for _, p := range []Plan{
		{},
		{ID: 7, Verified: 32, Stored: []Range{{Path: "/kv/s<1>&", TokenLength: 16, KVLength: 4096}}, Fresh: []Range{{Path: "/kv/é", TokenStart: 16}},
			Cached: 16, Evicted: []string{"a\"b", "\n"}, FreshFile: File{ID: 3, Path: "/kv/s"}, FreshChunks: []Chunk{{ID: 9, Replicas: []string{"s0"}}},
			Repeat: true, Shortened: "server_down", ShortenedTokens: 5},
	} {
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := planAnswer(&p)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Fatalf("planAnswer %s, json.Marshal %s", got, want)
		}
	}
}
