// Command gd2fs runs a gd2fs master, data server or a whole local cluster,
// and is the command-line client. Each subcommand lives in its own file.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gd2fs/gd2fs/internal/version"
)

func main() {
	root := newRoot()
	// gd2fs --version: "gd2fs 0.1.0 (commit 0123456789ab, go1.26.8)"; the
	// Python wheel's version is the first field (internal/version).
	root.Version = version.Get().String()
	root.SetVersionTemplate("gd2fs {{.Version}}\n")
	// Ctrl-C and SIGTERM cancel the command's context, so that a copy can
	// clean up and say what it left; a second signal ends the process.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	if err := root.ExecuteContext(ctx); err != nil {
		stop()
		exit(err) // exit.go: the status a script sees
	}
}
