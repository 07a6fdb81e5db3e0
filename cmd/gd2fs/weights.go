package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/internal/weights"
	"github.com/spf13/cobra"
)

func newModelPull(g *globals) *cobra.Command {
	var s3 s3Flags
	var pool, chunk, part string
	var conc int
	var progress, quiet bool
	cmd := &cobra.Command{
		Use:   "pull s3://BUCKET/PREFIX gd2fs://CLUSTER/DIR",
		Short: "Import a model from S3 with parallel range GETs (resumable; sha256 recorded per file)",
		Long: `Import a model from S3 with parallel range GETs (resumable; sha256 recorded per file).

Progress is committed to the master as parts are written, so a pull stopped any way (an error,
Ctrl-C, SIGKILL, a crashed machine) resumes when the same command runs again: complete files are
skipped, a partial file is re-hashed from the cluster and continues from its committed size. A kill
costs at most the parts in flight again (--concurrency GETs of --part-size, plus two, per file).`,
		Example: `  gd2fs model pull s3://models/meta-llama/Llama-3-8B gd2fs://local/models/meta-llama/Llama-3-8B
  AWS_ENDPOINT_URL=http://127.0.0.1:9000 gd2fs model pull --concurrency 16 s3://b/org/m gd2fs://local/models/org/m`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := s3.source()
			if err != nil {
				return err
			}
			cs, err := parseSize(chunk)
			if err != nil {
				return err
			}
			ps, err := parseSize(part)
			if err != nil {
				return err
			}
			return g.withRemote(args[1], func(c *client.Client, dst string) error {
				bars := newProgressBars(showProgress(progress, quiet))
				p := &weights.Puller{Client: c, Source: src, Concurrency: conc, PartSize: ps, Pool: pool, ChunkSize: cs, Progress: bars.update}
				reps, err := p.Pull(cmd.Context(), args[0], dst)
				bars.wait()
				for _, r := range reps {
					state := "pulled"
					switch {
					case r.Skipped:
						state = "already complete"
					case r.Resumed > 0:
						state = fmt.Sprintf("resumed after %s", human(r.Resumed))
					}
					fmt.Printf("%s  %s  %s  %s\n", r.SHA256, human(r.Size), r.Path, state)
				}
				if errors.Is(err, context.Canceled) {
					return fmt.Errorf("pull interrupted: run the same command again to resume (complete files are kept, a partial one continues from its committed size)")
				}
				return err
			})
		},
	}
	f := cmd.Flags()
	s3.add(f)
	f.StringVar(&pool, "pool", "ha", "pool of the imported files")
	f.StringVar(&chunk, "chunk-size", "16MiB", "chunk size of the imported files")
	f.StringVar(&part, "part-size", "8MiB", "bytes per range GET")
	f.IntVar(&conc, "concurrency", 8, "range GETs in flight per file")
	f.BoolVar(&progress, "progress", false, "progress bars even when stderr is not a terminal")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress bars")
	return cmd
}

func newModelLink(g *globals) *cobra.Command {
	var s3 s3Flags
	var pool, chunk string
	cmd := &cobra.Command{
		Use:   "link s3://BUCKET/PREFIX gd2fs://CLUSTER/DIR",
		Short: "Register a model in S3 without copying: servers fill chunks on first read, once per cluster",
		Long: `Register a model in S3 without copying: servers fill chunks on first read, once per cluster.

S3 keeps the durable copy. When the server caching a chunk dies, readers ask the master to move the
chunk to a live server, which fills it from S3 again (once); reads wait for that, up to 30 s.`,
		Example: `  gd2fs model link s3://models/org/m gd2fs://local/models/org/m
  gd2fs warmup gd2fs://local/models/org/m --cache /nvme/hf     # the first reader fills the servers`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := s3.source()
			if err != nil {
				return err
			}
			cs, err := parseSize(chunk)
			if err != nil {
				return err
			}
			return g.withRemote(args[1], func(c *client.Client, dst string) error {
				fs, err := weights.Link(cmd.Context(), c, src, args[0], dst, client.LinkOptions{Pool: pool, ChunkSize: cs})
				for _, f := range fs {
					fmt.Printf("%s  %s  <- %s\n", human(f.Size), f.Path, f.Attrs["source"])
				}
				if err == nil {
					probeS3(cmd.Context(), c, fs)
				}
				return err
			})
		},
	}
	f := cmd.Flags()
	s3.add(f)
	f.StringVar(&pool, "pool", "perf", "pool of the linked files (S3 keeps the durable copy)")
	f.StringVar(&chunk, "chunk-size", "16MiB", "chunk size")
	return cmd
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12] + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

func newWarmup(g *globals) *cobra.Command {
	var dir, quota, ref string
	var progress, quiet bool
	cmd := &cobra.Command{
		Use:   "warmup gd2fs://CLUSTER/DIR --cache DIR",
		Short: "Materialise a model into a local Hugging Face–layout cache that vLLM loads as-is",
		Long: `Materialise a model into a local Hugging Face–layout cache that vLLM loads as-is.

Blobs are published only when complete and checked against their sha256. A warmup that is killed
leaves no published file; the same command again resumes each blob from its last checkpoint
(blobs/.partial-* and a progress record, saved every 500 ms or 64 MiB).`,
		Example: `  gd2fs warmup gd2fs://local/models/meta-llama/Llama-3-8B --cache /nvme/hf
  vllm serve "$(gd2fs warmup gd2fs://local/models/meta-llama/Llama-3-8B --cache /nvme/hf -q)"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := parseSize(quota)
			if err != nil {
				return err
			}
			return g.withRemote(args[0], func(c *client.Client, p string) error {
				bars := newProgressBars(showProgress(progress, quiet))
				cache := &weights.Cache{Dir: dir, Quota: q}
				rep, err := cache.Warmup(cmd.Context(), c, p, ref, bars.update)
				bars.wait()
				if errors.Is(err, context.Canceled) {
					return fmt.Errorf("warmup interrupted: run the same command again to resume (no partial file was published)")
				}
				if err != nil {
					return err
				}
				if !quiet {
					fmt.Fprintf(os.Stderr, "%d files, %s: %s from the local cache, %s from servers (%s of it filled from S3 on the way)\n",
						rep.Files, human(rep.Bytes), human(rep.LocalBytes), human(rep.Fetched), human(rep.ColdFilled))
					if rep.Resumed > 0 {
						fmt.Fprintf(os.Stderr, "resumed %s kept by an interrupted warmup\n", human(rep.Resumed))
					}
					for _, e := range rep.Evicted {
						fmt.Fprintf(os.Stderr, "evicted %s to stay under the quota\n", e)
					}
				}
				fmt.Println(rep.Snapshot)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "cache", envOr("HF_HUB_CACHE", ""), "cache folder (env HF_HUB_CACHE)")
	f.StringVar(&quota, "quota", "0", "cache size limit; least recently used models not in use are evicted (0: none)")
	f.StringVar(&ref, "ref", "main", "ref name to point at the snapshot")
	f.BoolVar(&progress, "progress", false, "progress bars even when stderr is not a terminal")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the snapshot folder")
	cmd.MarkFlagRequired("cache")
	return cmd
}

func newCache(g *globals) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "The local hot cache: list, remove, and evict to a quota",
		Example: `  gd2fs cache ls --cache /nvme/hf
  gd2fs cache rm org/m --cache /nvme/hf
  gd2fs cache gc --quota 500GiB --cache /nvme/hf`,
	}
	cmd.PersistentFlags().StringVar(&dir, "cache", envOr("HF_HUB_CACHE", ""), "cache folder (env HF_HUB_CACHE)")
	var lsJSON bool
	ls := &cobra.Command{
		Use: "ls", Short: "List cached models, least recently used first", Args: cobra.NoArgs,
		Example: "  gd2fs cache ls --cache /nvme/hf\n  HF_HUB_CACHE=/nvme/hf gd2fs cache ls --json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return usage(fmt.Errorf("no cache folder: give --cache DIR or set HF_HUB_CACHE"))
			}
			c := &weights.Cache{Dir: dir}
			ms, err := c.List()
			if err != nil {
				return err
			}
			hit, fetched, cold := c.Stats()
			if lsJSON {
				out := cacheListJSON{Dir: dir, Models: []cachedModelJSON{}, HitBytes: hit, Fetched: fetched, ColdFilled: cold}
				for _, m := range ms {
					out.Models = append(out.Models, cachedModelJSON{Name: m.Name, Bytes: m.Bytes, LastUsed: m.LastUsed, Uses: m.Uses, InUse: m.InUse})
				}
				return printJSON(out)
			}
			if _, err := os.Stat(dir); os.IsNotExist(err) {
				fmt.Printf("cache %s (no such folder yet: gd2fs warmup --cache %s creates it)\n", dir, dir)
			} else {
				fmt.Printf("cache %s\n", dir)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MODEL\tSIZE\tLAST USED\tUSES\tIN USE")
			var total int64
			for _, m := range ms {
				total += m.Bytes
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%v\n", m.Name, human(m.Bytes), m.LastUsed.Format("2006-01-02 15:04:05"), m.Uses, m.InUse)
			}
			tw.Flush()
			ratio := 0.0
			if hit+fetched > 0 {
				ratio = float64(hit) / float64(hit+fetched)
			}
			fmt.Printf("%d models, %s; warmups served %s from this cache, %s from servers (%s of it from S3): local hit ratio %.2f\n",
				len(ms), human(total), human(hit), human(fetched), human(cold), ratio)
			return nil
		},
	}
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON: dir, models and the hit figures (snake_case fields)")
	var force bool
	rm := &cobra.Command{
		Use: "rm MODEL...", Short: "Remove cached models (refused while a process has them open, unless --force)", Args: cobra.MinimumNArgs(1),
		Example: "  gd2fs cache rm org/m --cache /nvme/hf",
		RunE: func(cmd *cobra.Command, args []string) error {
			c := &weights.Cache{Dir: dir}
			for _, a := range args {
				if err := c.Remove(a, force); err != nil {
					return err
				}
			}
			return nil
		},
	}
	rm.Flags().BoolVar(&force, "force", false, "remove even if in use")
	var quota string
	gc := &cobra.Command{
		Use: "gc --quota SIZE", Short: "Evict least recently used models not in use until the cache fits the quota", Args: cobra.NoArgs,
		Example: "  gd2fs cache gc --quota 500GiB --cache /nvme/hf",
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := parseSize(quota)
			if err != nil {
				return err
			}
			gone, err := (&weights.Cache{Dir: dir}).GC(q)
			for _, m := range gone {
				fmt.Println("evicted", m)
			}
			return err
		},
	}
	gc.Flags().StringVar(&quota, "quota", "0", "size to shrink the cache to")
	cmd.AddCommand(ls, rm, gc)
	return cmd
}

// probeS3 asks the servers, by reading one byte of the smallest linked
// file, whether they can fill linked chunks from S3 (a server fills the
// whole chunk it holds, so the probe costs one chunk from S3, which a
// first reader would fetch anyway), and says what it found.
func probeS3(ctx context.Context, c *client.Client, fs []client.FileInfo) {
	var probe *client.FileInfo
	for i := range fs {
		if fs[i].Size > 0 && (probe == nil || fs[i].Size < probe.Size) {
			probe = &fs[i]
		}
	}
	if probe == nil {
		fmt.Fprintln(os.Stderr, "linked (no bytes to check the servers' S3 access with)")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	f, err := c.Open(ctx, probe.Path)
	if err == nil {
		_, err = f.ReadAtContext(ctx, make([]byte, 1), 0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "linked, but a server could not read %s from S3: %v\n"+
			"servers fill linked files themselves: give them S3 access (gd2fs server --s3-endpoint ... or the AWS_* variables; gd2fs up --s3-endpoint ...)\n", probe.Path, err)
		return
	}
	fmt.Fprintf(os.Stderr, "linked; checked: the servers read %s from S3\n", probe.Path)
}
