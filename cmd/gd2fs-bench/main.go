// Command gd2fs-bench runs gd2fs's benchmarks, each beside a reference
// measured in the same run (raw loopback TCP, Redis, fio, the AWS CLI,
// SQLite). It is a separate binary so the product, gd2fs, links neither the
// Redis client nor the in-memory S3 server the benchmarks use. Results and
// the exact commands are in docs/benchmarks.md.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gd2fs/gd2fs/internal/units"
	"github.com/spf13/cobra"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gd2fs-bench:", err)
		os.Exit(1)
	}
}

// gd2fsBin is the gd2fs binary the benchmarks that run servers as their own
// processes start (--gd2fs).
var gd2fsBin string

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "gd2fs-bench",
		Short: "Benchmarks that measure gd2fs beside a reference in the same run",
		Example: `  go build -o gd2fs ./cmd/gd2fs && go build -o gd2fs-bench ./cmd/gd2fs-bench
  ./gd2fs-bench files --size 256MiB --runs 3
  ./gd2fs-bench kv --sizes 1MiB --concurrency 4 --skip-disk`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&gd2fsBin, "gd2fs", "", "gd2fs binary for server processes (default: gd2fs beside this binary, then on PATH)")
	root.AddCommand(newBenchFiles(), newBenchKV(), newBenchKVMemory(), newBenchPlan(), newBenchSessionLoad(), newBenchWeights(), newBenchKVTrace(), newBenchTurns(), newBenchMount(), newS3(), newBenchKVJoin(), newBenchRESP(), newBenchKVPrefetch(), newBenchPlanWarm(), newBenchKVRestart())
	return root
}

// gd2fsPath finds the gd2fs binary: --gd2fs, then gd2fs beside this
// binary, then gd2fs on PATH.
func gd2fsPath() (string, error) {
	if gd2fsBin != "" {
		return gd2fsBin, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "gd2fs")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("gd2fs"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no gd2fs binary: build one with 'go build -o gd2fs ./cmd/gd2fs' beside gd2fs-bench, or pass --gd2fs")
}

func parseSize(s string) (int64, error) { return units.ParseSize(s) }

func human(n int64) string { return units.Human(n) }
