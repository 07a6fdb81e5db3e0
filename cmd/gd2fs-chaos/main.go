// Command gd2fs-chaos is gd2fs's fault harness: it runs a cluster of real
// gd2fs processes in network namespaces, a mixed load, and faults on a
// printed schedule, and checks that no acknowledged HA write is lost and no
// read returns wrong bytes (package internal/chaos; docs/reliability.md).
// It is a separate binary: nothing of it is linked into gd2fs.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/internal/chaos"
	"github.com/spf13/cobra"
)

func main() {
	// Piped into head or a closed terminal, keep running to the cleanup
	// (namespaces, mounts) instead of dying of SIGPIPE on the next print.
	signal.Ignore(syscall.SIGPIPE)
	if err := newRoot().Execute(); err != nil {
		code := 1
		if e, ok := err.(exitError); ok {
			code = e.code
		} else {
			fmt.Fprintln(os.Stderr, "gd2fs-chaos:", err)
		}
		os.Exit(code)
	}
}

// exitError carries an exit status out of RunE.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func newRoot() *cobra.Command {
	var cfg chaos.Config
	var faults, netns, out, bin string
	var seed int64
	cmd := &cobra.Command{
		Use:   "gd2fs-chaos",
		Short: "Fault harness: real gd2fs processes, a mixed load, faults on a schedule, invariants checked throughout",
		Long: `gd2fs-chaos starts two masters (PostgreSQL from GD2FS_TEST_POSTGRES, a fresh schema; one
master on SQLite without it) and --servers data servers as separate processes, each in its own
network namespace on a bridge (as root with ip and nft; else on loopback, and it says so). It runs
HA and perf file writes and reads, KV puts and gets, explicit-session plans and commits and reads of
a file linked from an S3 server, and injects the --faults in turn. It prints a table of faults,
operations by outcome, bytes verified and recovery times.

Exit status: 0 clean; 1 an integrity violation (wrong bytes, or an acknowledged HA write lost or
changed) or the harness could not run; 2 availability findings with --strict (a kind of operation
not recovering within --recovery-bound after a heal, a goroutine or fd leak).

Faults: ` + strings.Join(chaos.AllFaults, ", ") + `.`,
		Example: `  sudo -E bash scripts/chaos.sh --duration 3m --out report.md
  go build -o bin/gd2fs ./cmd/gd2fs && go run ./cmd/gd2fs-chaos --bin bin/gd2fs --duration 60s --faults kill,pause,partition --seed 7
  gd2fs-chaos --bin ./gd2fs --netns off --faults kill,pause,delay,reset --servers 4`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, f := range strings.Split(faults, ",") {
				if f = strings.TrimSpace(f); f == "" {
					continue
				}
				known := false
				for _, k := range chaos.AllFaults {
					known = known || k == f
				}
				if !known {
					return fmt.Errorf("--faults: unknown fault %q (known: %s)", f, strings.Join(chaos.AllFaults, ", "))
				}
				cfg.Faults = append(cfg.Faults, f)
			}
			if len(cfg.Faults) == 0 {
				return fmt.Errorf("--faults: name at least one of %s", strings.Join(chaos.AllFaults, ", "))
			}
			if cfg.Servers < 3 {
				return fmt.Errorf("--servers %d: the HA pool needs 3", cfg.Servers)
			}
			if netns != "auto" && netns != "on" && netns != "off" {
				return fmt.Errorf("--netns %q: auto, on or off", netns)
			}
			if cfg.Duration <= 0 || cfg.Hold <= 0 {
				return fmt.Errorf("--duration and --hold must be positive")
			}
			if bin == "" {
				b, err := buildGd2fs()
				if err != nil {
					return err
				}
				defer os.RemoveAll(filepath.Dir(b))
				bin = b
			}
			abs, err := filepath.Abs(bin)
			if err != nil {
				return err
			}
			cfg.Bin, cfg.NetNS, cfg.Seed = abs, netns, uint64(seed)
			cfg.Postgres = os.Getenv("GD2FS_TEST_POSTGRES")
			cfg.Command = "gd2fs-chaos " + strings.Join(os.Args[1:], " ")
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := chaos.Run(ctx, cfg)
			if err != nil {
				return err
			}
			fmt.Println()
			fmt.Print(res.Report)
			if out != "" {
				if err := os.WriteFile(out, []byte(res.Report), 0o644); err != nil {
					return err
				}
			}
			switch {
			case res.Violations > 0:
				return exitError{1}
			case cfg.Strict && len(res.Findings) > 0:
				return exitError{2}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", 3*time.Minute, "how long the load and the fault schedule run")
	f.Int64Var(&seed, "seed", 1, "seed of the schedule's victims and of the content model")
	f.StringVar(&faults, "faults", strings.Join(chaos.AllFaults, ","), "faults to inject, in turn, repeated while the duration lasts")
	f.IntVar(&cfg.Servers, "servers", 4, "data servers (at least 3)")
	f.StringVar(&netns, "netns", "auto", "network namespaces: auto (when root with ip and nft), on (required), off (loopback)")
	f.StringVar(&out, "out", "", "also write the report (markdown) to this file")
	f.StringVar(&bin, "bin", "", "the gd2fs binary (default: go build ./cmd/gd2fs into a temporary dir)")
	f.DurationVar(&cfg.Hold, "hold", 8*time.Second, "how long each fault stays in force")
	f.DurationVar(&cfg.Gap, "gap", 3*time.Second, "least time between a heal and the next fault")
	f.DurationVar(&cfg.RecoveryBound, "recovery-bound", 30*time.Second, "every kind of operation must succeed again within this after a heal")
	f.DurationVar(&cfg.OpTimeout, "op-timeout", 30*time.Second, "deadline of each operation of the load")
	f.IntVar(&cfg.KeepFiles, "keep-files", 24, "files each writer keeps; it removes older ones, so reads race removes (0: never remove)")
	f.BoolVar(&cfg.Strict, "strict", false, "availability findings (no recovery within the bound, leaks) exit 2")
	f.StringVar(&cfg.WorkDir, "workdir", "", "directory for logs and data (default: a new temporary one, removed after a clean run)")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the work dir after a clean run")
	return cmd
}

// buildGd2fs builds the gd2fs binary from the module this runs in.
func buildGd2fs() (string, error) {
	dir, err := os.MkdirTemp("", "gd2fs-chaos-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "gd2fs")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/gd2fs/gd2fs/cmd/gd2fs").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/gd2fs: %w\n%s", err, out)
	}
	return bin, nil
}
