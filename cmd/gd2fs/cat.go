package main

import (
	"bufio"
	"fmt"
	"os"

	"github.com/gd2fs/gd2fs/client"
	"github.com/spf13/cobra"
)

func newCat(g *globals) *cobra.Command {
	var partial bool
	cmd := &cobra.Command{
		Use:   "cat URI",
		Short: "Write a file's bytes to standard output",
		Long: `Write a file's bytes to standard output.

A file not yet sealed (a copy in progress, or one that was interrupted) is refused: its bytes may be
incomplete. --partial writes what it holds so far.`,
		Example: "  gd2fs cat gd2fs://local/models/m/model.safetensors | sha256sum\n  gd2fs cat --partial gd2fs://local/logs/run.log",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withRemote(args[0], func(c *client.Client, p string) error {
				f, err := c.Open(cmd.Context(), p)
				if err != nil {
					return err
				}
				if !f.Info().Sealed && !partial {
					return fmt.Errorf("%s is not sealed (being written, or a copy that did not finish: %s so far): its bytes may be incomplete; --partial writes them anyway", p, human(f.Size()))
				}
				w := bufio.NewWriterSize(os.Stdout, 1<<20)
				if _, err := f.CopyTo(cmd.Context(), w, nil); err != nil {
					return err
				}
				return w.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&partial, "partial", false, "write an unsealed file's bytes too")
	return cmd
}
