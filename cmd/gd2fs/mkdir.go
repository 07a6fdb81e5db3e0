package main

import (
	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newMkdir(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "mkdir URI...",
		Short:   "Create directories (and their parents)",
		Example: "  gd2fs mkdir gd2fs://local/models/llama",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.eachRemote(args, func(c *client.Client, p string) error { return c.Mkdir(cmd.Context(), p) })
		},
	}
}
