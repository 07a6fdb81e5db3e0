package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/spf13/cobra"
)

// newS3 is `gd2fs-bench s3`: the in-memory S3 server of the tests, on a
// port of one's choosing, so the weights walkthrough (docs/weights.md) runs
// on one machine with nothing to install. It lives in gd2fs-bench because
// gd2fs itself links no fake S3 (cmd/gd2fs/deps_test.go).
func newS3() *cobra.Command {
	var listen, access, secret string
	var buckets, uploads []string
	cmd := &cobra.Command{
		Use:   "s3",
		Short: "Run a local in-memory S3 server (for trying model pull/link; not for data you want to keep)",
		Long: `Run a local in-memory S3 server (for trying model pull/link; not for data you want to keep).

It holds everything in memory and forgets it on exit. --upload copies a local folder's files into
a bucket at start (DIR=BUCKET/PREFIX). It prints the variables gd2fs reads to reach it.`,
		Example: `  gd2fs-bench s3 --listen 127.0.0.1:9000 --upload ./tiny-model=models/org/tiny
  export AWS_ENDPOINT_URL=http://127.0.0.1:9000 AWS_ACCESS_KEY_ID=gd2fs AWS_SECRET_ACCESS_KEY=gd2fs-secret
  gd2fs model pull s3://models/org/tiny gd2fs://local/models/org/tiny`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := s3test.StartOn(listen, access, secret)
			if err != nil {
				return fmt.Errorf("s3: %w (pick another --listen)", err)
			}
			defer s.Close()
			made := map[string]bool{}
			mkBucket := func(b string) error {
				if made[b] {
					return nil
				}
				made[b] = true
				return s.CreateBucket(b)
			}
			for _, b := range buckets {
				if err := mkBucket(b); err != nil {
					return err
				}
			}
			for _, u := range uploads {
				n, err := upload(s, u, mkBucket)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "uploaded %d files from %s\n", n, u)
			}
			fmt.Printf("S3 (in memory) at %s; buckets: %s\n\n  export AWS_ENDPOINT_URL=%s AWS_ACCESS_KEY_ID=%s AWS_SECRET_ACCESS_KEY=%s\n\nStop with Ctrl-C.\n",
				s.URL, strings.Join(keys(made), ", "), s.URL, access, secret)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:9000", "address to serve S3 on")
	f.StringVar(&access, "access-key", "gd2fs", "the access key it accepts")
	f.StringVar(&secret, "secret-key", "gd2fs-secret", "its secret key (the server checks only the access key)")
	f.StringSliceVar(&buckets, "bucket", []string{"models"}, "buckets to create")
	f.StringArrayVar(&uploads, "upload", nil, "DIR=BUCKET/PREFIX: put DIR's files under s3://BUCKET/PREFIX/ at start (repeatable)")
	return cmd
}

// upload puts the files under DIR as objects BUCKET/PREFIX/<relative path>.
func upload(s *s3test.Server, spec string, mkBucket func(string) error) (int, error) {
	dir, dst, ok := strings.Cut(spec, "=")
	if !ok || dir == "" || dst == "" {
		return 0, fmt.Errorf("--upload %q: write DIR=BUCKET/PREFIX, e.g. ./tiny-model=models/org/tiny", spec)
	}
	bucket, prefix, _ := strings.Cut(strings.TrimPrefix(dst, "s3://"), "/")
	if err := mkBucket(bucket); err != nil {
		return 0, err
	}
	n := 0
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		key := strings.Trim(prefix, "/") + "/" + filepath.ToSlash(rel)
		n++
		return s.Put(bucket, strings.TrimPrefix(key, "/"), b)
	})
	return n, err
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
