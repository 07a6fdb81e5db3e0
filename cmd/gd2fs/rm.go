package main

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/spf13/cobra"
)

func newRm(g *globals) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm URI...",
		Short: "Remove files, empty directories, or (with -r) directories and everything in them",
		Example: `  gd2fs rm gd2fs://local/models/m/model.safetensors
  gd2fs rm gd2fs://local/models/m          # an empty directory
  gd2fs rm -r gd2fs://local/models/m       # the directory and every file under it`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.eachRemote(args, func(c *client.Client, p string) error {
				err := c.Remove(cmd.Context(), p)
				if errors.Is(err, errs.ErrNotEmpty) {
					if !recursive {
						return fmt.Errorf("%w (gd2fs rm -r removes it and everything in it)", err)
					}
					return removeTree(cmd.Context(), c, p)
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	return cmd
}

// removeTree removes dir and everything under it: files first, then the
// directories from the deepest up.
func removeTree(ctx context.Context, c *client.Client, dir string) error {
	es, err := c.List(ctx, dir)
	if err != nil {
		return err
	}
	sort.Slice(es, func(i, j int) bool { return es[i].Path < es[j].Path })
	for _, e := range es {
		if e.IsDir {
			err = removeTree(ctx, c, e.Path)
		} else {
			err = c.Remove(ctx, e.Path)
		}
		if err != nil && !errors.Is(err, errs.ErrNotFound) {
			return err
		}
	}
	return c.Remove(ctx, dir)
}
