package main

import (
	"errors"
	"fmt"
	"path"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/spf13/cobra"
)

func newMv(g *globals) *cobra.Command {
	var noClobber bool
	cmd := &cobra.Command{
		Use:   "mv SRC... DST",
		Short: "Rename or move files and directories on the cluster, without copying their bytes",
		Long: `Rename or move files and directories inside one cluster, as mv does: with one SRC, DST is
the new name, or, when DST is an existing directory, the directory SRC moves into; with several,
DST must be a directory. Each move is one step on the master (readers see the old name or the new
one); the bytes stay where they are, so a file keeps its chunks, its sha256 and, for a linked
file, its S3 source.

An existing file at the new name is replaced, as mv does (-n keeps it and fails instead). A
directory moves with everything in it onto a free name or an empty directory. Refused ("busy"):
a file still being written (not sealed yet: rename it after its writer closes it, or remove it
if its writer died), and files of KV sessions.`,
		Example: `  gd2fs mv gd2fs://local/models/m/model.bin.incomplete gd2fs://local/models/m/model.bin
  gd2fs mv gd2fs://local/models/m gd2fs://local/archive/        # into an existing directory
  gd2fs mv -n gd2fs://local/a.bin gd2fs://local/b.bin           # fail if b.bin exists`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			// eachRemote checks every URI first, then calls fn once per
			// path: the last call has them all.
			var paths []string
			return g.eachRemote(args, func(c *client.Client, p string) error {
				paths = append(paths, p)
				if len(paths) < len(args) {
					return nil
				}
				return move(cmd, c, paths[:len(args)-1], paths[len(args)-1], args[len(args)-1], noClobber)
			})
		},
	}
	cmd.Flags().BoolVarP(&noClobber, "no-clobber", "n", false, "do not replace an existing file: fail instead")
	return cmd
}

// move renames each of srcs to dst, or into dst when it is a directory.
func move(cmd *cobra.Command, c *client.Client, srcs []string, dst, dstURI string, noClobber bool) error {
	ctx := cmd.Context()
	st, err := c.Stat(ctx, dst)
	into := err == nil && st.IsDir
	if err != nil && !errors.Is(err, errs.ErrNotFound) {
		return err
	}
	if len(srcs) > 1 && !into {
		return fmt.Errorf("%s is not a directory: moving several files needs a directory to move them into", dstURI)
	}
	for _, src := range srcs {
		to := dst
		if into {
			to = path.Join(dst, path.Base(src))
		}
		if _, err := c.Rename(ctx, src, to, client.RenameOptions{NoReplace: noClobber}); err != nil {
			return fmt.Errorf("mv %s to %s: %w", src, to, err)
		}
	}
	return nil
}
