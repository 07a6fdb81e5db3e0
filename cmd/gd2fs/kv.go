package main

import (
	"bufio"
	"fmt"
	"io"
	"os"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newKV(g *globals) *cobra.Command {
	var pool string
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Hash-mode KV cache: put, get, exists, rm, stat, pin, ttl blocks by key",
		Example: `  gd2fs kv put llama/0/8f3a ./block.bin
  gd2fs kv put --pin dram --ttl 1h sys/0 ./block.bin
  gd2fs kv pin --prefix sys/
  gd2fs kv get llama/0/8f3a > block.bin
  gd2fs kv exists llama/0/8f3a llama/0/91bc llama/0/a7de     # per key, and the cached prefix length
  gd2fs kv --pool ha stat llama/0/8f3a`,
	}
	var asJSON bool
	cmd.PersistentFlags().StringVar(&pool, "pool", "perf", "pool: perf (1 copy) or ha (3 copies)")
	withKV := func(fn func(kv *client.KV, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			return fn(c.KV(pool), cmd, args)
		}
	}
	var overwrite bool
	var putRetain client.RetainOptions
	var putFlags func() error
	put := &cobra.Command{
		Use:     "put KEY [FILE|-]",
		Short:   "Store a block (from a file, or standard input)",
		Example: "  gd2fs kv put llama/0/8f3a ./block.bin\n  echo hello | gd2fs kv put greeting -\n  gd2fs kv put --pin dram --priority 3 --ttl 1h sys/0 ./block.bin",
		Args:    cobra.RangeArgs(1, 2),
		RunE: withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
			if err := putFlags(); err != nil {
				return err
			}
			var r io.Reader = os.Stdin
			if len(args) == 2 && args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			v, err := io.ReadAll(io.LimitReader(r, 64<<20+1))
			if err != nil {
				return err
			}
			existed, err := kv.PutWith(cmd.Context(), args[0], v, client.PutOptions{Overwrite: overwrite, Retain: putRetain})
			if err != nil {
				return err
			}
			if existed && !overwrite {
				fmt.Fprintln(os.Stderr, "gd2fs: key exists; kept the stored block (blocks are write-once; --overwrite replaces)")
			}
			return nil
		}),
	}
	put.Flags().BoolVar(&overwrite, "overwrite", false, "replace an existing block")
	putFlags = putRetainFlags(put, &putRetain)
	get := &cobra.Command{
		Use:     "get KEY",
		Short:   "Write a block to standard output",
		Example: "  gd2fs kv get llama/0/8f3a > block.bin",
		Args:    cobra.ExactArgs(1),
		RunE: withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
			v, err := kv.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(v)
			return err
		}),
	}
	exists := &cobra.Command{
		Use:   "exists KEY...",
		Short: "Say which keys are stored, and how many leading keys all are",
		Long: `Say which keys are stored, and how many leading keys all are.

Exit status: 0 when every key is stored, 1 when one is not, 2 when the cluster could not be asked
(or bad usage), so a script can write: if gd2fs kv exists KEY >/dev/null; then ...`,
		Example: "  gd2fs kv exists llama/0/8f3a llama/0/91bc\n  gd2fs kv exists --json llama/0/8f3a llama/0/91bc\n  gd2fs kv exists -q llama/0/8f3a && echo cached",
		Args:    cobra.MinimumNArgs(1),
		RunE: withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
			hits, prefix, err := kv.BatchExists(cmd.Context(), args)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			quiet, _ := cmd.Flags().GetBool("quiet")
			switch {
			case asJSON:
				out := existsJSON{Prefix: prefix, Keys: make([]keyHitJSON, len(args))}
				for i, k := range args {
					out.Keys[i] = keyHitJSON{Key: k, Stored: hits[i]}
				}
				if err := printJSON(out); err != nil {
					return err
				}
			case !quiet:
				w := bufio.NewWriter(os.Stdout)
				for i, k := range args {
					fmt.Fprintf(w, "%v\t%s\n", hits[i], k)
				}
				fmt.Fprintf(w, "prefix\t%d of %d\n", prefix, len(args))
				if err := w.Flush(); err != nil {
					return err
				}
			}
			if prefix < len(args) {
				return &exitError{code: exitFailure, silent: true}
			}
			return nil
		}),
	}
	exists.Flags().BoolVar(&asJSON, "json", false, "print JSON: keys (key, stored) and prefix")
	exists.Flags().BoolP("quiet", "q", false, "print nothing: the exit status answers")
	rm := &cobra.Command{
		Use:     "rm KEY... | rm --prefix PREFIX | rm --all",
		Short:   "Delete blocks, or every block whose key starts with a prefix",
		Example: "  gd2fs kv rm llama/0/8f3a\n  gd2fs kv rm --prefix llama/\n  gd2fs kv --pool perf rm --all     # every block of the pool",
		Args: func(cmd *cobra.Command, args []string) error {
			if all, _ := cmd.Flags().GetBool("all"); all {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.MinimumNArgs(1)(cmd, args)
		},
	}
	var prefix, all bool
	rm.Flags().BoolVar(&prefix, "prefix", false, "treat the argument as a key prefix")
	rm.Flags().BoolVar(&all, "all", false, "delete every block of the pool")
	rm.RunE = withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
		if all {
			n, err := kv.DeleteByPrefix(cmd.Context(), "")
			fmt.Printf("deleted %d blocks\n", n)
			return err
		}
		if prefix && args[0] == "" {
			return fmt.Errorf("an empty prefix matches every block of pool %s: say --all to delete them all", pool)
		}
		if prefix {
			n, err := kv.DeleteByPrefix(cmd.Context(), args[0])
			fmt.Printf("deleted %d blocks\n", n)
			return err
		}
		for _, k := range args {
			if err := kv.Delete(cmd.Context(), k); err != nil {
				return err
			}
		}
		return nil
	})
	stat := &cobra.Command{
		Use:     "stat KEY",
		Short:   "Show a block's size, tier, server, pin, priority and TTL",
		Example: "  gd2fs kv stat llama/0/8f3a\n  gd2fs kv stat --json llama/0/8f3a",
		Args:    cobra.ExactArgs(1),
		RunE: withKV(func(kv *client.KV, cmd *cobra.Command, args []string) error {
			info, err := kv.Stat(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			r, err := kv.Retention(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(blockJSON{Key: info.Key, Size: info.Size, Tier: info.Tier, Server: info.Server,
					Pin: r.Pin, Priority: r.Priority, TTLMillis: r.TTL.Milliseconds()})
			}
			pin := r.Pin
			if pin == "" {
				pin = "none"
			}
			fmt.Printf("key:      %s\nsize:     %d (%s)\ntier:     %s\nserver:   %s\npin:      %s\npriority: %d\nttl:      %s\n",
				info.Key, info.Size, human(info.Size), info.Tier, info.Server, pin, r.Priority, ttlText(r.TTL))
			return nil
		}),
	}
	stat.Flags().BoolVar(&asJSON, "json", false, "print JSON (snake_case fields)")
	cmd.AddCommand(put, get, exists, rm, stat)
	cmd.AddCommand(kvRetainCmds(withKV)...)
	return cmd
}
