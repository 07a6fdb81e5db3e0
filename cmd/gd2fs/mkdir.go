package main

import "github.com/spf13/cobra"

func newMkdir(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "mkdir URI...",
		Short:   "Create directories (and their parents)",
		Example: "  gd2fs mkdir gd2fs://local/models/llama",
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
				if err := c.Mkdir(cmd.Context(), p); err != nil {
					return err
				}
			}
			return nil
		},
	}
}
