package main

import (
	"fmt"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

// kvRetainCmds are `gd2fs kv pin`, `unpin`, `ttl` and `priority`: what
// keeps a block beside its use (docs/kv-cache.md, "Pins, TTLs and
// priorities").
func kvRetainCmds(withKV func(func(kv *client.KV, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error) []*cobra.Command {
	apply := func(kv *client.KV, cmd *cobra.Command, keys []string, prefix bool, o client.RetainOptions) error {
		if prefix {
			if len(keys) != 1 || keys[0] == "" {
				return fmt.Errorf("--prefix takes one non-empty prefix")
			}
			n, err := kv.RetainPrefix(cmd.Context(), keys[0], o)
			fmt.Printf("changed %d blocks\n", n)
			return err
		}
		for _, k := range keys {
			if _, _, err := kv.Retain(cmd.Context(), k, o); err != nil {
				return err
			}
		}
		return nil
	}
	var tier string
	var prefix bool
	pin := &cobra.Command{
		Use:   "pin KEY... | pin --prefix PREFIX",
		Short: "Keep blocks in DRAM (--tier dram, the default) or stored on disk (--tier disk)",
		Long: `Keep blocks in DRAM (--tier dram) or stored on disk (--tier disk) until unpinned, deleted or
replaced: eviction passes them over. Each server bounds what may be pinned (gd2fs server
--kv-pin-quota, a quarter of each tier by default, at most half): a pin beyond it is refused, never
a put. With --prefix, every block of the pool whose key starts with PREFIX, on every server.`,
		Example: "  gd2fs kv pin sys-prompt/0 sys-prompt/1\n  gd2fs kv pin --tier disk --prefix llama/sys/\n  gd2fs kv --pool ha pin llama/0/8f3a",
		Args:    cobra.MinimumNArgs(1),
		RunE: withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
			return apply(kv, cmd, args, prefix, client.RetainOptions{Pin: tier})
		}),
	}
	pin.Flags().StringVar(&tier, "tier", "dram", "where to keep the blocks: dram or disk")
	pin.Flags().BoolVar(&prefix, "prefix", false, "treat the argument as a key prefix")
	var unPrefix bool
	unpin := &cobra.Command{
		Use:     "unpin KEY... | unpin --prefix PREFIX",
		Short:   "Let pinned blocks be evicted again",
		Example: "  gd2fs kv unpin sys-prompt/0\n  gd2fs kv unpin --prefix llama/sys/",
		Args:    cobra.MinimumNArgs(1),
		RunE: withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
			return apply(kv, cmd, args, unPrefix, client.RetainOptions{Pin: "none"})
		}),
	}
	unpin.Flags().BoolVar(&unPrefix, "prefix", false, "treat the argument as a key prefix")
	var persist bool
	ttl := &cobra.Command{
		Use:   "ttl KEY [DURATION]",
		Short: "Show a block's time to live, or set it (0 deletes; --persist removes it)",
		Long: `Show a block's time to live, or set it: past it the block is gone, as after rm. A DURATION of 0
deletes the block at once (as Redis's EXPIRE); --persist removes the TTL. A put that replaces a
block (--overwrite, Redis SET) starts without one.`,
		Example: "  gd2fs kv ttl llama/0/8f3a\n  gd2fs kv ttl llama/0/8f3a 10m\n  gd2fs kv ttl --persist llama/0/8f3a",
		Args:    cobra.RangeArgs(1, 2),
		RunE: withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
			var o client.RetainOptions
			switch {
			case persist && len(args) == 2:
				return fmt.Errorf("give a DURATION or --persist, not both")
			case persist:
				o.Persist = true
			case len(args) == 2:
				d, err := time.ParseDuration(args[1])
				if err != nil {
					return fmt.Errorf("duration %q: %w (write it as 90s, 10m or 2h)", args[1], err)
				}
				o.SetTTL, o.TTL = true, d
			default:
				r, err := kv.Retention(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				fmt.Println(ttlText(r.TTL))
				return nil
			}
			r, gone, err := kv.Retain(cmd.Context(), args[0], o)
			switch {
			case err != nil:
				return err
			case gone:
				fmt.Println("expired: deleted")
			default:
				fmt.Println(ttlText(r.TTL))
			}
			return nil
		}),
	}
	ttl.Flags().BoolVar(&persist, "persist", false, "remove the block's TTL")
	var prPrefix bool
	priority := &cobra.Command{
		Use:     "priority KEY N | priority --prefix PREFIX N",
		Short:   "Set blocks' eviction priority, -7 to 7 (0 by default): lower priorities leave DRAM first",
		Example: "  gd2fs kv priority llama/0/8f3a 3\n  gd2fs kv priority --prefix scratch/ -2",
		Args:    cobra.ExactArgs(2),
		RunE: withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
			var n int
			if _, err := fmt.Sscan(args[1], &n); err != nil {
				return fmt.Errorf("priority %q: want a number from -7 to 7", args[1])
			}
			return apply(kv, cmd, args[:1], prPrefix, client.RetainOptions{SetPriority: true, Priority: n})
		}),
	}
	priority.Flags().BoolVar(&prPrefix, "prefix", false, "treat the first argument as a key prefix")
	return []*cobra.Command{pin, unpin, ttl, priority}
}

func ttlText(d time.Duration) string {
	if d <= 0 {
		return "none"
	}
	return d.Round(time.Millisecond).String()
}

// putRetainFlags adds --pin, --ttl and --priority to `kv put`.
func putRetainFlags(cmd *cobra.Command, o *client.RetainOptions) func() error {
	var ttl time.Duration
	prio := cmd.Flags().Int("priority", 0, "eviction priority, -7 to 7 (lower priorities leave DRAM first)")
	cmd.Flags().StringVar(&o.Pin, "pin", "", "pin the block: dram or disk (see gd2fs kv pin --help)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "time to live, e.g. 10m: past it the block is gone")
	return func() error {
		if cmd.Flags().Changed("ttl") {
			if ttl <= 0 {
				return fmt.Errorf("--ttl %v: give a positive duration (or leave it out)", ttl)
			}
			o.SetTTL, o.TTL = true, ttl
		}
		if cmd.Flags().Changed("priority") {
			o.SetPriority, o.Priority = true, *prio
		}
		return nil
	}
}
