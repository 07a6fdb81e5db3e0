// Command goref is the Go client's side of the pygd2fs benchmark
// (python/bench/bench.py): the same operations through the Go client, in
// its own process, against the same cluster in the same run.
//
//	goref -master http://127.0.0.1:7070 -op read -path /bench/1g -size 1073741824
//	goref -master ... -op kv -keys bench/kv/ -n 128 -size 1048576
//	goref -master ... -op small -path /bench/1g -n 2000
//
// It prints one JSON object: seconds per repetition (and bytes moved).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/gd2fs/gd2fs/client"
)

func main() {
	master := flag.String("master", client.DefaultMaster, "master URL")
	op := flag.String("op", "read", "read (whole file), kv (BatchGetInto), small (4 KiB ReadAt loop)")
	path := flag.String("path", "/bench/1g", "file for read and small")
	keys := flag.String("keys", "bench/kv/", "key prefix for kv: keys are <prefix><i>")
	n := flag.Int("n", 128, "keys (kv) or calls (small)")
	size := flag.Int("size", 1<<30, "file size (read) or value size (kv)")
	reps := flag.Int("reps", 3, "repetitions")
	streams := flag.Int("streams", 4, "TCP streams per server")
	flag.Parse()
	if err := run(*master, *op, *path, *keys, *n, *size, *reps, *streams); err != nil {
		fmt.Fprintln(os.Stderr, "goref:", err)
		os.Exit(1)
	}
}

func run(master, op, path, prefix string, n, size, reps, streams int) error {
	c, err := client.New(client.Config{Master: master, Streams: streams})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	var secs []float64
	var moved int64
	switch op {
	case "read":
		f, err := c.Open(ctx, path)
		if err != nil {
			return err
		}
		buf := make([]byte, size)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1 // fault the pages in before timing, as Python zeroes its tensor
		}
		for range reps {
			t := time.Now()
			k, err := f.ReadAt(buf, 0)
			if err != nil {
				return err
			}
			secs = append(secs, time.Since(t).Seconds())
			moved = int64(k)
		}
	case "kv":
		ks := make([]string, n)
		dsts := make([][]byte, n)
		for i := range ks {
			ks[i] = fmt.Sprintf("%s%d", prefix, i)
			dsts[i] = make([]byte, size)
			for j := 0; j < size; j += 4096 {
				dsts[i][j] = 1
			}
		}
		kv := c.KV("perf")
		for range reps {
			t := time.Now()
			ns, err := kv.BatchGetInto(ctx, ks, dsts)
			if err != nil {
				return err
			}
			secs = append(secs, time.Since(t).Seconds())
			moved = 0
			for _, k := range ns {
				if k != size {
					return fmt.Errorf("BatchGetInto: %d bytes of %d", k, size)
				}
				moved += int64(k)
			}
		}
	case "small":
		f, err := c.Open(ctx, path)
		if err != nil {
			return err
		}
		buf := make([]byte, 4096)
		r := rand.New(rand.NewPCG(1, 2))
		blocks := f.Size() / 4096
		for range reps {
			t := time.Now()
			for range n {
				if _, err := f.ReadAt(buf, r.Int64N(blocks)*4096); err != nil {
					return err
				}
			}
			secs = append(secs, time.Since(t).Seconds())
			moved = int64(n) * 4096
		}
	default:
		return fmt.Errorf("unknown op %q", op)
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"op": op, "secs": secs, "bytes": moved})
}
