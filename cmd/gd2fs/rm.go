package main

import (
	"github.com/spf13/cobra"
)

func newRm(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm URI...",
		Short:   "Remove files or empty directories",
		Example: "  gd2fs rm gd2fs://local/models/m/model.safetensors\n  gd2fs rm gd2fs://local/models/m",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			for _, a := range args {
				p, err := remotePath(a)
				if err != nil {
					return err
				}
				if err := c.Remove(cmd.Context(), p); err != nil {
					return err
				}
			}
			return nil
		},
	}
}
