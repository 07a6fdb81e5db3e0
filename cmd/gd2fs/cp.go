package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/spf13/cobra"
)

func newCp(g *globals) *cobra.Command {
	var pool, chunk string
	var force, progress, quiet bool
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into, out of, or within gd2fs",
		Example: `  gd2fs cp ./model.safetensors gd2fs://local/models/m/model.safetensors
  gd2fs cp --pool perf ./kv.bin gd2fs://local/kv/kv.bin
  gd2fs cp gd2fs://local/models/m/model.safetensors ./copy.safetensors`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			cs, err := parseSize(chunk)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			bars := newProgressBars(showProgress(progress, quiet))
			// Reader side.
			var r io.Reader
			var size int64
			var rf *client.File
			if isRemote(src) {
				p, err := g.remote(c, src)
				if err != nil {
					return err
				}
				if rf, err = c.Open(ctx, p); err != nil {
					return err
				}
				size = rf.Size()
			} else {
				f, err := os.Open(src)
				if err != nil {
					return err
				}
				defer f.Close()
				st, err := f.Stat()
				if err != nil {
					return err
				}
				if st.IsDir() {
					return fmt.Errorf("%s is a directory: cp copies one file", src)
				}
				r, size = f, st.Size()
			}
			// Writer side.
			if isRemote(dst) {
				p, err := g.remote(c, dst)
				if err != nil {
					return err
				}
				if strings.HasSuffix(dst, "/") {
					p = path.Join(p, path.Base(src))
				} else if st, err := c.Stat(ctx, p); err == nil && st.IsDir {
					p = path.Join(p, path.Base(src)) // into the directory, as cp does
				}
				wf, err := c.Create(ctx, p, client.CreateOptions{Pool: pool, ChunkSize: cs, Overwrite: force})
				if err != nil {
					return existsHint(ctx, c, p, err)
				}
				set := func(n int64) { bars.update("upload "+path.Base(p), n, size) }
				if rf != nil {
					_, err = rf.CopyTo(ctx, &appender{f: wf, ctx: ctx}, set)
				} else {
					_, err = copyBuffered(ctx, wf, r, set)
				}
				if err == nil {
					err = wf.Close()
				}
				bars.wait()
				if err != nil {
					return removePartial(c, p, err)
				}
				return nil
			}
			if rf == nil {
				return fmt.Errorf("one of SRC and DST must be a gd2fs:// URI")
			}
			out := dst
			if st, err := os.Stat(dst); err == nil && st.IsDir() {
				out = path.Join(dst, path.Base(rf.Name()))
			}
			tmp := out + ".gd2fs-partial"
			f, err := os.Create(tmp)
			if err != nil {
				return err
			}
			_, err = rf.CopyTo(ctx, f, func(n int64) { bars.update("download "+path.Base(out), n, size) })
			bars.wait()
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(tmp)
				return err
			}
			return os.Rename(tmp, out) // no reader ever sees a partial file
		},
	}
	f := cmd.Flags()
	f.StringVar(&pool, "pool", "ha", "pool of a new file: ha (3 replicas) or perf (1 replica)")
	f.StringVar(&chunk, "chunk-size", "16MiB", "chunk size of a new file")
	f.BoolVarP(&force, "force", "f", false, "replace an existing destination file")
	f.BoolVar(&progress, "progress", false, "show a progress bar even when stderr is not a terminal")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	return cmd
}

type appender struct {
	f   *client.File
	ctx context.Context
}

func (a *appender) Write(p []byte) (int, error) { return a.f.Append(a.ctx, p) }

// copyBuffered reads big blocks from r and appends them; each block is
// written in parallel pieces by the client.
func copyBuffered(ctx context.Context, f *client.File, r io.Reader, progress func(int64)) (int64, error) {
	buf := make([]byte, 64<<20)
	var done int64
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if _, werr := f.Append(ctx, buf[:n]); werr != nil {
				return done, werr
			}
			done += int64(n)
			progress(done)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return done, nil
		}
		if err != nil {
			return done, err
		}
	}
}

// existsHint adds to a failed create what to do about the file in the way:
// -f replaces it; an unsealed one is the leftover of a copy that did not
// finish.
func existsHint(ctx context.Context, c *client.Client, p string, err error) error {
	if !errors.Is(err, errs.ErrExists) {
		return err
	}
	if st, serr := c.Stat(ctx, p); serr == nil && !st.IsDir && !st.Sealed {
		return fmt.Errorf("%w: %s is a partial copy (not sealed: a cp that was interrupted or failed): rerun with -f to replace it, or gd2fs rm it", err, p)
	}
	return fmt.Errorf("%w: rerun with -f to replace it, or pick another name", err)
}

// removePartial removes the unsealed file a failed or interrupted copy
// left, and says so; the cause (cerr) stays the error. It runs on its own
// context: the copy's may be the one Ctrl-C cancelled.
func removePartial(c *client.Client, p string, cerr error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	what, again := "failed", ""
	if errors.Is(cerr, context.Canceled) {
		what, again = "interrupted", "; rerun the same command to copy again"
	}
	cerr = flagError(cerr) // flagnames.go
	if err := c.Remove(ctx, p); err != nil && !errors.Is(err, errs.ErrNotFound) {
		return fmt.Errorf("copy to %s %s: %w (the partial file stays, unsealed: remove it with 'gd2fs rm', or rerun with -f; could not remove it: %v)", p, what, cerr, err)
	}
	return fmt.Errorf("copy to %s %s: %w (removed the partial file%s)", p, what, cerr, again)
}
