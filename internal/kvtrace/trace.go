// Package kvtrace replays KV-cache request traces and measures the prefix-hit
// ratio of a cache: for each request, the blocks of its leading run of hits
// (block i only helps when blocks 0..i-1 hit) over all its blocks.
//
// Traces are JSON lines in the format public inference traces use (one
// request a line):
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}
//
// Equal hash ids are the same block of BlockTokens tokens (the same prefix up
// to and including that block). Generate writes synthetic multi-turn traces in
// the same format.
//
// Three caches are replayed over the same trace with the same capacity in
// blocks: an exact LRU, an exact clairvoyant Belady cache (evict, or do not
// admit, the block whose next use is furthest away) and gd2fs's own KV store
// (internal/kvstore, in process, its DRAM tier sized to the same capacity).
// Belady maximises block hits, not prefix hits, so it is a reference ceiling
// in practice rather than a proven bound.
//
// For a store with a disk tier (tiers.go) the references are the
// infinite-cache bound (every block seen before is a hit) and an exact
// inclusive two-tier LRU, whose DRAM share of hits is what a DRAM policy
// is measured against when the disk holds every block.
package kvtrace

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
)

// BlockTokens is the number of tokens in one block of a trace.
const BlockTokens = 512

// MaxBlocksPerRequest bounds one request's hash ids (2M tokens of context).
const MaxBlocksPerRequest = 4096

// Request is one line of a trace.
type Request struct {
	Timestamp    int64   `json:"timestamp"` // milliseconds
	InputLength  int64   `json:"input_length"`
	OutputLength int64   `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// Read parses a JSON-lines trace. Blank lines are skipped; a bad line is an
// error naming its line number.
func Read(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var out []Request
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		var q Request
		if err := json.Unmarshal(b, &q); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if err := q.check(); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		out = append(out, q)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading trace: %w", err)
	}
	return out, nil
}

func (q *Request) check() error {
	switch {
	case q.InputLength < 0 || q.OutputLength < 0:
		return fmt.Errorf("negative length (input %d, output %d)", q.InputLength, q.OutputLength)
	case len(q.HashIDs) > MaxBlocksPerRequest:
		return fmt.Errorf("%d hash ids: at most %d per request", len(q.HashIDs), MaxBlocksPerRequest)
	}
	return nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Write writes reqs as JSON lines.
func Write(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range reqs {
		if err := enc.Encode(&reqs[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Distinct counts the distinct blocks of a trace.
func Distinct(reqs []Request) int {
	seen := map[int64]struct{}{}
	for _, q := range reqs {
		for _, h := range q.HashIDs {
			seen[h] = struct{}{}
		}
	}
	return len(seen)
}
