package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// newSessionWrite is `gd2fs session write`: the step between plan and
// commit that an engine does itself, for a turn driven from the shell.
func newSessionWrite(g *globals) *cobra.Command {
	var planID int64
	cmd := &cobra.Command{
		Use:   "write SESSION --plan ID FILE|-",
		Short: "Write a plan's fresh range (the new KV bytes) from a file or standard input, before the commit",
		Long: `Write a plan's fresh range (the new KV bytes) from a file or standard input, before the commit.

The input must be exactly the plan's fresh bytes (load_bytes is what it stored; the fresh range's
kv_length is what it takes): gd2fs writes them where the plan reserved and syncs the file, so that
'gd2fs session commit SESSION --plan ID' records them. Plans expire when not committed within
10 minutes; a plan committed or expired is refused here.`,
		Example: `  id=$(gd2fs session plan chat-42 --model llama-3-8b --prompt-tokens 8192 | jq .plan_id)
  gd2fs session write chat-42 --plan "$id" ./fresh-kv.bin
  gd2fs session commit chat-42 --plan "$id"`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if planID <= 0 {
				return usage(fmt.Errorf("--plan ID is required: the plan_id 'gd2fs session plan' printed"))
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			s := c.Sessions()
			p, err := s.OutstandingPlan(cmd.Context(), args[0], planID)
			if err != nil {
				return err
			}
			var want int64
			for _, r := range p.Fresh {
				want += r.KVLength
			}
			if want == 0 {
				return fmt.Errorf("plan %d has no fresh range (every token was stored): nothing to write; commit it as it is", planID)
			}
			kv, err := readExactly(args[1], want)
			if err != nil {
				return err
			}
			if err := s.WriteFresh(cmd.Context(), p, kv); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "wrote %s to plan %d's fresh range (%s); record it with: gd2fs session commit %s --plan %d\n",
				human(want), planID, p.Fresh[0].KVURI, args[0], planID)
			return nil
		},
	}
	cmd.Flags().Int64Var(&planID, "plan", 0, "plan id from 'session plan' (its plan_id)")
	return cmd
}

// readExactly reads name (- for standard input), which must hold exactly n
// bytes; it never reads more than n+1.
func readExactly(name string, n int64) ([]byte, error) {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() != n {
			return nil, fmt.Errorf("%s holds %d bytes; the plan's fresh range takes exactly %d", name, st.Size(), n)
		}
		r = f
	}
	if n > 1<<40 {
		return nil, fmt.Errorf("a fresh range of %d bytes is too large to write from the CLI", n)
	}
	buf := make([]byte, n+1)
	got, err := io.ReadFull(r, buf)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, err
	}
	if int64(got) != n {
		more := ""
		if int64(got) > n {
			more = " or more"
		}
		return nil, fmt.Errorf("%s gave %d bytes%s; the plan's fresh range takes exactly %d", name, got, more, n)
	}
	return buf[:n], nil
}
