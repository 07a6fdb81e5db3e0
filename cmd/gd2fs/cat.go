package main

import (
	"bufio"
	"os"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newCat(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "cat URI",
		Short:   "Write a file's bytes to standard output",
		Example: "  gd2fs cat gd2fs://local/models/m/model.safetensors | sha256sum",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withRemote(args[0], func(c *client.Client, p string) error {
				f, err := c.Open(cmd.Context(), p)
				if err != nil {
					return err
				}
				w := bufio.NewWriterSize(os.Stdout, 1<<20)
				if _, err := f.CopyTo(cmd.Context(), w, nil); err != nil {
					return err
				}
				return w.Flush()
			})
		},
	}
}
