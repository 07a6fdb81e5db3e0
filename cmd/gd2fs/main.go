// Command gd2fs runs a gd2fs master, data server or a whole local cluster,
// and is the command-line client. Each subcommand lives in its own file.
package main

import (
	"fmt"
	"os"

	"github.com/gd2fs/gd2fs/internal/version"
)

func main() {
	root := newRoot()
	// gd2fs --version: "gd2fs 0.1.0 (commit 0123456789ab, go1.26.8)"; the
	// Python wheel's version is the first field (internal/version).
	root.Version = version.Get().String()
	root.SetVersionTemplate("gd2fs {{.Version}}\n")
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gd2fs:", err)
		os.Exit(1)
	}
}
