package kvtrace

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Report replays reqs at each fraction of the distinct blocks through gd2fs's
// store, LRU and Belady, and writes one line each: prefix-hit ratios, the
// ratio to LRU, the distance from Belady, and the store's throughput.
func Report(w io.Writer, reqs []Request, fractions []float64, blockBytes int) error {
	d := Distinct(reqs)
	var blocks int
	for _, q := range reqs {
		blocks += len(q.HashIDs)
	}
	fmt.Fprintf(w, "trace: %d requests, %d blocks, %d distinct; store blocks of %d bytes\n", len(reqs), blocks, d, blockBytes)
	for _, f := range fractions {
		c := int(float64(d) * f)
		l, b := LRU(reqs, c), Belady(reqs, c)
		s, err := Store(reqs, c, blockBytes)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "DRAM %4.1f%% (%d blocks): gd2fs %.4f  LRU %.4f  Belady %.4f  gd2fs/LRU %.3f  gd2fs/Belady %.3f  store %.0f ops/s (%d ops in %v)\n",
			f*100, c, s.Ratio(), l.Ratio(), b.Ratio(), s.Ratio()/l.Ratio(), s.Ratio()/b.Ratio(),
			float64(s.Ops)/s.Elapsed.Seconds(), s.Ops, s.Elapsed.Round(1e6))
	}
	return nil
}

// ParseGen sets GenConfig fields from "name=value,name=value" (names as in
// GenConfig's JSON-ish snake case: requests, system_prompts, system_blocks,
// one_off_fraction, mean_turns, user_blocks, output_blocks, one_off_blocks,
// mean_think_ms, sessions_per_sec, seed).
func ParseGen(c GenConfig, spec string) (GenConfig, error) {
	for _, kv := range strings.Split(spec, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return c, fmt.Errorf("generator option %q: want name=value", kv)
		}
		k = strings.TrimSpace(k)
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || f < 0 || f > 1e9 {
			return c, fmt.Errorf("generator option %s: %q is not a number in [0, 1e9]", k, v)
		}
		n := int(f)
		switch k {
		case "seed":
			c.Seed = uint64(n)
		case "requests":
			c.Requests = n
		case "system_prompts":
			c.SystemPrompts = n
		case "system_blocks":
			c.SystemBlocks = n
		case "one_off_fraction":
			if f > 1 {
				return c, fmt.Errorf("one_off_fraction %v: at most 1", f)
			}
			c.OneOffFraction = f
		case "mean_turns":
			c.MeanTurns = f
		case "user_blocks":
			c.UserBlocks = n
		case "output_blocks":
			c.OutputBlocks = n
		case "one_off_blocks":
			c.OneOffBlocks = n
		case "mean_think_ms":
			c.MeanThinkMillis = f
		case "sessions_per_sec":
			if f == 0 {
				return c, fmt.Errorf("sessions_per_sec must be above 0")
			}
			c.SessionsPerSec = f
		default:
			return c, fmt.Errorf("unknown generator option %q", k)
		}
	}
	if c.SystemBlocks+c.UserBlocks*2+c.OutputBlocks > MaxBlocksPerRequest {
		return c, fmt.Errorf("blocks per request above %d", MaxBlocksPerRequest)
	}
	return c, nil
}
