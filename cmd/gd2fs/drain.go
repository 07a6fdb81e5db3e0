package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newServerDrain(g *globals) *cobra.Command {
	var wait time.Duration
	var undo bool
	cmd := &cobra.Command{
		Use:   "drain SERVER-ID",
		Short: "Move a server's KV blocks to their next owners before it leaves",
		Long: `drain takes the server out of the KV membership map at once: its blocks get
new owners, which copy them from it in the background (and on first read)
while it keeps serving them. drain waits until it holds no blocks; then stop
it. --undo takes a drain back. The mark lives in the master's memory: after a
master restart, drain again.`,
		Example: `  gd2fs server drain server-2                 # wait until server-2 holds no KV blocks
  gd2fs server drain server-2 --wait 0        # mark it and return
  gd2fs server drain server-2 --undo          # it stays`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			info, err := c.DrainServer(ctx, args[0], undo)
			if err != nil {
				return fmt.Errorf("drain %s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%s: %s\n", info.ID, info.State)
			if undo || wait <= 0 {
				return nil
			}
			wctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			last := int64(-1)
			err = c.WaitDrained(wctx, args[0], 500*time.Millisecond, func(n int64) {
				if n != last {
					fmt.Fprintf(out, "%s holds %d KV blocks\n", args[0], n)
					last = n
				}
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s is drained: it can be stopped\n", args[0])
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Minute, "how long to wait for the blocks to move (0: do not wait)")
	cmd.Flags().BoolVar(&undo, "undo", false, "take the drain back")
	return cmd
}
