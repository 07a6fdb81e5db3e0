package main

import (
	"fmt"
	"strings"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newStat(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "stat URI",
		Short:   "Show a file's size, pool, state and where each chunk's replicas are",
		Example: "  gd2fs stat gd2fs://local/models/m/model.safetensors\n  gd2fs stat --json gd2fs://local/models/m/model.safetensors",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withRemote(args[0], func(c *client.Client, p string) error {
				fi, err := c.Stat(cmd.Context(), p)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(fileOf(fi))
				}
				if fi.IsDir {
					fmt.Printf("%s: directory\n", fi.Path)
					return nil
				}
				fmt.Printf("path:       %s\npool:       %s\nsize:       %d (%s)\nchunk size: %s\nsealed:     %v\nmodified:   %s\nchunks:     %d\n",
					fi.Path, fi.Pool, fi.Size, human(fi.Size), human(fi.ChunkSize), fi.Sealed, fi.Modified.Format("2006-01-02 15:04:05 MST"), len(fi.Chunks))
				if !fi.Sealed {
					fmt.Print("note:       not sealed: being written, or its writer died (then the size is what it committed);\n" +
						"            the master removes it after its --unsealed-ttl (24h by default) without writes; gd2fs rm removes it now\n")
				}
				for _, ch := range fi.Chunks {
					var rs []string
					for _, r := range ch.Replicas {
						st := ""
						if !r.Up {
							st = "(down)"
						}
						rs = append(rs, r.Server+"@"+r.Addr+st)
					}
					fmt.Printf("  #%-4d id %-8d %10s  %s\n", ch.Index, ch.ID, human(ch.Length), strings.Join(rs, " "))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (snake_case fields)")
	return cmd
}
