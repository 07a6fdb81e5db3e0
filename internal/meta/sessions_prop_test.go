package meta

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/kvlayout"
)

var long = flag.Bool("long", false, "run the long versions of the property tests (thousands of plans)")

// TestSessionProperty drives random multi-turn traffic through the session
// store (both layouts, several workers planning at once, forks, rewinds to
// arbitrary token counts, edits of an earlier token that keep the prompt's
// length or make it longer, plans by token ids, by block hashes and on
// counts alone, abandoned and competing plans, deletes, quota evictions)
// against a model that remembers the conversation behind every committed
// token. The "disk" is a map holding the bytes each plan's fresh
// range was written with, at the offsets the plan gave. After every plan:
// each stored range reads back exactly the KV of the session's current
// conversation for those tokens, ranges are contiguous from token 0, and
// cached_tokens equals the model's.
func TestSessionProperty(t *testing.T) {
	propertyRuns(t, engines(t), 240, 0, false, nil, nil)
}

// propertyRuns runs the property test on each of engs (plans plans, 6,000
// with -long; 4 workers), each store first given to prepare if set and to
// check after, if set.
func propertyRuns(t *testing.T, engs map[string]func(t *testing.T) Store, plans int, seed uint64, lossy bool, prepare, check func(t *testing.T, s Store)) {
	if *long {
		plans = 6000
	}
	for name, open := range engs {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			if prepare != nil {
				prepare(t, s)
			}
			runSessionProperty(t, s, plans, 4, uint64(len(name))+seed, lossy)
			if check != nil {
				check(t, s)
			}
		})
	}
}

// propLayouts: page sizes that put clip positions everywhere; prefix
// lengths that end inside a page.
var propLayouts = []struct {
	l      Layout
	prefix int64
}{
	{Layout{Model: "pf4", Layers: 2, KVHeads: 1, HeadDim: 4, DType: "bf16", PageTokens: 4, Order: "page_first"}, 13},
	{Layout{Model: "pf16", Layers: 3, KVHeads: 1, HeadDim: 2, DType: "fp16", PageTokens: 16, Order: "page_first"}, 37},
	{Layout{Model: "lf8", Layers: 2, KVHeads: 2, HeadDim: 2, DType: "fp32", PageTokens: 8, Order: "layer_first"}, 21},
	{Layout{Model: "kf4tp2", Layers: 2, KVHeads: 2, HeadDim: 2, DType: "fp16", PageTokens: 4, Order: "kv_first", TPSize: 2}, 16},
	{Layout{Model: "pf4tp2", Layers: 1, KVHeads: 4, HeadDim: 2, DType: "bf16", PageTokens: 4, Order: "page_first", TPSize: 2}, 9},
}

// conv is a conversation: token ids and the running hash of every prefix,
// so the KV of token i is a function of tokens 0..i, as in a transformer.
type conv struct{ ids, h []uint64 }

func (c conv) prefix(n int64) conv { return conv{ids: c.ids[:n:n], h: c.h[:n:n]} }

func (c conv) push(id uint64) conv {
	prev := uint64(0x9e3779b97f4a7c15)
	if len(c.h) > 0 {
		prev = c.h[len(c.h)-1]
	}
	return conv{ids: append(c.ids, id), h: append(c.h, mix(prev^id))}
}

func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// encode is the KV of tokens [start, start+n) of c in layout l, as an
// engine would gather it from its paged memory: RangeBytes(n) bytes, one
// region per tensor-parallel rank (each rank's heads have their own KV).
func encode(l Layout, c conv, start, n int64) []byte {
	d := kvlayout.Desc{Layers: l.Layers, KVHeads: l.RankHeads(), HeadDim: l.HeadDim, DTypeSize: DTypeSize(l.DType), PageTokens: l.PageTokens}
	d.Order, _ = kvlayout.ParseOrder(l.Order)
	pages := int((n + int64(l.PageTokens) - 1) / int64(l.PageTokens))
	table := make([]int, pages)
	for i := range table {
		table[i] = i
	}
	out := make([]byte, l.RangeBytes(n))
	region := len(out) / l.Regions()
	for rank := 0; rank < l.Regions(); rank++ {
		p := kvlayout.NewPaged(d, pages)
		tok := d.KVHeads * d.HeadDim * d.DTypeSize // one token of one layer's K or V
		for i := int64(0); i < n; i++ {
			x := c.h[start+i] ^ uint64(rank)<<56
			for ly := 0; ly < d.Layers; ly++ {
				for _, side := range [][]byte{p.K[ly], p.V[ly]} {
					b := side[int(i)*tok : int(i+1)*tok]
					for j := range b {
						x = mix(x + uint64(j))
						b[j] = byte(x)
					}
				}
			}
		}
		if err := kvlayout.Gather(d, p, table, out[rank*region:(rank+1)*region]); err != nil {
			panic(err)
		}
	}
	return out
}

type seg struct{ start, n int64 }

// modelSession is what the test knows of a session: the conversation of
// its committed tokens, the token runs commits made, and its generation
// (creation time, which is unique per creation in this test).
type modelSession struct {
	layout  Layout
	c       conv
	segs    []seg
	created time.Time
	hashed  int64 // leading tokens of c the store's hashes vouch for
}

// How a plan tells the store what its prompt is.
const (
	byIDs = iota
	byHashes
	countOnly
)

// verified is the content check in the model's terms: the tokens of prompt
// p (n of them) that agree with the vouched-for conversation, in whole
// blocks, and up to the end of the hashed tokens when the last block is
// partial and the plan can show it (ids, or hashes of a prompt that ends
// exactly there).
func (m *modelSession) verified(p conv, n int64, mode int) int64 {
	if mode == countOnly {
		return n
	}
	pt, h := int64(m.layout.PageTokens), m.hashed
	l := int64(0)
	for l < n && l < h && p.ids[l] == m.c.ids[l] {
		l++
	}
	if l >= h && n >= h && (mode == byIDs || n == h || h%pt == 0) {
		return h
	}
	return min(l, n, h) / pt * pt
}

// afterCommit is the vouched-for length after a commit that kept keep
// tokens and holds tokens in all, of a plan for a prompt of n tokens.
func (m *modelSession) hashedAfter(keep, tokens, n int64, mode int) int64 {
	pt := int64(m.layout.PageTokens)
	if mode == countOnly {
		h := min(m.hashed, keep)
		if h < m.hashed && h%pt != 0 {
			h = h / pt * pt
		}
		return h
	}
	h := min(n, tokens)
	if h < n && h%pt != 0 {
		h = h / pt * pt
	}
	return h
}

func u32(ids []uint64) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

// cached is what a prompt of n tokens can use: whole runs, and of a
// page_first run the prompt ends inside, its whole pages.
func (m *modelSession) cached(n int64) int64 {
	var got int64
	for _, s := range m.segs {
		if s.start+s.n <= n {
			got = s.start + s.n
			continue
		}
		if m.layout.Order == "page_first" && m.layout.Regions() == 1 {
			got = s.start + (n-s.start)/int64(m.layout.PageTokens)*int64(m.layout.PageTokens)
		}
		break
	}
	return got
}

// cachedAligned is cached for an engine of whole blocks: runs that start
// and end on a block, up to the last whole block before the prompt's last
// token and no further than the verified tokens.
func (m *modelSession) cachedAligned(n, valid int64) int64 {
	pt := int64(m.layout.PageTokens)
	limit := min((n-1)/pt*pt, valid/pt*pt)
	var got int64
	for _, s := range m.segs {
		end := s.start + s.n
		if s.start%pt != 0 || s.start >= limit {
			break
		}
		if end <= limit && end%pt == 0 {
			got = end
			continue
		}
		if m.layout.Order == "page_first" && m.layout.Regions() == 1 {
			got = s.start + (min(end, limit)-s.start)/pt*pt
		}
		break
	}
	return got
}

// commit keeps the first keep tokens and appends the runs of fresh
// (start, length), which follow each other from keep.
func (m *modelSession) commit(keep int64, fresh []seg, c conv) {
	var out []seg
	for _, s := range m.segs {
		switch {
		case s.start+s.n <= keep:
			out = append(out, s)
		case s.start < keep:
			out = append(out, seg{s.start, keep - s.start})
		}
	}
	end := keep
	for _, f := range fresh {
		out = append(out, f)
		end = f.start + f.n
	}
	m.segs, m.c = out, c.prefix(end)
}

// fakeDisk holds the bytes written to session and prefix files.
type fakeDisk struct {
	mu    sync.Mutex
	files map[string][]byte
}

func (d *fakeDisk) write(path string, off int64, b []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.files[path]
	if need := off + int64(len(b)); int64(len(f)) < need {
		f = append(f, make([]byte, need-int64(len(f)))...)
	}
	copy(f[off:], b)
	d.files[path] = f
}

func (d *fakeDisk) read(path string, off, n int64) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.files[path]
	if off+n > int64(len(f)) {
		return nil
	}
	return append([]byte(nil), f[off:off+n]...)
}

// runSessionProperty runs the property test's traffic. lossy (window mode
// only) makes a random quarter of the leader's flushes fail: the operations
// it answered since the flush before are lost, so the model may be ahead
// of the store and the exact counts are not checked; what is checked is
// what a loss must never break: every stored range a plan hands out holds
// the KV of the conversation the plan was asked for, byte for byte, and
// plans keep their shape.
func runSessionProperty(t *testing.T, s Store, plans, workers int, seed uint64, lossy bool) {
	ctx := context.Background()
	var losses atomic.Int64
	if lossy {
		var mu sync.Mutex
		lr := rand.New(rand.NewPCG(seed, 77))
		fail := func() error {
			mu.Lock()
			lose := lr.IntN(4) == 0
			mu.Unlock()
			if !lose {
				return nil
			}
			losses.Add(1)
			return errs.New(errs.ErrUnavailable, "flush lost by the test")
		}
		flushHook.Store(&fail)
		defer flushHook.Store(nil)
	}
	// transient: an error a lost flush may give a caller (a read that
	// waited for the failed log): the step is given up.
	transient := func(err error) bool { return lossy && errors.Is(err, errs.ErrUnavailable) }
	disk := &fakeDisk{files: map[string][]byte{}}
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	tick := func() time.Time { return time.Unix(0, clock.Add(1000)) }
	prefixes := map[string]conv{}
	prefixHashed := map[string]int64{}
	for i, pl := range propLayouts {
		if err := s.PutLayout(ctx, pl.l); err != nil {
			t.Fatal(err)
		}
		var c conv
		for j := int64(0); j < pl.prefix; j++ {
			c = c.push(uint64(1000 + i*100 + int(j)))
		}
		path := "/prefixes/" + pl.l.Model
		f, err := s.CreateFile(ctx, File{Path: path, Pool: "ha", ChunkSize: 1 << 20, Modified: tick()})
		if err != nil {
			t.Fatal(err)
		}
		b := encode(pl.l, c, 0, pl.prefix)
		disk.write(path, 0, b)
		if _, err := s.Commit(ctx, f.ID, int64(len(b)), nil, true, tick()); err != nil {
			t.Fatal(err)
		}
		// Half the prefixes are registered with their token ids (a session
		// made with one starts with them vouched for), half without.
		pre := Prefix{Path: path, Model: pl.l.Model, Tokens: pl.prefix}
		if i%2 == 0 {
			pre.TokenIDs = u32(c.ids)
			prefixHashed[pl.l.Model] = pl.prefix
		}
		if err := s.PutPrefix(ctx, pre); err != nil {
			t.Fatal(err)
		}
		prefixes[pl.l.Model] = c
	}
	// A quota of a few sessions' worth, so evictions happen all the time
	// (and yet new sessions often fit, so that memory makes them, with
	// their prefix or without: writebehind.go, newSessionMem).
	quota := int64(0)
	for _, pl := range propLayouts {
		quota += 24 * pl.l.PageBytes()
	}
	var stats struct {
		sync.Mutex
		plans, checked, rewinds, edits, forks, deletes, evicted, refused, abandoned, recreated, rivals int
		modes                                                                                          [3]int
	}
	// covered: every kind of traffic the test must exercise has happened.
	// A worker goes on past its share of plans (up to 4 times it) until
	// then: which kinds a run draws depends on how the workers interleave,
	// and a short run under load could draw none of one (0 edits in 117
	// plans, once, in CI).
	covered := func() bool {
		stats.Lock()
		defer stats.Unlock()
		// (With lost flushes edits are rare: lost deletes and refused
		// commits keep sessions short. Not required there.)
		return stats.rewinds > 0 && stats.rivals > 0 && (stats.edits > 0 || lossy) && allModes(stats.modes, lossy) && stats.forks > 0 && stats.evicted > 0 && stats.refused > 0 && (!lossy || losses.Load() > 0)
	}
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			sessions := map[string]*modelSession{}
			var names []string
			nextName := 0
			// Half the sessions are made without the model's prefix (a
			// router's chats): their first plans may be answered from
			// memory (writebehind.go, newSessionMem).
			noPrefix := map[string]bool{}
			newName := func() string {
				nextName++
				id := fmt.Sprintf("w%d-s%d", w, nextName)
				noPrefix[id] = r.IntN(2) == 0
				return id
			}
			fail := func(format string, args ...any) {
				errc <- fmt.Errorf("worker %d: "+format, append([]any{w}, args...)...)
			}
			var nextID uint64 = uint64(w) << 26 // token ids are uint32
			token := func() uint64 { nextID++; return nextID }
			done := 0
			for step := 0; (done < plans/workers || (done < 4*plans/workers && !covered())) && step < 20*plans; step++ {
				// Pick or make a session.
				var id string
				if len(names) == 0 || r.IntN(8) == 0 {
					id = newName()
					names = append(names, id)
				} else {
					id = names[r.IntN(len(names))]
				}
				m := sessions[id]
				switch op := r.IntN(12); {
				case op == 0 && m != nil: // fork
					nid := newName()
					if err := s.ForkSession(ctx, id, nid, "", tick()); err != nil {
						if errors.Is(err, errs.ErrNotFound) || transient(err) { // evicted meanwhile
							delete(sessions, id)
							continue
						}
						fail("fork %s: %v", id, err)
						return
					}
					got, err := s.Session(ctx, nid)
					if errors.Is(err, errs.ErrNotFound) || transient(err) {
						continue // evicted at once by another worker
					} else if err != nil {
						fail("session %s: %v", nid, err)
						return
					}
					cp := *m
					cp.segs = append([]seg(nil), m.segs...)
					cp.created = got.Created
					sessions[nid] = &cp
					names = append(names, nid)
					stats.Lock()
					stats.forks++
					stats.Unlock()
					continue
				case op == 1 && m != nil: // delete
					if err := s.DeleteSession(ctx, id); err != nil && !errors.Is(err, errs.ErrNotFound) && !transient(err) {
						fail("delete %s: %v", id, err)
						return
					}
					delete(sessions, id)
					stats.Lock()
					stats.deletes++
					stats.Unlock()
					continue
				}
				pl := propLayouts[r.IntN(len(propLayouts))]
				if m != nil {
					for _, x := range propLayouts {
						if x.l.Model == m.layout.Model {
							pl = x
						}
					}
				}
				// The engine's conversation for this request.
				held := int64(0)
				if m != nil {
					held = int64(len(m.c.ids))
				}
				var prompt int64
				rewind, edit := false, false
				keepConv := held // tokens of the conversation the prompt keeps
				switch {
				case m == nil:
					prompt = pl.prefix + 1 + r.Int64N(50)
					keepConv = pl.prefix
				case held > 1 && r.IntN(6) == 0:
					// The user edits an earlier token: the prompt keeps its
					// length or grows, but differs from token keepConv on.
					edit = true
					keepConv = r.Int64N(held)
					prompt = held
					if r.IntN(2) == 0 {
						prompt += 1 + r.Int64N(30)
					}
				case held > 1 && r.IntN(4) == 0:
					rewind = true
					switch r.IntN(5) {
					case 0: // inside the first page (or to almost nothing)
						prompt = 1 + r.Int64N(int64(pl.l.PageTokens))
					case 1: // on a page boundary
						prompt = max(1, r.Int64N(held)/int64(pl.l.PageTokens)*int64(pl.l.PageTokens))
					case 2: // inside the prefix
						prompt = 1 + r.Int64N(pl.prefix)
					default:
						prompt = 1 + r.Int64N(held-1)
					}
					prompt = min(prompt, held-1)
				default:
					prompt = held + r.Int64N(40) // 0 = the same prompt again
					if prompt == 0 {
						prompt = 1
					}
				}
				decode := r.Int64N(20)
				if r.IntN(5) == 0 {
					decode = 0
				}
				// The engine's prompt: what it keeps of the conversation it
				// knows (the prefix, for a new session), then new tokens.
				base := prefixes[pl.l.Model]
				if m != nil {
					base = m.c
				}
				pc := base.prefix(min(prompt, keepConv, int64(len(base.ids))))
				for int64(len(pc.ids)) < prompt {
					pc = pc.push(token())
				}
				// Most plans send the ids, some the block hashes; a few count
				// alone, but only where counts are enough: never after an
				// edit, nor when the conversation left the prefix (an edit
				// inside it earlier) and the session may be evicted and made
				// again from the prefix by this very plan.
				mode := byIDs
				pre := prefixes[pl.l.Model]
				onPrefix := slices.Equal(pc.ids[:min(prompt, pl.prefix)], pre.ids[:min(prompt, pl.prefix)])
				switch x := r.IntN(10); {
				case x < 3:
					mode = byHashes
				case x == 3 && !edit && onPrefix && !lossy:
					// (Not with lost flushes: a lost commit of an edit or
					// a rewind leaves the older conversation's KV under the
					// same counts, which only content catches.)
					mode = countOnly
				}
				content := func(in *PlanInput, n int64) {
					in.TokenIDs, in.BlockHashes, in.UnsafeCountOnly = nil, nil, false
					switch mode {
					case byIDs:
						in.TokenIDs = u32(pc.ids[:n])
					case byHashes:
						in.BlockHashes = kvlayout.BlockHashes(u32(pc.ids[:n]), pl.l.PageTokens)
					default:
						in.UnsafeCountOnly = true
					}
				}
				// Half the plans are for an engine of whole blocks (vllm format).
				aligned := r.IntN(2) == 0
				pfx := []string{"/prefixes/" + pl.l.Model}
				if noPrefix[id] {
					pfx = nil
				}
				in := PlanInput{Session: id, Model: pl.l.Model, Prefixes: pfx, PromptTokens: prompt,
					DecodeTokens: decode, NewFile: r.IntN(5) == 0, Dir: "/kv-sessions", Pool: "perf", ChunkSize: 1 << 20,
					Quota: quota, PlanTTL: time.Duration(2000*workers) * time.Microsecond, Now: tick(), Aligned: aligned}
				// Half the plans take the fast path: chunks allocated by the
				// plan, the commit recording the written size (turns.go).
				fast := r.IntN(2) == 0
				if fast {
					in.Place = func(fileID, idx int64) ([]string, error) { return []string{"s1"}, nil }
				}
				content(&in, prompt)
				p, err := s.PlanSession(ctx, in)
				if errors.Is(err, errs.ErrNoSpace) || transient(err) {
					continue // every other session has a plan outstanding
				}
				if lossy && m == nil && errors.Is(err, errs.ErrBadRequest) {
					// A delete lost with its flush: the session is back,
					// maybe of another model than this plan's. Not used
					// again (its bytes are its own conversation's).
					names = slices.DeleteFunc(names, func(n string) bool { return n == id })
					continue
				}
				if err != nil {
					fail("plan %s (%d tokens): %v", id, prompt, err)
					return
				}
				// The plan protects the session from eviction: its generation
				// tells whether it was evicted (and made anew) before.
				got, err := s.Session(ctx, id)
				if errors.Is(err, errs.ErrNotFound) || transient(err) {
					// Only when the plan expired already (a very loaded
					// machine): another plan's eviction took the session;
					// or the plan was lost with its flush.
					delete(sessions, id)
					continue
				}
				if err != nil {
					fail("session %s after plan: %v", id, err)
					return
				}
				if m == nil || !got.Created.Equal(m.created) {
					if m != nil {
						stats.Lock()
						stats.recreated++
						stats.Unlock()
					}
					m = &modelSession{layout: pl.l, c: prefixes[pl.l.Model], segs: []seg{{0, pl.prefix}}, created: got.Created,
						hashed: prefixHashed[pl.l.Model]}
					if noPrefix[id] {
						m.c, m.segs, m.hashed = conv{}, nil, 0
					}
					sessions[id] = m
				}
				total := prompt + decode
				valid := m.verified(pc, prompt, mode)
				want := m.cached(valid)
				if aligned {
					pt := int64(pl.l.PageTokens)
					total = (total + pt - 1) / pt * pt
					want = m.cachedAligned(prompt, valid)
				}
				c := pc
				for int64(len(c.ids)) < total {
					c = c.push(token())
				}
				// Check the plan against the model (with lost flushes the
				// model may be ahead of the store: the bytes below are
				// checked all the same).
				if !lossy && (p.Cached != want || p.Prefill != prompt-want || p.Verified != valid) {
					fail("session %s (%s, aligned %v, segs %v, hashed %d, mode %d, edit %v at %d) prompt %d: plan caches %d tokens (verified %d), model %d (verified %d) (stored %+v)",
						id, pl.l.Order, aligned, m.segs, m.hashed, mode, edit, keepConv, prompt, p.Cached, p.Verified, want, valid, p.Stored)
					return
				}
				if err := checkPlanShape(pl.l, p, total, aligned); err != nil {
					fail("session %s prompt %d: %v", id, prompt, err)
					return
				}
				for _, sr := range p.Stored {
					if !bytes.Equal(disk.read(sr.Path, sr.KVStart, sr.KVLength), encode(pl.l, c, sr.TokenStart, sr.TokenLength)) {
						fail("session %s (%s, segs %v) prompt %d: stored range %+v does not hold the KV of tokens %d..%d of this conversation",
							id, pl.l.Order, m.segs, prompt, sr, sr.TokenStart, sr.TokenStart+sr.TokenLength)
						return
					}
				}
				done++
				stats.Lock()
				stats.plans++
				stats.checked += len(p.Stored)
				stats.evicted += len(p.Evicted)
				if rewind {
					stats.rewinds++
				}
				if edit {
					stats.edits++
				}
				stats.modes[mode]++
				stats.Unlock()
				if r.IntN(10) == 0 { // abandoned: never written or committed
					stats.Lock()
					stats.abandoned++
					stats.Unlock()
					continue
				}
				// The engine writes the fresh KV; an engine of whole blocks may
				// save only the first blocks of it (generation stopped early).
				commit := CommitInput{Session: id, PlanID: p.ID, Written: fast}
				if fast {
					if err := checkFreshChunks(p); err != nil {
						fail("session %s plan %d: %v", id, p.ID, err)
						return
					}
				}
				saved := p.Fresh
				if aligned && len(p.Fresh) > 0 && r.IntN(2) == 0 {
					// The first k blocks of the fresh ranges (a checked plan
					// cuts its fresh range where the prompt ends: two ranges).
					pt := int64(pl.l.PageTokens)
					var blocks int64
					for _, fr := range p.Fresh {
						blocks += fr.TokenLength / pt
					}
					k := r.Int64N(blocks + 1)
					saved = nil
					for _, fr := range p.Fresh {
						n := min(k*pt, fr.TokenLength)
						if n <= 0 {
							break
						}
						saved = append(saved, Range{TokenStart: fr.TokenStart, TokenLength: n, Path: fr.Path, KVStart: fr.KVStart, KVLength: pl.l.RangeBytes(n)})
						k -= n / pt
					}
					commit.Partial, commit.Saved = true, saved
					if len(saved) > 0 && r.IntN(2) == 0 {
						commit.PlanID = 0 // found by the saved segment
					}
				}
				lost := false // the plan expired and the session was evicted meanwhile
				for _, fr := range saved {
					disk.write(fr.Path, fr.KVStart, encode(pl.l, c, fr.TokenStart, fr.TokenLength))
					if fast {
						continue // the commit records the size
					}
					f, err := s.File(ctx, fr.Path)
					if err == nil {
						_, err = s.Commit(ctx, f.ID, fr.KVStart+fr.KVLength, nil, false, tick())
					}
					if errors.Is(err, errs.ErrNotFound) || transient(err) {
						lost = true
						break
					}
					if err != nil {
						fail("size of %s: %v", fr.Path, err)
						return
					}
				}
				if lost {
					stats.Lock()
					stats.refused++
					stats.Unlock()
					continue
				}
				// Sometimes a second plan competes; only one may commit.
				var rival Plan
				if r.IntN(6) == 0 {
					in.Now = tick()
					in.PromptTokens = min(prompt+5, int64(len(c.ids)))
					pc = c
					content(&in, in.PromptTokens)
					if rival, err = s.PlanSession(ctx, in); err != nil && !errors.Is(err, errs.ErrNoSpace) && !transient(err) {
						fail("rival plan %s: %v", id, err)
						return
					}
				}
				commit.Now = tick()
				if _, err := s.CommitSession(ctx, commit); err != nil {
					_, gone := s.Session(ctx, id)
					if errors.Is(err, errs.ErrNotFound) || (errors.Is(err, errs.ErrExists) && errors.Is(gone, errs.ErrNotFound)) || // the plan expired, the session was evicted
						lossy && (errors.Is(err, errs.ErrExists) || transient(err)) { // or the plan, or a commit before, was lost
						stats.Lock()
						stats.refused++
						stats.Unlock()
						continue
					}
					fail("commit %s plan %d: %v", id, p.ID, err)
					return
				}
				var freshN int64
				var runs []seg
				for _, fr := range saved {
					freshN += fr.TokenLength
					runs = append(runs, seg{fr.TokenStart, fr.TokenLength})
				}
				m.hashed = m.hashedAfter(p.Cached, p.Cached+freshN, prompt, mode)
				m.commit(p.Cached, runs, c)
				sess, err := s.Session(ctx, id) // waits for the commit's log
				if !lossy && err == nil && sess.HashedTokens != m.hashed {
					fail("session %s: %d tokens vouched for after the commit, model %d", id, sess.HashedTokens, m.hashed)
					return
				}
				// The commit is in the store when the session's last use is
				// its time (ticks are unique, and no later operation of this
				// session ran): then no rival may commit, lost flushes or not.
				durable := !lossy || err == nil && sess.LastUsed.Equal(commit.Now)
				if rival.ID != 0 {
					// With lost flushes the commit above may be lost and
					// the rival's then legitimately commits: its engine
					// writes the rival's own KV. Without, it writes wrong
					// bytes, which must never be served.
					rc := c
					for _, fr := range rival.Fresh {
						for int64(len(rc.ids)) < fr.TokenStart+fr.TokenLength {
							rc = rc.push(token())
						}
					}
					for _, fr := range rival.Fresh {
						b := make([]byte, fr.KVLength)
						if lossy {
							b = encode(pl.l, rc, fr.TokenStart, fr.TokenLength)
						}
						disk.write(fr.Path, fr.KVStart, b)
						f, err := s.File(ctx, fr.Path)
						if err == nil {
							_, err = s.Commit(ctx, f.ID, fr.KVStart+fr.KVLength, nil, false, tick())
						}
						if err != nil && !errors.Is(err, errs.ErrNotFound) && !transient(err) {
							fail("size of %s: %v", fr.Path, err)
							return
						}
					}
					if _, err := s.CommitSession(ctx, CommitInput{Session: id, PlanID: rival.ID, Now: tick()}); err == nil && durable {
						fail("session %s: a plan made before another commit committed too", id)
						return
					}
					stats.Lock()
					stats.refused++
					if durable {
						stats.rivals++
					}
					stats.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("%d plans (%d rewinds, %d edits; %v by ids, hashes, counts), %d stored ranges checked byte for byte, %d forks, %d deletes, %d evictions (%d noticed by their owner), %d abandoned plans, %d commits refused (%d rivals of a commit in the store), %d flushes lost",
		stats.plans, stats.rewinds, stats.edits, stats.modes, stats.checked, stats.forks, stats.deletes, stats.evicted, stats.recreated, stats.abandoned, stats.refused, stats.rivals, losses.Load())
	if stats.plans < plans/2 || stats.rivals == 0 || stats.rewinds == 0 || stats.edits == 0 && !lossy || !allModes(stats.modes, lossy) || stats.forks == 0 || stats.evicted == 0 || stats.refused == 0 || lossy && losses.Load() == 0 {
		t.Fatalf("the traffic did not exercise the store: %+v", &stats)
	}
}

// allModes: plans were made in every way the run uses (with lost flushes,
// never on counts alone).
func allModes(modes [3]int, lossy bool) bool {
	if lossy {
		return modes[byIDs] > 0 && modes[byHashes] > 0
	}
	return !slices.Contains(modes[:], 0)
}

// checkPlanShape: stored ranges contiguous from 0 and ending at cached;
// fresh contiguous from cached to the prompt plus decode room; for an
// engine of whole blocks, every range whole blocks.
func checkPlanShape(l Layout, p Plan, total int64, aligned bool) error {
	var at int64
	pt := int64(l.PageTokens)
	for _, r := range p.Stored {
		if r.TokenStart != at || r.TokenLength < 1 || r.KVLength != l.RangeBytes(r.TokenLength) {
			return fmt.Errorf("stored ranges not contiguous from 0 or sized wrong: %+v", p.Stored)
		}
		if aligned && (r.TokenStart%pt != 0 || r.TokenLength%pt != 0) {
			return fmt.Errorf("stored range %+v is not whole blocks of %d", r, pt)
		}
		at += r.TokenLength
	}
	for _, r := range p.Fresh {
		if aligned && (r.TokenStart%pt != 0 || r.TokenLength%pt != 0) {
			return fmt.Errorf("fresh range %+v is not whole blocks of %d", r, pt)
		}
	}
	if at != p.Cached {
		return fmt.Errorf("stored ranges end at %d, cached %d", at, p.Cached)
	}
	for _, r := range p.Fresh {
		if r.TokenStart != at || r.KVLength != l.RangeBytes(r.TokenLength) {
			return fmt.Errorf("fresh ranges %+v do not follow the stored ones", p.Fresh)
		}
		at += r.TokenLength
	}
	if at != total {
		return fmt.Errorf("plan covers %d tokens, prompt+decode is %d", at, total)
	}
	return nil
}
