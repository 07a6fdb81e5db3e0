package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newStatus(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "status",
		Short:   "Show servers (up/down), pools, and capacity and use per tier",
		Example: "  gd2fs status\n  gd2fs status --json --master http://m:7070",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			fmt.Printf("cluster %s  epoch %d  files %d  bytes %s\n\n", st.Cluster, st.Epoch, st.Files, human(st.Bytes))
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SERVER\tADDR\tSTATE\tDRAM USED/CAP\tDISK USED/CAP\tCHUNKS")
			for _, s := range st.Servers {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s / %s\t%s / %s\t%d\n", s.ID, s.Addr, s.State,
					human(s.MemUsed), human(s.MemCap), human(s.DiskUsed), human(s.DiskCap), s.Chunks)
			}
			tw.Flush()
			fmt.Println()
			for _, p := range st.Pools {
				fmt.Printf("pool %-6s %d replica(s)\n", p.Name, p.Replicas)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
