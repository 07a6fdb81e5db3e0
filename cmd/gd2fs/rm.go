package main

import (
	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newRm(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm URI...",
		Short:   "Remove files or empty directories",
		Example: "  gd2fs rm gd2fs://local/models/m/model.safetensors\n  gd2fs rm gd2fs://local/models/m",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.eachRemote(args, func(c *client.Client, p string) error { return c.Remove(cmd.Context(), p) })
		},
	}
}
