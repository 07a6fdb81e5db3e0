package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/spf13/cobra"
)

func newLs(g *globals) *cobra.Command {
	var long, asJSON bool
	cmd := &cobra.Command{
		Use:     "ls URI",
		Short:   "List a directory (or show one file, as ls does)",
		Example: "  gd2fs ls gd2fs://local/\n  gd2fs ls -l gd2fs://local/models/m\n  gd2fs ls -l gd2fs://local/models/m/model.safetensors   # one file\n  gd2fs ls --json gd2fs://local/models/m | jq -r '.[].path'",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withRemote(args[0], func(c *client.Client, p string) error {
				es, err := c.List(cmd.Context(), p)
				if errors.Is(err, errs.ErrNotDir) {
					var fi client.FileInfo
					if fi, err = c.Stat(cmd.Context(), p); err == nil {
						fi.Chunks = nil
						es = []client.FileInfo{fi}
					}
				}
				if err != nil {
					return err
				}
				if asJSON {
					out := make([]fileJSON, len(es))
					for i, e := range es {
						out[i] = fileOf(e)
					}
					return printJSON(out)
				}
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				for _, e := range es {
					name := printable(path.Base(e.Path))
					if e.IsDir {
						name += "/"
					}
					if !long {
						fmt.Fprintln(tw, name)
						continue
					}
					if e.IsDir {
						fmt.Fprintf(tw, "d\t-\t-\t-\t%s\n", name)
						continue
					}
					state := "open"
					if e.Sealed {
						state = "sealed"
					}
					fmt.Fprintf(tw, "-\t%s\t%d\t%s\t%s\t%s\t%s\n", e.Pool, e.Size, human(e.Size), state, e.Modified.Format("2006-01-02 15:04:05"), name)
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "long format: pool, size, state, time")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON list (snake_case fields)")
	return cmd
}

// printable quotes a name that holds anything a terminal would not show as
// itself (control characters, invalid UTF-8, a space at an end), so one name
// is always one line and can be told apart; the master refuses such names
// now, but older metadata may hold them.
func printable(name string) string {
	if !utf8.ValidString(name) || strings.TrimSpace(name) != name {
		return strconv.QuoteToGraphic(name)
	}
	for _, r := range name {
		if !unicode.IsGraphic(r) {
			return strconv.QuoteToGraphic(name)
		}
	}
	return name
}
