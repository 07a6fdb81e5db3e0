package kvtrace

import (
	"math/rand/v2"
	"sort"
)

// GenConfig shapes a synthetic multi-turn trace. Sessions arrive as a Poisson
// process; a session is a conversation of several turns (each turn's input is
// the whole previous context, the previous answer and a new user message) or
// a one-off request. Every session starts with one of a few shared system
// prompts, picked with Zipf-like popularity.
type GenConfig struct {
	Seed            uint64
	Requests        int     // stop after this many requests
	SystemPrompts   int     // distinct shared system prompts
	SystemBlocks    int     // blocks in each system prompt
	OneOffFraction  float64 // share of sessions that are a single request
	MeanTurns       float64 // mean turns of a conversation (geometric, >= 2)
	UserBlocks      int     // mean new blocks a user message adds (uniform 1..2*mean-1)
	OutputBlocks    int     // blocks an answer adds to the next turn's context
	OneOffBlocks    int     // mean unique blocks of a one-off request
	MeanThinkMillis float64 // mean time between a conversation's turns (exponential)
	SessionsPerSec  float64 // arrival rate of new sessions
}

// DefaultGen is a chat-like mix: a few shared prompts, half of the sessions
// one-off, conversations of 4 turns a minute apart on average.
func DefaultGen() GenConfig {
	return GenConfig{
		Seed: 1, Requests: 20000, SystemPrompts: 8, SystemBlocks: 4,
		OneOffFraction: 0.5, MeanTurns: 4, UserBlocks: 2, OutputBlocks: 1, OneOffBlocks: 6,
		MeanThinkMillis: 60000, SessionsPerSec: 10,
	}
}

// Generate returns a trace sorted by timestamp.
func Generate(c GenConfig) []Request {
	r := rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	next := int64(0)
	fresh := func(n int) []int64 {
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = next
			next++
		}
		return ids
	}
	sys := make([][]int64, max(1, c.SystemPrompts))
	for i := range sys {
		sys[i] = fresh(c.SystemBlocks)
	}
	// Zipf(1) over system prompts.
	var wsum float64
	for i := range sys {
		wsum += 1 / float64(i+1)
	}
	pickSys := func() []int64 {
		x := r.Float64() * wsum
		for i := range sys {
			x -= 1 / float64(i+1)
			if x <= 0 {
				return sys[i]
			}
		}
		return sys[len(sys)-1]
	}
	around := func(mean int) int {
		if mean <= 1 {
			return 1
		}
		return 1 + r.IntN(2*mean-1)
	}
	var out []Request
	t := 0.0
	for len(out) < c.Requests {
		t += r.ExpFloat64() / c.SessionsPerSec * 1000
		ctx := append([]int64(nil), pickSys()...)
		if r.Float64() < c.OneOffFraction {
			ctx = append(ctx, fresh(around(c.OneOffBlocks))...)
			out = append(out, req(int64(t), ctx, c.OutputBlocks))
			continue
		}
		// Geometric number of turns with mean MeanTurns, at least 2.
		turns := 2
		if c.MeanTurns > 2 {
			p := 1 / (c.MeanTurns - 1)
			for r.Float64() > p {
				turns++
			}
		}
		at := t
		for k := 0; k < turns; k++ {
			if k > 0 {
				at += r.ExpFloat64() * c.MeanThinkMillis
				ctx = append(ctx, fresh(c.OutputBlocks)...) // previous answer
			}
			ctx = append(ctx, fresh(around(c.UserBlocks))...)
			if len(ctx) > MaxBlocksPerRequest {
				break
			}
			out = append(out, req(int64(at), ctx, c.OutputBlocks))
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	if len(out) > c.Requests {
		out = out[:c.Requests]
	}
	return out
}

func req(ts int64, ctx []int64, outBlocks int) Request {
	return Request{
		Timestamp:    ts,
		InputLength:  int64(len(ctx)) * BlockTokens,
		OutputLength: int64(max(1, outBlocks)) * BlockTokens,
		HashIDs:      append([]int64(nil), ctx...),
	}
}
