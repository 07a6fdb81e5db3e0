package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/bench"
	"github.com/gd2fs/gd2fs/internal/cluster"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/s3test"
	"github.com/gd2fs/gd2fs/internal/weights"
	"github.com/spf13/cobra"
)

func newBenchWeights() *cobra.Command {
	var size string
	var files int
	cmd := &cobra.Command{
		Use:   "weights",
		Short: "Model weights through the tiers: pull vs aws s3 cp, warm read vs loopback, hot read vs fio, 8 loaders vs 1",
		Example: `  gd2fs-bench weights                        # a 1 GiB model in 4 files
  gd2fs-bench weights --size 2GiB --files 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := context.Background()
			total, err := parseSize(size)
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "gd2fs-benchweights-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			s3 := s3test.Start("AKID", "secret")
			defer s3.Close()
			s3.CreateBucket("models")
			per := total / int64(files)
			for i := 0; i < files; i++ {
				b := bytes.Repeat([]byte{byte(i + 1), 2, 3, 5, 7, 11, 13, 17}, int(per/8))
				if err := s3.Put("models", fmt.Sprintf("org/m/model-%05d-of-%05d.safetensors", i+1, files), b); err != nil {
					return err
				}
			}
			cc := cold.Config{Endpoint: s3.URL, AccessKey: "AKID", SecretKey: "secret", Region: "us-east-1"}
			src, _ := cold.New(cc)
			c, err := cluster.Start(ctx, cluster.Config{Dir: filepath.Join(dir, "cluster"), MemBytes: 1 << 30, DiskBytes: 4 * total, Cold: &cc})
			if err != nil {
				return err
			}
			defer c.Close()
			cl := c.Client()
			defer cl.Close()
			fmt.Printf("bench weights: a %s model in %d files, fake S3 (gofakes3) on loopback, 3 local servers\n", human(total), files)

			// 1. Pull vs aws s3 cp --recursive.
			t0 := time.Now()
			p := &weights.Puller{Client: cl, Source: src, Pool: "perf", Concurrency: 8}
			if _, err := p.Pull(ctx, "s3://models/org/m", "/models/org/m"); err != nil {
				return err
			}
			pull := float64(total) / time.Since(t0).Seconds()
			awsBW, awsErr := awsCopy(ctx, s3.URL, filepath.Join(dir, "aws"))
			fmt.Printf("\npull (8 range GETs in flight, perf pool):  %6.0f MiB/s\n", pull/(1<<20))
			if awsErr != nil {
				fmt.Printf("aws s3 cp --recursive: %v\n", awsErr)
			} else {
				fmt.Printf("aws s3 cp --recursive to local disk:      %6.0f MiB/s\n  ratio %.2fx (target >= 1.0x)\n", awsBW/(1<<20), pull/awsBW)
			}

			// 2. Warm read from servers vs raw loopback.
			// Flush the pull's dirty pages first: kernel write-back would
			// otherwise compete with the reads for the same two cores.
			exec.Command("sync").Run()
			var warm []float64
			for r := 0; r < 3; r++ {
				t := time.Now()
				if err := readTree(ctx, cl, "/models/org/m"); err != nil {
					return err
				}
				warm = append(warm, float64(total)/time.Since(t).Seconds())
			}
			loop, _ := bench.Loopback(total, 12)
			fmt.Printf("\nwarm read from servers (median of 3):     %6.0f MiB/s\nraw loopback TCP, 12 streams:             %6.0f MiB/s\n  ratio %.2fx (target >= 0.70x)\n",
				bench.Median(warm)/(1<<20), loop/(1<<20), bench.Median(warm)/loop)

			// 3. Hot read from the local cache vs fio on the same disk.
			cache := &weights.Cache{Dir: filepath.Join(dir, "hf")}
			rep, err := cache.Warmup(ctx, cl, "/models/org/m", "main", nil)
			if err != nil {
				return err
			}
			// Alternate ours and fio (each after dropping the page cache)
			// three times: the shared disk drifts, so pairs taken together
			// compare better than two separate series.
			var hot, fios []float64
			var ferr error
			for r := 0; r < 3; r++ {
				dropCaches()
				t := time.Now()
				if err := readDir(rep.Snapshot); err != nil {
					return err
				}
				hot = append(hot, float64(total)/time.Since(t).Seconds())
				var bw float64
				if bw, ferr = fioSeqRead(dir, total); ferr == nil {
					fios = append(fios, bw)
				}
			}
			fmt.Printf("\nhot read from the local cache (median of 3, page cache dropped: %v): %6.0f MiB/s\n", dropCaches(), bench.Median(hot)/(1<<20))
			if ferr != nil || len(fios) == 0 {
				fmt.Printf("fio: %v\n", ferr)
			} else {
				fmt.Printf("fio sequential read, same disk (median of 3, alternating): %6.0f MiB/s\n  ratio %.2fx (target >= 0.90x)\n", bench.Median(fios)/(1<<20), bench.Median(hot)/bench.Median(fios))
			}

			// 4. The start-up storm: 8 loaders of a linked model against 1.
			storm := func(loaders int, dst string) (int64, time.Duration, error) {
				if _, err := weights.Link(ctx, cl, src, "s3://models/org/m", dst, client.LinkOptions{}); err != nil {
					return 0, 0, err
				}
				s3.ResetCounters()
				t := time.Now()
				var wg sync.WaitGroup
				errc := make(chan error, loaders)
				for i := 0; i < loaders; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						lc, _ := client.New(client.Config{Master: c.Master.URL()})
						defer lc.Close()
						if err := readTree(ctx, lc, dst); err != nil {
							errc <- err
						}
					}()
				}
				wg.Wait()
				close(errc)
				return s3.BytesSent(), time.Since(t), <-errc
			}
			b1, t1, err := storm(1, "/linked/one")
			if err != nil {
				return err
			}
			b8, t8, err := storm(8, "/linked/eight")
			if err != nil {
				return err
			}
			fmt.Printf("\nlinked model, cold start:\n  1 loader:  S3 sent %s (%.2fx the model) in %s\n  8 loaders: S3 sent %s (%.2fx the model) in %s (%.2fx the time of one, for 8x the bytes delivered)\n",
				human(b1), float64(b1)/float64(total), t1.Round(time.Millisecond), human(b8), float64(b8)/float64(total), t8.Round(time.Millisecond), t8.Seconds()/t1.Seconds())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&size, "size", "1GiB", "model size")
	f.IntVar(&files, "files", 4, "files in the model")
	return cmd
}

func readTree(ctx context.Context, cl *client.Client, dir string) error {
	fs, err := cl.Walk(ctx, dir)
	if err != nil {
		return err
	}
	for _, fi := range fs {
		f, err := cl.Open(ctx, fi.Path)
		if err != nil {
			return err
		}
		if _, err := f.CopyTo(ctx, io.Discard, nil); err != nil {
			return err
		}
	}
	return nil
}

func readDir(dir string) error {
	buf := make([]byte, 4<<20)
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
		return err
	})
}

// awsCopy times `aws s3 cp --recursive` of the model to a local folder.
func awsCopy(ctx context.Context, endpoint, dst string) (float64, error) {
	bin, err := exec.LookPath("aws")
	if err != nil {
		return 0, fmt.Errorf("aws CLI not found (apt-get install -y awscli): no reference figure")
	}
	cmd := exec.CommandContext(ctx, bin, "s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", endpoint, "s3://models/org/m", dst)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=AKID", "AWS_SECRET_ACCESS_KEY=secret", "AWS_DEFAULT_REGION=us-east-1")
	t := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("aws s3 cp: %v: %s", err, out)
	}
	el := time.Since(t)
	var n int64
	filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return float64(n) / el.Seconds(), nil
}
