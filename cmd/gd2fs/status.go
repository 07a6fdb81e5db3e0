package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/gd2fs/gd2fs/internal/weights"
	"github.com/spf13/cobra"
)

func newStatus(g *globals) *cobra.Command {
	var asJSON bool
	var cacheDir string
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
			if err := g.checkMaster(st); err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			fmt.Printf("cluster %s  epoch %d  files %d  bytes %s\n\n", st.Cluster, st.Epoch, st.Files, human(st.Bytes))
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SERVER\tADDR\tSTATE\tDRAM USED/CAP\tDISK USED/CAP\tCHUNKS\tSERVED\tFROM S3")
			var served, coldB int64
			for _, s := range st.Servers {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s / %s\t%s / %s\t%d\t%s\t%s\n", s.ID, s.Addr, s.State,
					human(s.MemUsed), human(s.MemCap), human(s.DiskUsed), human(s.DiskCap), s.Chunks, human(s.ServedBytes), human(s.ColdBytes))
				served += s.ServedBytes
				coldB += s.ColdBytes
			}
			tw.Flush()
			if served > 0 {
				fmt.Printf("\nservers sent %s, fetched %s from S3 to fill linked files: warm hit ratio %.2f\n",
					human(served), human(coldB), 1-float64(coldB)/float64(served))
			}
			if cacheDir != "" {
				hit, fetched, cb := (&weights.Cache{Dir: cacheDir}).Stats()
				if hit+fetched > 0 {
					fmt.Printf("local cache %s: %s from the cache, %s from servers (%s of it from S3): local hit ratio %.2f\n",
						cacheDir, human(hit), human(fetched), human(cb), float64(hit)/float64(hit+fetched))
				}
			}
			fmt.Println()
			for _, p := range st.Pools {
				fmt.Printf("pool %-6s %d replica(s)\n", p.Name, p.Replicas)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&cacheDir, "cache", envOr("HF_HUB_CACHE", ""), "also show this local cache's hit figures")
	return cmd
}
